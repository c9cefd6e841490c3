"""The native predict route."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request

from service.api.auth import infer_scope
from service.api.deps import Services, services
from service.api.schemas import PredictIn, PredictOut, Problem, VariantRef, error_responses
from service.tensors import MAX_TIMEOUT_US

router = APIRouter(
    tags=["inference"],
    dependencies=infer_scope,
    responses=error_responses(Problem, 400, 401, 403, 404, 409, 422, 503),
)

BackendQuery = Annotated[
    str | None,
    Query(description="Pin a backend (e.g. `tvm`) instead of the fastest verified variant."),
]
TimeoutQuery = Annotated[
    int | None,
    Query(
        ge=0,
        le=MAX_TIMEOUT_US,
        description="Microseconds the request may wait before it is answered 503 instead of run; "
        "counts when shorter than the model's default_timeout_us; 0 sets none.",
    ),
]
PriorityQuery = Annotated[
    int,
    Query(
        ge=0,
        le=2**64 - 1,
        description="Triton's request priority: 1 is the highest of the model's priority_levels; "
        "0, or one past them, waits at its default_priority_level.",
    ),
]


async def _predict(
    svc: Services,
    request: Request,
    name: str,
    version: int | None,
    body: PredictIn,
    backend: str | None,
    timeout_us: int | None,
    priority: int,
) -> PredictOut:
    result = await svc.runtime.predict(
        name, version, body.inputs, backend, timeout_us, priority, request.is_disconnected
    )
    variant = result.variant
    return PredictOut(
        outputs={k: v.tolist() for k, v in result.outputs.items()},
        model_version=result.version,
        variant=VariantRef(id=variant.id, backend=variant.backend, target=variant.target),
    )


# The runtime awaits batches that run in its own threads: inference never blocks the event loop.
@router.post(
    "/v1/models/{name}/predict",
    operation_id="predict",
    summary="Run the default version, else the newest ready one, with its fastest verified variant.",
)
async def predict(
    name: str,
    body: PredictIn,
    request: Request,
    svc: Annotated[Services, Depends(services)],
    backend: BackendQuery = None,
    timeout_us: TimeoutQuery = None,
    priority: PriorityQuery = 0,
) -> PredictOut:
    return await _predict(svc, request, name, None, body, backend, timeout_us, priority)


@router.post(
    "/v1/models/{name}/versions/{version}/predict",
    operation_id="predict_version",
    summary="Run one version of a model.",
)
async def predict_version(
    name: str,
    version: int,
    body: PredictIn,
    request: Request,
    svc: Annotated[Services, Depends(services)],
    backend: BackendQuery = None,
    timeout_us: TimeoutQuery = None,
    priority: PriorityQuery = 0,
) -> PredictOut:
    return await _predict(svc, request, name, version, body, backend, timeout_us, priority)
