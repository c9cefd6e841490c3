"""Liveness, readiness, and Prometheus metrics."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.concurrency import run_in_threadpool

from service import metrics
from service.api.deps import Services, services

router = APIRouter(tags=["health"])


@router.get("/healthz", operation_id="healthz", summary="The process is up.")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", operation_id="readyz", summary="The store answers; 503 otherwise.")
def readyz(svc: Annotated[Services, Depends(services)]) -> dict[str, str]:
    svc.registry.store.ping()
    return {"status": "ready"}


# For Prometheus, not SDK users: no auth (like the probes) and left out of the OpenAPI spec.
@router.get("/metrics", include_in_schema=False)
async def prometheus_metrics(svc: Annotated[Services, Depends(services)]) -> Response:
    # The queue depth may ask Redis, and multiprocess mode reads files: off the event loop.
    body = await run_in_threadpool(metrics.scrape, svc.queue.depth)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
