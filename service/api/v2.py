"""The Open Inference Protocol (KServe v2, as Triton speaks it) over HTTP.

Errors on these routes are `{"error": "..."}`, the protocol's shape that its clients parse,
instead of /v1's problem+json: `ProtocolRoute` converts them, in one place.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any, NoReturn

import numpy as np
from fastapi import APIRouter, Request, Response
from starlette.concurrency import run_in_threadpool

from compiler.spec import DTYPES, InputSpec
from service.api.auth import infer_scope
from service.api.bodies import INLINE_JSON_BYTES, INLINE_JSON_ELEMENTS, answer, inference_body
from service.api.deps import Services, ServicesDep, services
from service.api.health import readiness
from service.api.protocol import (
    INFER_BODY,
    INFER_OK,
    InferRoute,
    ModelReadyResponse,
    ProtocolRoute,
    ServerLiveResponse,
    ServerReadyResponse,
    check_infer,
    version_number,
)
from service.api.schemas import ProtocolError, error_responses
from service.batcher import BatchPolicy, Gone
from service.classification import check_classified, classified, classify_cost
from service.errors import BadRequestError, NotFoundError, NotReadyError, PayloadTooLargeError
from service.headers import byte_count
from service.records import VersionRecord
from service.registry import ModelView
from service.router import servable, serving_version
from service.runtime import Prediction, batch_policy
from service.settings import Settings
from service.store import StoreUnavailableError
from service.tensors import InferRequest, Output, datatype_of, decode_request, encode_response

log = logging.getLogger("kiln.api")

PLATFORM = "pytorch_libtorch"  # Triton's platform name for TorchScript models
HEADER_LENGTH = "Inference-Header-Content-Length"
# Triton's names for the protocol extensions Kiln implements.
EXTENSIONS = [
    "binary_tensor_data",
    "classification",
    "logging",
    "model_configuration",
    "model_repository",
    "statistics",
    "trace",
]


router = APIRouter(tags=["v2"], route_class=ProtocolRoute)
MODEL_ERRORS = error_responses(ProtocolError, 400, 401, 403, 404)
READY_ERRORS = error_responses(ProtocolError, 400, 401, 403, 404, 409)  # 409: unloaded


@router.get("/v2", operation_id="v2_server_metadata", summary="Server name, version and extensions.")
async def server_metadata(request: Request) -> dict[str, Any]:
    settings = request.app.state.services.settings
    return {"name": "kiln", "version": request.app.version, "extensions": extensions(settings)}


def extensions(settings: Settings) -> list[str]:
    return [*EXTENSIONS, "system_shared_memory"] if settings.shared_memory else EXTENSIONS


@router.get("/v2/health/live", operation_id="v2_live", summary="Live while the process is up.")
async def live() -> ServerLiveResponse:  # on the event loop: see health.healthz
    return ServerLiveResponse(live=True)


@router.get(
    "/v2/health/ready",
    operation_id="v2_ready",
    summary="Ready when the store answers, or loaded models serve without it; else a 400, as Triton answers.",
    responses=error_responses(ProtocolError, 400),
)
async def ready(svc: ServicesDep) -> ServerReadyResponse:
    try:
        await readiness(svc)
    except (StoreUnavailableError, NotReadyError) as exc:
        # The protocol answers "not ready" with a 4xx, and Triton uses 400.
        raise BadRequestError(f"not ready: {exc}") from exc
    return ServerReadyResponse(ready=True)


def described(svc: Services, name: str, version: int | None) -> tuple[ModelView, VersionRecord]:
    """The version a metadata or config request describes: the one asked for, else the one
    serving here, else the default, else the newest."""
    view = svc.registry.get_model(name)
    if version is not None:
        record = next((v for v, _ in view.versions if v.version == version), None)
        if record is None:
            raise NotFoundError(f"model {name!r} has no version {version}")
        return view, record
    try:
        record, _ = serving_version(view, svc.runtime.targets)
    except NotFoundError:  # nothing serves here yet: describe the default, else the newest
        record = next(
            (v for v, _ in view.versions if v.version == view.default_version), view.versions[-1][0]
        )
    return view, record


def _tensors(
    record: VersionRecord,
) -> tuple[list[tuple[str, str, list[int]]], list[tuple[str, str, list[int]]]]:
    inputs = [(t.name, datatype_of(DTYPES[t.dtype], t.name), t.shape) for t in record.config.inputs]
    outputs = [(o.name, datatype_of(np.dtype(o.dtype), o.name), o.shape) for o in record.outputs]
    return inputs, outputs


def metadata_doc(svc: Services, name: str, version: int | None) -> dict[str, Any]:
    view, record = described(svc, name, version)
    inputs, outputs = _tensors(record)
    return {
        "name": name,
        "versions": [str(v.version) for v, _ in view.versions],
        "platform": PLATFORM,
        "inputs": [{"name": n, "datatype": d, "shape": shape} for n, d, shape in inputs],
        "outputs": [{"name": n, "datatype": d, "shape": shape} for n, d, shape in outputs],
    }


# How many rows Kiln takes of a model shown with max_batch_size 0 and dims [-1, ...], whose
# first dimension Triton would leave unbounded, in the configuration's parameters.
ROWS_PARAMETER = "max_batch_size"


def batches(policy: BatchPolicy) -> bool:
    """Whether Triton's clients see the model as batching: its config's max_batch_size is not 0,
    and the first dimension of each tensor is the batch."""
    return policy.max_batch_size > 1


def config_doc(svc: Services, name: str, version: int | None) -> dict[str, Any]:
    """The version's configuration in the shape of Triton's model configuration (what
    tritonclient's get_model_config returns): a batching model's dims leave out the batch."""
    _, record = described(svc, name, version)
    policy = batch_policy(record, svc.runtime.settings)
    batching = batches(policy)
    inputs, outputs = _tensors(record)

    def tensor(n: str, datatype: str, shape: list[int]) -> dict[str, Any]:
        return {"name": n, "data_type": f"TYPE_{datatype}", "dims": shape[1:] if batching else shape}

    config: dict[str, Any] = {
        "name": name,
        "platform": PLATFORM,
        "max_batch_size": policy.max_batch_size if batching else 0,
        "input": [tensor(*t) for t in inputs],
        "output": [tensor(*t) for t in outputs],
    }
    for output in config["output"]:  # the labels, as a file beside the versions would hold them
        if output["name"] in record.config.labels:
            output["label_filename"] = f"{output['name']}_labels.txt"
    queue_policy: dict[str, Any] = {"max_queue_size": policy.max_queue_size}
    if record.config.default_timeout_us is not None:
        queue_policy["default_timeout_microseconds"] = record.config.default_timeout_us
        queue_policy["allow_timeout_override"] = True
    if record.config.response_cache:
        config["response_cache"] = {"enable": True}
    # How many of its batches run at once here; a model that cannot batch, how many requests.
    lanes = svc.runtime.settings.inference_workers
    config["instance_group"] = [{"name": name, "count": min(policy.instances, lanes) if batching else lanes}]
    if not batching and record.spec().batched:  # dims [-1, ...]: how many rows it takes
        rows = str(record.config.max_batch_size or 1)
        config.setdefault("parameters", {})[ROWS_PARAMETER] = {"string_value": rows}
    if batching:
        config["dynamic_batching"] = {
            "preferred_batch_size": list(policy.preferred_batch_sizes),
            "max_queue_delay_microseconds": policy.max_queue_delay_us,
            "default_queue_policy": queue_policy,
        }
        if policy.priority_levels:
            config["dynamic_batching"]["priority_levels"] = policy.priority_levels
            config["dynamic_batching"]["default_priority_level"] = policy.default_priority_level
        # Kiln's own batching setting, which Triton's dynamic_batching has no field for: in the
        # config's free-form parameters, which tritonclient parses over HTTP and gRPC alike.
        adaptive = "true" if policy.adaptive_queue_delay else "false"
        config.setdefault("parameters", {})["adaptive_queue_delay"] = {"string_value": adaptive}
    return config


@router.get(
    "/v2/models/{name}",
    operation_id="v2_model_metadata",
    summary="The model's inputs and outputs: the version's serving here, else its default's or newest's.",
    dependencies=infer_scope,
    responses=MODEL_ERRORS,
)
def model_metadata(name: str, svc: ServicesDep) -> dict[str, Any]:
    return metadata_doc(svc, name, None)


@router.get(
    "/v2/models/{name}/versions/{version}",
    operation_id="v2_model_version_metadata",
    summary="One version's inputs and outputs.",
    dependencies=infer_scope,
    responses=MODEL_ERRORS,
)
def model_version_metadata(name: str, version: str, svc: ServicesDep) -> dict[str, Any]:
    return metadata_doc(svc, name, version_number(version))


@router.get(
    "/v2/models/{name}/config",
    operation_id="v2_model_config",
    summary="The model's configuration, as Triton's model configuration extension has it.",
    dependencies=infer_scope,
    responses=MODEL_ERRORS,
)
def model_config(name: str, svc: ServicesDep) -> dict[str, Any]:
    return config_doc(svc, name, None)


@router.get(
    "/v2/models/{name}/versions/{version}/config",
    operation_id="v2_model_version_config",
    summary="One version's configuration, as Triton's model configuration extension has it.",
    dependencies=infer_scope,
    responses=MODEL_ERRORS,
)
def model_version_config(name: str, version: str, svc: ServicesDep) -> dict[str, Any]:
    return config_doc(svc, name, version_number(version))


def check_model_ready(svc: Services, name: str, version: int | None) -> None:
    route = svc.runtime.route(name, version)
    if not servable(route.variants, svc.runtime.targets):
        number = route.version.version
        raise BadRequestError(f"model {name!r} version {number} has no variant ready on this host")


@router.get(
    "/v2/models/{name}/ready",
    operation_id="v2_model_ready",
    summary="Whether the model serves requests naming no version here; else a 400 (409: unloaded).",
    dependencies=infer_scope,
    responses=READY_ERRORS,
)
def model_ready(name: str, svc: ServicesDep) -> ModelReadyResponse:
    check_model_ready(svc, name, None)
    return ModelReadyResponse(name=name, ready=True)


@router.get(
    "/v2/models/{name}/versions/{version}/ready",
    operation_id="v2_model_version_ready",
    summary="Whether one version of the model serves here; else a 400 (409: unloaded).",
    dependencies=infer_scope,
    responses=READY_ERRORS,
)
def model_version_ready(name: str, version: str, svc: ServicesDep) -> ModelReadyResponse:
    check_model_ready(svc, name, version_number(version))
    return ModelReadyResponse(name=name, ready=True)


def check_datatypes(spec: InputSpec, inputs: dict[str, np.ndarray]) -> None:
    """The protocol sends exact datatypes: FP64 for an FP32 input is an error, not a cast."""
    for t in spec.inputs:
        array = inputs.get(t.name)
        want = DTYPES[t.dtype]
        if array is not None and array.dtype != want:
            raise BadRequestError(
                f"input {t.name!r}: expected datatype {datatype_of(want, t.name)}, "
                f"received {datatype_of(array.dtype, t.name)}"
            )


# Bodies this small are decoded and encoded on the event loop: for them a trip to the threadpool
# costs more than the work (an MLP's binary input decodes in about 20 us). Larger ones, and JSON
# `data` past bodies.INLINE_JSON_*, stay in the threadpool so that one big request cannot stall
# every other.
INLINE_BINARY_BYTES = 256 * 1024
INLINE_CLASSIFY_COST = 2048  # service.classification.classify_cost: the top 5 of 1,000 classes, 50 us


def decodes_inline(body: bytes, header_length: str | None) -> bool:
    length = len(body) if header_length is None else byte_count(header_length)
    if length is None:
        return True  # decode_request rejects it at once
    json_bytes = min(length, len(body))
    return json_bytes <= INLINE_JSON_BYTES and len(body) - json_bytes <= INLINE_BINARY_BYTES


def names_shared_memory(body: bytes, header_length: str | None) -> bool:
    """Whether the JSON header may name a shared-memory region: a scan, not a parse, so it also
    says yes to any \\u escape, which could spell the key."""
    end = len(body) if header_length is None else byte_count(header_length)
    if end is None:  # decode_request rejects it
        end = len(body)
    return body.find(b"shared_memory_", 0, end) != -1 or body.find(b"\\u", 0, end) != -1


def encodes_inline(outputs: list[Output]) -> bool:
    # BYTES (an object array, which nbytes counts 8 bytes an element) count as JSON elements.
    binary = sum(array.nbytes for _, array, is_binary in outputs if is_binary and array.dtype != object)
    elements = sum(array.size for _, array, is_binary in outputs if not is_binary or array.dtype == object)
    return binary <= INLINE_BINARY_BYTES and elements <= INLINE_JSON_ELEMENTS


async def run_infer(
    svc: Services, name: str, version: int | None, infer: InferRequest, gone: Gone | None = None
) -> tuple[Prediction, list[Output]]:
    """A decoded request, checked against its model and run; in either protocol. Over gRPC a
    client that hangs up cancels its call, and so its request; over HTTP it is asked (`gone`)."""
    route = await svc.runtime.aroute(name, version)  # in the threadpool only when it asks the store
    check_datatypes(route.spec, infer.inputs)
    infer.check_outputs(o.name for o in route.version.outputs)
    check_classified(infer.classifications, route.version.outputs)
    # Pin the version just checked against, so a newer upload cannot slip in between.
    result = await svc.runtime.predict(
        name, route.version.version, infer.inputs, None, infer.timeout_us, infer.priority, gone
    )
    outputs = infer.select(result.outputs)
    if not infer.classifications:
        return result, outputs
    batched = batches(batch_policy(route.version, svc.runtime.settings))
    labels = route.version.config.labels
    classify = partial(classified, outputs, infer.classifications, batched, labels)
    inline = classify_cost(outputs, infer.classifications, batched) <= INLINE_CLASSIFY_COST
    return result, classify() if inline else await run_in_threadpool(classify)


async def _infer(request: Request, name: str, version: int | None) -> Response:
    svc = await services(request)
    header_length = request.headers.get(HEADER_LENGTH)
    body = await inference_body(request, svc.settings, header_length is not None)
    # A length that is not a byte count is refused by decode_request, before its parse.
    json_length = None if header_length is None else byte_count(header_length)
    if json_length is not None and json_length > svc.settings.max_json_bytes:
        raise PayloadTooLargeError(
            f"the request's JSON header is at least {json_length} bytes; KILN_MAX_JSON_MB allows "
            f"{svc.settings.max_json_bytes}: send large tensors as binary data"
        )
    shared = svc.shared_memory
    if decodes_inline(body, header_length) and not names_shared_memory(body, header_length):
        infer = decode_request(body, header_length, shared)
    else:  # big, or in shared memory, which asks the store where
        infer = await run_in_threadpool(decode_request, body, header_length, shared)
    result, outputs = await run_infer(svc, name, version, infer, request.is_disconnected)
    header: dict[str, Any] = {"model_name": name, "model_version": str(result.version)}
    if infer.id is not None:
        header["id"] = infer.id
    if encodes_inline(outputs) and not infer.shared_outputs:
        payload, json_length = encode_response(header, outputs)
    else:
        payload, json_length = await run_in_threadpool(
            encode_response, header, outputs, infer.shared_outputs, shared
        )
    headers = {} if json_length is None else {HEADER_LENGTH: str(json_length)}
    media_type = "application/json" if json_length is None else "application/octet-stream"
    return await answer(request, svc.settings, payload, media_type, headers)


# The hot path, in a router of its own: `hot_path` matches these routes ahead of the framework's
# middleware. Its handlers call the auth check and reach the services themselves: FastAPI's
# dependency solving costs more per request than the rest of the handler's own Python.
inference = APIRouter(
    tags=["v2"],
    route_class=InferRoute,
    responses={200: INFER_OK, **error_responses(ProtocolError, 400, 401, 403, 404, 409, 413, 503)},
)


@inference.post(
    "/v2/models/{name}/infer",
    operation_id="v2_infer",
    summary="Run the model's default version, else its newest ready one.",
    openapi_extra=INFER_BODY,
)
async def infer(name: str, request: Request) -> Response:
    await check_infer(request)
    return await _infer(request, name, None)


@inference.post(
    "/v2/models/{name}/versions/{version}/infer",
    operation_id="v2_infer_version",
    summary="Run one version of the model.",
    openapi_extra=INFER_BODY,
)
async def infer_version(name: str, version: str, request: Request) -> Response:
    await check_infer(request)
    return await _infer(request, name, version_number(version))


# Included after every other router (app.py): any other /v2 path answers in the protocol's error
# shape, not with problem+json.
fallback = APIRouter(tags=["v2"], route_class=ProtocolRoute)


@fallback.api_route(
    "/v2/{path:path}",
    methods=["GET", "POST", "PUT", "PATCH", "DELETE"],
    include_in_schema=False,
    response_model=None,
)
def unknown_endpoint(path: str, request: Request) -> NoReturn:
    raise NotFoundError(f"no v2 endpoint {request.method} /v2/{path}")
