"""Compile jobs."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends

from service.api.auth import infer_scope
from service.api.deps import Services, services
from service.api.schemas import JobOut, Problem, error_responses

router = APIRouter(
    tags=["jobs"],
    dependencies=infer_scope,
    responses=error_responses(Problem, 401, 403, 404, 422, 503),
)


@router.get("/v1/jobs/{job_id}", operation_id="get_job", summary="A compile job's status and stage.")
def get_job(job_id: str, svc: Annotated[Services, Depends(services)]) -> JobOut:
    return JobOut.model_validate(svc.registry.get_job(job_id).model_dump())
