"""The Open Inference Protocol (KServe v2) over gRPC, as Triton serves it beside HTTP.

The service is Triton's `inference.GRPCInferenceService`, from the bindings tritonclient ships
(`tritonclient.grpc.service_pb2`), so that tritonclient.grpc, perf_analyzer and KServe's gRPC
clients talk to Kiln unchanged. Each method calls the code of its HTTP route (service.api.v2 and
service.api.repository), and an error leaves with the gRPC status of its HTTP one. Shared memory,
tracing, logging settings and streaming are not offered: they answer UNIMPLEMENTED.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import grpc
import numpy as np
from google.protobuf import json_format
from google.protobuf.message import Message
from starlette.concurrency import run_in_threadpool
from tritonclient.grpc import model_config_pb2 as config_pb
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from service.api import repository, v2
from service.api.auth import Scope, authorize, presented_key
from service.api.deps import Services
from service.api.health import readiness
from service.errors import BadRequestError, ConflictError, NotFoundError
from service.settings import Settings
from service.store import StoreUnavailableError
from service.tensors import DATATYPES, InferRequest, decode_tensors, encode_tensor

log = logging.getLogger("kiln.grpc")

MB = 1024 * 1024
M = TypeVar("M", bound=Message)

# HTTP status -> gRPC status, as Triton maps its errors.
GRPC_STATUS = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    409: grpc.StatusCode.FAILED_PRECONDITION,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    422: grpc.StatusCode.INVALID_ARGUMENT,
    503: grpc.StatusCode.UNAVAILABLE,
}
# Datatype -> the InferTensorContents field that carries it; FP16 has none: it travels raw.
CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    **dict.fromkeys(("INT8", "INT16", "INT32"), "int_contents"),
    "INT64": "int64_contents",
    **dict.fromkeys(("UINT8", "UINT16", "UINT32"), "uint_contents"),
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
}


def version_of(text: str) -> int | None:
    """The protocol's version string: empty means the one serving."""
    return v2.version_number(text) if text else None


def parsed(doc: Mapping[str, Any], message: M) -> M:
    """An HTTP route's JSON document as the protobuf message of its gRPC method."""
    return json_format.ParseDict(doc, message, ignore_unknown_fields=True)


def decode(request: pb.ModelInferRequest) -> InferRequest:
    """The request's tensors through the HTTP codec's checks: raw contents become binary
    tensors, typed contents JSON `data`."""
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise BadRequestError(
            f"raw_input_contents has {len(raw)} entries for {len(request.inputs)} inputs; "
            "send raw contents for every input or for none"
        )
    docs: list[dict[str, Any]] = []
    for i, tensor in enumerate(request.inputs):
        doc: dict[str, Any] = {"name": tensor.name, "shape": list(tensor.shape), "datatype": tensor.datatype}
        if raw:
            doc["parameters"] = {"binary_data_size": len(raw[i])}
        elif tensor.datatype in CONTENTS_FIELD:
            doc["data"] = list(getattr(tensor.contents, CONTENTS_FIELD[tensor.datatype]))
        elif tensor.datatype in DATATYPES:
            raise BadRequestError(f"tensor {tensor.name!r}: send {tensor.datatype} in raw_input_contents")
        docs.append(doc)
    wanted = [o.name for o in request.outputs]
    return InferRequest(
        id=request.id or None,
        inputs=decode_tensors(docs, b"".join(raw)),
        outputs=dict.fromkeys(wanted, True) if wanted else None,
        binary_output=True,
    )


def encode(name: str, version: int, request_id: str, outputs: list[tuple[str, np.ndarray, bool]]) -> Any:
    response = pb.ModelInferResponse(model_name=name, model_version=str(version), id=request_id)
    for output, array, _ in outputs:
        doc, raw = encode_tensor(output, array, binary=True)
        response.outputs.add(name=output, datatype=doc["datatype"], shape=doc["shape"])
        response.raw_output_contents.append(raw)
    return response


