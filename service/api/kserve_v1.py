"""KServe's V1 protocol, which is TensorFlow Serving's REST predict API: `{"instances": [...]}`
in, one item per batch row, and `{"predictions": [...]}` out; or the columnar `{"inputs": ...}`
in and `{"outputs": ...}` out.

Clients of KServe's V1 data plane (kserve's InferenceRESTClient), of TensorFlow Serving's REST
API and of Vertex AI's custom prediction containers call a Kiln model with it unchanged. Errors
are `{"error": "..."}`, as those servers answer them.
"""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Any, Literal

import numpy as np
from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import to_json
from starlette.concurrency import run_in_threadpool

from compiler.spec import InputSpec
from service.api.bodies import (
    INLINE_JSON_BYTES,
    INLINE_JSON_ELEMENTS,
    answer,
    inference_body,
    json_request_body,
    parsed,
)
from service.api.deps import Services, services
from service.api.protocol import InferRoute, check_infer, version_number
from service.api.schemas import ProtocolError, error_responses
from service.batcher import Arrays, Gone
from service.errors import BadRequestError
from service.records import OutputInfo
from service.runtime import Prediction

SHAPE = 'an object of "instances" (a list, one item per batch row) or "inputs"'
COLUMNAR = 'the columnar {"inputs": ...}, answered as {"outputs": ...}'


class PredictRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    instances: list[Any] | None = Field(
        default=None,
        description="One item per batch row: the input's value, or for a model of several inputs "
        "an object of input name -> value.",
        examples=[[[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]]],
    )
    inputs: Any = Field(
        default=None,
        description="The columnar form: the input's whole batch, or for a model of several inputs "
        "an object of input name -> batch.",
    )
    # TensorFlow Serving's name for a model's one signature, which its clients often send; empty
    # means the same there.
    signature_name: Literal["serving_default", ""] | None = None
    parameters: dict[str, Any] | None = Field(
        default=None, description="Accepted and not used: Vertex AI passes its own through."
    )

    @model_validator(mode="after")
    def one_form(self) -> PredictRequest:
        if (self.instances is None) == (self.inputs is None):
            raise ValueError('give either "instances" (one item per batch row) or "inputs" (columnar)')
        return self


class PredictResponse(BaseModel):
    predictions: list[Any] | None = Field(
        default=None,
        description='For "instances": one item per batch row, the output\'s value, or for a model '
        "of several outputs an object of output name -> value.",
    )
    outputs: Any = Field(
        default=None,
        description='For "inputs": the output\'s batch, or an object of output name -> batch.',
    )


def named(spec: InputSpec, value: Any, what: str) -> dict[str, Any]:
    """`value` as input name -> value: an object is that already; anything else is the value of
    a model's one input."""
    if isinstance(value, dict):
        if "b64" in value and "b64" not in spec.names:
            raise BadRequestError(
                f'{what}: binary {{"b64": ...}} values are not supported; the model takes numeric '
                f"tensors {spec.names}"
            )
        return value
    if len(spec.inputs) > 1:
        raise BadRequestError(
            f"{what}: the model takes inputs {spec.names}; give an object of input name -> value"
        )
    return {spec.names[0]: value}


def columns(spec: InputSpec, instances: list[Any]) -> dict[str, list[Any]]:
    """Instances, one per batch row, as input name -> the rows' values, which stack to a batch."""
    if not instances:
        raise BadRequestError('"instances" is empty; give one item per batch row')
    unbatched = [str(t) for t in spec.inputs if not t.batched]
    if unbatched:
        raise BadRequestError(
            f"input(s) {unbatched} have no batch dimension to stack instances on; send {COLUMNAR}"
        )
    rows = [named(spec, instance, f"instance {i}") for i, instance in enumerate(instances)]
    for i, row in enumerate(rows):
        if set(row) != set(spec.names):
            raise BadRequestError(f"instance {i} has inputs {sorted(row)}; the model takes {spec.names}")
    return {name: [row[name] for row in rows] for name in spec.names}


def check_rows(outputs: list[OutputInfo]) -> None:
    """Refuse instances, before anything runs, for a model whose outputs do not each lead with
    the batch: their values could not be split into one per instance."""
    unrowed = [f"{o.name}{o.shape}" for o in outputs if not o.batched]
    if unrowed:
        raise BadRequestError(f"output(s) {unrowed} have no row per instance; send {COLUMNAR}")


def decoded(body: bytes, spec: InputSpec, outputs: list[OutputInfo]) -> tuple[int | None, list[Arrays]]:
    """The request's arrays, as batches the model takes, and its number of instances (None for
    the columnar form). Instances past max_batch_size make several batches, as TensorFlow
    Serving's clients send any number; each is checked before any runs."""
    request = parsed(body, PredictRequest, SHAPE)
    if request.instances is None:
        return None, [spec.coerce(named(spec, request.inputs, '"inputs"'))]
    values = columns(spec, request.instances)
    check_rows(outputs)
    rows = len(request.instances)
    # Else each alone: as rows that stand apart of a spec whose every input has them.
    size = spec.largest_batch if spec.batched and all(o.rows_apart for o in outputs) else 1
    batches = [spec.coerce({n: v[i : i + size] for n, v in values.items()}) for i in range(0, rows, size)]
    for name in spec.names:  # within a batch, coerce refuses ragged rows; across batches, here
        shapes = {tuple(b[name].shape[1:]) for b in batches}
        if len(shapes) > 1:
            raise BadRequestError(
                f"input {name!r}: instances of one request make one tensor, but theirs have shapes "
                f"{sorted(list(s) for s in shapes)}; send instances of one shape in a request"
            )
    return rows, batches


