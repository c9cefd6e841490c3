"""The Open Inference Protocol (KServe v2) over gRPC, as Triton serves it beside HTTP.

The service is Triton's `inference.GRPCInferenceService`, from the bindings tritonclient ships
(`tritonclient.grpc.service_pb2`), so that tritonclient.grpc talks to Kiln unchanged; KServe's v2
proto is a subset of it, so its clients call the same methods. Each method calls the code of its
HTTP route (service.api.v2 and service.api.repository), and an error leaves with the gRPC status
of its HTTP one; its tensors are coded in service.api.grpc_tensors. System shared memory is
served as over HTTP (service.shared_memory), log settings as `/v2/logging`
(service.log_settings), trace settings as `/v2/trace/setting` (service.traces), and
ModelStreamInfer's streams request by request (service.api.grpc_stream); CUDA shared memory is not
offered: it answers UNIMPLEMENTED.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, TypeVar

import grpc
from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool
from tritonclient.grpc import model_config_pb2 as config_pb
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from service import metrics
from service.api import protocol, repository, trace_settings, v2
from service.api.auth import Scope, authorize, presented_key
from service.api.deps import Services
from service.api.grpc_stream import in_order
from service.api.grpc_tensors import decode, decodes_inline, encode
from service.api.health import readiness
from service.api.middleware import SANE_ID, incoming_or_new
from service.api.problems import validation_detail
from service.api.triton_load import load_request
from service.errors import (
    AlreadyExistsError,
    BadRequestError,
    ConflictError,
    KilnError,
    NotFoundError,
    NotReadyError,
)
from service.log_settings import LogSettingsIn
from service.logs import request_id
from service.settings import Settings
from service.store import StoreUnavailableError
from service.traces import TraceSettingsIn

log = logging.getLogger("kiln.grpc")

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
# Errors whose gRPC status is not their HTTP status's: Triton answers ALREADY_EXISTS with a 400.
GRPC_STATUS_OF: dict[type[Exception], grpc.StatusCode] = {AlreadyExistsError: grpc.StatusCode.ALREADY_EXISTS}
SERVICE = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
# The service's methods, by the path a call names them with.
METHODS = {f"/{SERVICE.full_name}/{name}": name for name in SERVICE.methods_by_name}
# The scope each method needs, as its HTTP route does; the health and server metadata are open.
# LogSettings and TraceSetting need infer here, and check admin themselves for a change, as their
# POST routes need.
SCOPES = {
    "ServerLive": None,
    "ServerReady": None,
    "ServerMetadata": None,
    "RepositoryModelLoad": Scope.admin,
    "RepositoryModelUnload": Scope.admin,
    "SystemSharedMemoryRegister": Scope.admin,
    "SystemSharedMemoryUnregister": Scope.admin,
}
# Triton's methods Kiln does not offer.
UNOFFERED = [
    "CudaSharedMemoryStatus",
    "CudaSharedMemoryRegister",
    "CudaSharedMemoryUnregister",
]
# A log setting's type -> the SettingValue field that carries it.
SETTING_FIELD = {bool: "bool_param", int: "uint32_param", str: "string_param"}
Changes = TypeVar("Changes", bound=BaseModel)  # the log or trace settings a request changes
# gRPC takes a signed 32-bit message size.
MAX_MESSAGE_BYTES = 2**31 - 1
# A status's message goes in the grpc-message trailer, percent-encoded: clients refuse trailers
# past 8 KiB (some past 16), and report RESOURCE_EXHAUSTED in place of the status.
MAX_STATUS_MESSAGE_BYTES = 4096


def version_of(text: str) -> int | None:
    """The protocol's version string: empty means the one serving."""
    return protocol.version_number(text) if text else None


def parsed(doc: Mapping[str, Any], message: Message) -> Any:
    """An HTTP route's JSON document as the protobuf message of its gRPC method."""
    return json_format.ParseDict(doc, message, ignore_unknown_fields=True)


def failure(method: str, exc: Exception) -> tuple[grpc.StatusCode, str]:
    """The gRPC status of the error's HTTP status, and its message; counted as HTTP's are."""
    status, message = protocol.error_of(exc, f"gRPC {method}")
    code = GRPC_STATUS_OF.get(type(exc)) or GRPC_STATUS.get(status, grpc.StatusCode.INTERNAL)
    metrics.GRPC_ERRORS.labels(code.name, method).inc()
    return code, _bounded(message)