class InferenceService(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, svc: Services, api_keys: Mapping[str, Scope], version: str) -> None:
        self.svc = svc
        self.api_keys = api_keys
        self.version = version

    async def _call(
        self, context: grpc.aio.ServicerContext, scope: Scope | None, work: Callable[[], Awaitable[M]]
    ) -> M:
        """Run `work` after the scope's key check; an error aborts with its gRPC status."""
        try:
            if scope is not None:
                authorize(self.api_keys, presented_key(dict(context.invocation_metadata() or ())), scope)
            return await work()
        except Exception as exc:
            found = v2.error_of(exc)
            if found is None:
                log.exception("unhandled error in a gRPC call")
                found = 500, f"{type(exc).__name__}; see the server log"
            status, message = found
            await context.abort(GRPC_STATUS.get(status, grpc.StatusCode.INTERNAL), message)
            raise  # abort raises; this keeps the type checker sure nothing returns

    async def ServerLive(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            await readiness(self.svc)
        except StoreUnavailableError:
            return pb.ServerReadyResponse(ready=False)
        return pb.ServerReadyResponse(ready=True)

    async def ServerMetadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return pb.ServerMetadataResponse(name="kiln", version=self.version, extensions=v2.EXTENSIONS)

    async def ModelReady(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def work() -> Any:
            version = version_of(request.version)
            try:
                await run_in_threadpool(v2.check_model_ready, self.svc, request.name, version)
            except (BadRequestError, NotFoundError, ConflictError, StoreUnavailableError) as exc:
                log.debug("model %s is not ready: %s", request.name, exc)
                return pb.ModelReadyResponse(ready=False)
            return pb.ModelReadyResponse(ready=True)

        return await self._call(context, Scope.infer, work)

    async def ModelMetadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def work() -> Any:
            doc = await run_in_threadpool(
                v2.metadata_doc, self.svc, request.name, version_of(request.version)
            )
            return parsed(doc, pb.ModelMetadataResponse())

        return await self._call(context, Scope.infer, work)

    async def ModelConfig(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def work() -> Any:
            version = version_of(request.version)
            doc = await run_in_threadpool(v2.config_doc, self.svc, request.name, version)
            return pb.ModelConfigResponse(config=parsed(doc, config_pb.ModelConfig()))

        return await self._call(context, Scope.infer, work)

    async def ModelStatistics(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def work() -> Any:
            if not request.name:
                doc = repository.all_stats(self.svc)
            elif not request.version:
                doc = await run_in_threadpool(repository.model_stats, request.name, self.svc)
            else:
                doc = await run_in_threadpool(
                    repository.model_version_stats, request.name, request.version, self.svc
                )
            return parsed(doc, pb.ModelStatisticsResponse())

        return await self._call(context, Scope.infer, work)

    async def RepositoryIndex(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def work() -> Any:
            body = repository.IndexRequest(ready=request.ready)
            index = await run_in_threadpool(repository.repository_index, self.svc, body)
            return parsed({"models": index}, pb.RepositoryIndexResponse())

        return await self._call(context, Scope.infer, work)

    async def RepositoryModelLoad(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def work() -> Any:
            await repository.load_model(request.model_name, self.svc)
            return pb.RepositoryModelLoadResponse()

        return await self._call(context, Scope.admin, work)

    async def RepositoryModelUnload(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def work() -> Any:
            await run_in_threadpool(repository.unload_model, request.model_name, self.svc)
            return pb.RepositoryModelUnloadResponse()

        return await self._call(context, Scope.admin, work)

    async def ModelInfer(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def work() -> Any:
            name = request.model_name
            result, outputs = await v2.run_infer(
                self.svc, name, version_of(request.model_version), decode(request)
            )
            return encode(name, result.version, request.id, outputs)

        return await self._call(context, Scope.infer, work)


async def start_grpc(
    svc: Services, settings: Settings, api_keys: Mapping[str, Scope], version: str
) -> grpc.aio.Server | None:
    """The gRPC server, listening on the running event loop beside uvicorn; None when off."""
    if not settings.grpc_port:
        return None
    limit = settings.max_upload_mb * MB  # as the HTTP body limit: a batch of images is megabytes
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", limit),
            # Off unless `kiln serve --workers N` started this process: then its siblings share
            # the port, but another server must not silently take half of this one's clients.
            ("grpc.so_reuseport", int(settings.grpc_reuse_port)),
        ]
    )
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceService(svc, api_keys, version), server)
    address = f"{settings.grpc_host}:{settings.grpc_port}"
    try:
        server.add_insecure_port(address)
    except RuntimeError as exc:
        raise RuntimeError(
            f"cannot listen for gRPC on {address} ({exc}): set KILN_GRPC_PORT, 0 turns it off"
        ) from exc
    await server.start()
    log.info("gRPC (Open Inference Protocol) on %s", address)
    return server