async def run(svc: Services, name: str, number: int, batches: list[Arrays], gone: Gone) -> Arrays:
    """The outputs of the batches, joined. As many are queued at once as threads run a model's
    batches (KILN_INFERENCE_WORKERS, at least 2: one running and one waiting keep it busy); the
    rest wait here, not in the queue that max_queue_size bounds for every client. The first to
    fail fails the request, and those not yet queued do not run."""
    if len(batches) == 1:
        return (await svc.runtime.predict(name, number, batches[0], gone=gone)).outputs
    window = asyncio.Semaphore(max(2, svc.settings.inference_workers))
    failed: list[BaseException] = []

    async def one(arrays: Arrays) -> Prediction | None:
        async with window:
            if failed:
                return None
            try:
                return await svc.runtime.predict(name, number, arrays, gone=gone)
            except Exception as exc:
                failed.append(exc)
                raise

    done = await asyncio.gather(*(one(arrays) for arrays in batches), return_exceptions=True)
    if failed:
        raise failed[0]
    results = [d for d in done if isinstance(d, Prediction)]
    if len(results) < len(batches):  # one was cancelled
        raise next(d for d in done if isinstance(d, BaseException))
    for k in results[0].outputs:  # an output whose size follows the values, not the shapes
        shapes = {r.outputs[k].shape[1:] for r in results}
        if len(shapes) > 1:
            raise BadRequestError(
                f"output {k!r} has shapes {sorted(list(s) for s in shapes)} in the batches the "
                f"instances ran in, which make no one answer; send {COLUMNAR}, one batch at a time"
            )
    return {k: np.concatenate([r.outputs[k] for r in results]) for k in results[0].outputs}


def check_split(outputs: Arrays, rows: int) -> None:
    """Each output has one row per instance, as an answer of `rows` instances must."""
    for name, array in outputs.items():
        if array.ndim == 0 or array.shape[0] != rows:
            raise BadRequestError(
                f"output {name!r} of shape {list(array.shape)} has no row for each of the {rows} "
                f"instances; send {COLUMNAR}"
            )


def encoded(outputs: Arrays, rows: int | None) -> bytes:
    """The response body: the outputs by instance, or by name (the one output's value alone).
    NaN and infinities print as null, as KServe's server prints them: JSON has no such numbers,
    and kserve's client refuses the bare NaN that Python writes."""
    if rows is not None:
        check_split(outputs, rows)
    values = {name: array.tolist() for name, array in outputs.items()}
    only = next(iter(values.values())) if len(values) == 1 else None
    if rows is None:
        return to_json({"outputs": values if only is None else only}, inf_nan_mode="null")
    rowed = only if only is not None else [{name: v[i] for name, v in values.items()} for i in range(rows)]
    return to_json({"predictions": rowed}, inf_nan_mode="null")


async def _predict(request: Request, name: str, version: int | None) -> Response:
    svc = await services(request)
    body = await inference_body(request, svc.settings, binary=False)
    route = await svc.runtime.aroute(name, version)
    decode = partial(decoded, body, route.spec, route.version.outputs)
    rows, batches = decode() if len(body) <= INLINE_JSON_BYTES else await run_in_threadpool(decode)
    # Pin the version just decoded for, so a newer upload cannot slip in between.
    outputs = await run(svc, name, route.version.version, batches, request.is_disconnected)
    encode = partial(encoded, outputs, rows)
    elements = sum(array.size for array in outputs.values())
    payload = encode() if elements <= INLINE_JSON_ELEMENTS else await run_in_threadpool(encode)
    return await answer(request, svc.settings, payload, "application/json", {})


# On the hot path, as v2's infer routes (`hot_path`): the handlers check the key themselves.
router = APIRouter(
    tags=["kserve-v1"],
    route_class=InferRoute,
    responses={
        200: {"model": PredictResponse, "description": "The model's outputs."},
        **error_responses(ProtocolError, 400, 401, 403, 404, 409, 413, 503),
    },
)
OPENAPI = json_request_body(PredictRequest)


@router.post(
    "/v1/models/{name}:predict",
    operation_id="v1_protocol_predict",
    summary="KServe V1 / TensorFlow Serving predict with the default version, else the newest ready one.",
    openapi_extra=OPENAPI,
    response_model=None,
)
async def predict(name: str, request: Request) -> Response:
    await check_infer(request)
    return await _predict(request, name, None)


@router.post(
    "/v1/models/{name}/versions/{version}:predict",
    operation_id="v1_protocol_predict_version",
    summary="KServe V1 / TensorFlow Serving predict with one version of a model.",
    openapi_extra=OPENAPI,
    response_model=None,
)
async def predict_version(name: str, version: str, request: Request) -> Response:
    await check_infer(request)
    return await _predict(request, name, version_number(version))