def _bounded(message: str) -> str:
    """The message, cut short where its percent-encoding passes MAX_STATUS_MESSAGE_BYTES (a
    request's 12,000-character model name, echoed back, got RESOURCE_EXHAUSTED)."""
    size = 0
    for i, char in enumerate(message):
        size += 1 if " " <= char <= "~" and char != "%" else 3 * len(char.encode())
        if size > MAX_STATUS_MESSAGE_BYTES:
            return f"{message[:i]}... (cut short)"
    return message


async def abort(context: grpc.aio.ServicerContext, method: str, exc: Exception) -> None:
    """End the call with the error's status."""
    await context.abort(*failure(method, exc))


def set_request_id(context: grpc.aio.ServicerContext) -> None:
    """The call's log lines carry its `x-request-id` metadata, as over HTTP, or a new id."""
    metadata = dict(context.invocation_metadata() or ())
    request_id.set(incoming_or_new(metadata.get("x-request-id")))


Method = Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[Message]]


def answered(method: Method) -> Method:
    """The method with a request id on its log lines (from `x-request-id` metadata, as over
    HTTP) and every error it raises answered with its status."""

    @functools.wraps(method)
    async def call(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Message:
        set_request_id(context)
        try:
            return await method(self, request, context)
        except Exception as exc:
            await abort(context, method.__name__, exc)
            raise  # not reached: abort raises
        except asyncio.CancelledError:  # the client cancelled, or its deadline passed: HTTP's 499
            metrics.GRPC_ERRORS.labels(grpc.StatusCode.CANCELLED.name, method.__name__).inc()
            raise

    return call


class KeyCheck(grpc.aio.ServerInterceptor):
    """The API key, checked before the request message is parsed, as HTTP checks it before
    reading the body. A unary call's message is then parsed inside the call (`parsed_inside`)."""

    def __init__(self, api_keys: Mapping[str, Scope]) -> None:
        self.api_keys = api_keys

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        # The label of its error counts: "unknown" for any other path, which a caller with no key
        # picks freely.
        method = METHODS.get(details.method, "unknown")
        scope = SCOPES.get(method, Scope.infer)
        if scope is not None and method not in UNOFFERED:
            try:
                authorize(self.api_keys, presented_key(dict(details.invocation_metadata or ())), scope)
            except KilnError as exc:
                refusal = exc

                async def refuse(request: Any, context: grpc.aio.ServicerContext) -> None:
                    await abort(context, method, refusal)

                if method == "ModelStreamInfer":  # the handler's kind must match the method's
                    return grpc.stream_stream_rpc_method_handler(refuse)
                return grpc.unary_unary_rpc_method_handler(refuse)
        return parsed_inside(await continuation(details), method)


def parsed_inside(handler: grpc.RpcMethodHandler | None, method: str) -> grpc.RpcMethodHandler | None:
    """A unary method's handler that parses its request message itself: gRPC's own parse
    answers a malformed one UNKNOWN, and logs it as the server's error. A stream's messages
    are parsed as its handler reads them, and it answers those (`ModelStreamInfer`)."""
    if handler is None:  # no such method: gRPC answers UNIMPLEMENTED
        return None
    behavior, parse = handler.unary_unary, handler.request_deserializer
    if behavior is None or parse is None:
        return handler

    async def call(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
        try:
            request = parse(raw)
        except DecodeError as exc:
            await abort(context, method, BadRequestError(f"the request message is malformed: {exc}"))
        return await behavior(request, context)

    return grpc.unary_unary_rpc_method_handler(call, response_serializer=handler.response_serializer)


class InferenceService(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, svc: Services, version: str, api_keys: Mapping[str, Scope]) -> None:
        self.svc = svc
        self.version = version
        self.api_keys = api_keys

    async def ServerLive(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            await readiness(self.svc)
        except (StoreUnavailableError, NotReadyError):
            return pb.ServerReadyResponse(ready=False)
        return pb.ServerReadyResponse(ready=True)

    async def ServerMetadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return pb.ServerMetadataResponse(
            name="kiln", version=self.version, extensions=v2.extensions(self.svc.settings)
        )

    @answered
    async def ModelReady(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """A boolean, as Triton's: where HTTP answers "not ready" with 400, 404 or 409."""
        version = version_of(request.version)
        try:
            await run_in_threadpool(v2.check_model_ready, self.svc, request.name, version)
        except (BadRequestError, NotFoundError, ConflictError, StoreUnavailableError) as exc:
            log.debug("model %s is not ready: %s", request.name, exc)
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=True)

    @answered
    async def ModelMetadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        version = version_of(request.version)
        doc = await run_in_threadpool(v2.metadata_doc, self.svc, request.name, version)
        return parsed(doc, pb.ModelMetadataResponse())

    @answered
    async def ModelConfig(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        version = version_of(request.version)
        doc = await run_in_threadpool(v2.config_doc, self.svc, request.name, version)
        return pb.ModelConfigResponse(config=parsed(doc, config_pb.ModelConfig()))

    @answered
    async def ModelStatistics(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        if not request.name:
            doc = await run_in_threadpool(repository.all_stats, self.svc)  # reads the store
        elif not request.version:
            doc = await run_in_threadpool(repository.model_stats, request.name, self.svc)
        else:
            doc = await run_in_threadpool(
                repository.model_version_stats, request.name, request.version, self.svc
            )
        return parsed(doc, pb.ModelStatisticsResponse())

    @answered
    async def RepositoryIndex(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        index = await run_in_threadpool(repository.index, self.svc, request.ready)
        return parsed({"models": index}, pb.RepositoryIndexResponse())

    @answered
    async def RepositoryModelLoad(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        given = {
            key: getattr(p, p.WhichOneof("parameter_choice") or "string_param")
            for key, p in request.parameters.items()
        }
        files = {key: value for key, value in given.items() if key.startswith("file:")}
        strings = sorted(key for key, value in files.items() if not isinstance(value, bytes))
        if strings:
            raise BadRequestError(f"{strings}: a file's content is a bytes_param")
        load = load_request({k: v for k, v in given.items() if k not in files}, files)
        await repository.triton_load(self.svc, request.model_name, load)
        return pb.RepositoryModelLoadResponse()

    @answered
    async def RepositoryModelUnload(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await run_in_threadpool(repository.unload_model, request.model_name, self.svc)
        return pb.RepositoryModelUnloadResponse()

    @answered
    async def ModelInfer(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self._infer(request)

    async def ModelStreamInfer(self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> None:
        """Written with `context.write`, not yielded: a write to a client that hung up then fails
        here, where it is the client's doing, rather than in gRPC's own loop, which logs it as an
        error; and the answers still outstanding are cancelled at once."""
        set_request_id(context)
        try:
            async with contextlib.aclosing(in_order(requests, self._stream_answer)) as answers:
                async for response in answers:
                    try:
                        await context.write(response)
                    except Exception as exc:  # gRPC's ExecuteBatchError, among others
                        log.debug("a stream's client left before its answers: %r", exc)
                        return
        except DecodeError as exc:  # a message of the stream is not a ModelInferRequest
            await abort(
                context, "ModelStreamInfer", BadRequestError(f"a request message is malformed: {exc}")
            )
        except Exception as exc:
            await abort(context, "ModelStreamInfer", exc)

    async def _stream_answer(self, request: Any) -> Any:
        """A request's answer, or its error, as Triton sends either: marked final (a model that
        is not decoupled sends one), and an error with the request's id, so that the client
        knows which failed. Runs in a task of its own: its log lines carry the request's id."""
        if SANE_ID.fullmatch(request.id):  # as HTTP's: a newline in it would forge log lines
            request_id.set(f"{request_id.get()}/{request.id}")
        try:
            response = await self._infer(request)
        except Exception as exc:
            _, message = failure("ModelStreamInfer", exc)
            failed = pb.ModelInferResponse(
                id=request.id, model_name=request.model_name, model_version=request.model_version
            )
            return pb.ModelStreamInferResponse(error_message=message, infer_response=failed)
        response.parameters["triton_final_response"].bool_param = True
        return pb.ModelStreamInferResponse(infer_response=response)

    async def _infer(self, request: Any) -> Any:
        name, version = request.model_name, version_of(request.model_version)
        shared, limit = self.svc.shared_memory, self.svc.settings.max_json_bytes
        if decodes_inline(request):
            infer = decode(request, shared, limit)
        else:
            infer = await run_in_threadpool(decode, request, shared, limit)
        result, outputs = await v2.run_infer(self.svc, name, version, infer)
        if v2.encodes_inline(outputs) and not infer.shared_outputs:
            return encode(name, result.version, request.id, infer, outputs, shared)
        return await run_in_threadpool(encode, name, result.version, request.id, infer, outputs, shared)

    @answered
    async def SystemSharedMemoryStatus(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        regions = await run_in_threadpool(self.svc.shared_memory.status, request.name or None)
        return parsed(
            {"regions": {r.name: r.model_dump() for r in regions}}, pb.SystemSharedMemoryStatusResponse()
        )

    @answered
    async def SystemSharedMemoryRegister(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        register = self.svc.shared_memory.register
        await run_in_threadpool(register, request.name, request.key, request.offset, request.byte_size)
        return pb.SystemSharedMemoryRegisterResponse()

    @answered
    async def SystemSharedMemoryUnregister(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await run_in_threadpool(self.svc.shared_memory.unregister, request.name or None)
        return pb.SystemSharedMemoryUnregisterResponse()

    @answered
    async def LogSettings(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """Reads the settings, or changes those it names (tritonclient's `update_log_settings`)."""
        fields = {
            key: getattr(value, which)
            for key, value in request.settings.items()
            if (which := value.WhichOneof("parameter_choice")) is not None
        }
        if fields:
            changes = self._changes(context, LogSettingsIn, fields)
            current = await run_in_threadpool(self.svc.logs.update, changes)
        else:
            current = self.svc.logs.current
        response = pb.LogSettingsResponse()
        for key, value in current.model_dump().items():
            setattr(response.settings[key], SETTING_FIELD[type(value)], value)
        return response

    @answered
    async def TraceSetting(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """Reads a model's settings or the server's, or changes those it names (an empty value
        clears one), as tritonclient's `update_trace_settings` sends them."""
        model = request.model_name or None
        if model is not None:
            await run_in_threadpool(self.svc.registry.check_model, model)
        fields = {
            key: None if not value.value else list(value.value) if key == "trace_level" else value.value[0]
            for key, value in request.settings.items()
        }
        if fields:
            current = await trace_settings.updated(
                self.svc, model, self._changes(context, TraceSettingsIn, fields)
            )
        else:
            current = self.svc.runtime.traces.settings(model)
        response = pb.TraceSettingResponse()
        for key, setting in current.model_dump().items():
            response.settings[key].value.extend(setting if isinstance(setting, list) else [setting])
        return response

    def _changes(
        self, context: grpc.aio.ServicerContext, model: type[Changes], fields: dict[str, Any]
    ) -> Changes:
        """Settings to change, as their POST route takes them: with the admin scope, checked."""
        authorize(self.api_keys, presented_key(dict(context.invocation_metadata() or ())), Scope.admin)
        try:
            return model.model_validate(fields)
        except ValidationError as exc:
            raise BadRequestError(validation_detail(exc)) from exc


def _unoffered(name: str) -> Callable[..., Awaitable[None]]:
    async def unoffered(self: Any, request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"Kiln does not offer {name}")

    return unoffered


for _name in UNOFFERED:  # in place of the generated servicer's "Method not implemented!"
    setattr(InferenceService, _name, _unoffered(_name))


def grpc_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"  # an IPv6 host is bracketed


async def start_grpc(
    svc: Services, settings: Settings, api_keys: Mapping[str, Scope], version: str, max_bytes: int
) -> grpc.aio.Server | None:
    """The gRPC server, listening on the running event loop beside uvicorn; None when off.
    Requests may be as large as HTTP bodies (`max_bytes`), and responses as large as they come."""
    if not settings.grpc_port:
        return None
    server = grpc.aio.server(
        interceptors=[KeyCheck(api_keys)],
        options=[
            ("grpc.max_receive_message_length", min(max_bytes, MAX_MESSAGE_BYTES)),
            ("grpc.max_send_message_length", -1),
            # Off unless `kiln serve --workers N` started this process: then its siblings share
            # the port, but another server must not silently take half of this one's clients.
            ("grpc.so_reuseport", int(settings.grpc_reuse_port)),
        ],
    )
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceService(svc, version, api_keys), server)
    address = grpc_address(settings.grpc_host, settings.grpc_port)
    try:
        server.add_insecure_port(address)
    except RuntimeError as exc:
        reason = f"cannot listen for gRPC on {address} ({exc}): set KILN_GRPC_PORT; 0 turns gRPC off"
        raise RuntimeError(reason) from exc
    await server.start()
    log.info("gRPC (Open Inference Protocol) on %s", address)
    return server
