"""Liveness and readiness. Ready means the store answers."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends

from service.api.deps import Services, services

router = APIRouter(tags=["health"])


@router.get("/healthz", operation_id="healthz", summary="The process is up.")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", operation_id="readyz", summary="The store answers; 503 otherwise.")
def readyz(svc: Annotated[Services, Depends(services)]) -> dict[str, str]:
    svc.registry.store.ping()
    return {"status": "ready"}
