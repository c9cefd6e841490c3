"""A compile job's progress as server-sent events, until it settles.

The worker may be another process on another host, so this polls the job record in the store
instead of listening to the compile itself.
"""

from __future__ import annotations

from collections.abc import AsyncIterable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends
from fastapi.sse import EventSourceResponse, ServerSentEvent
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from service.api.auth import infer_scope
from service.api.deps import Services, services
from service.api.schemas import Problem, error_responses
from service.errors import NotFoundError
from service.records import SETTLED_JOBS, JobRecord, JobStatus, VariantStatus
from service.store import StoreUnavailableError

router = APIRouter(
    tags=["jobs"],
    dependencies=infer_scope,
    responses=error_responses(Problem, 401, 403, 404, 422, 503),
)

POLL_S = 0.25
SHUTDOWN = "this server is shutting down; open the job's events again to follow it"

DESCRIPTION = """\
A `text/event-stream`. The first event comes at once with the job's current state, then one
whenever its stage, status, attempts, error, cache hit or tuning progress changes:

    event: stage
    data: {"stage": "compiling", "status": "running", "attempts": 1, "error": null, "cache_hit": false,
           "tuning": null}

A tuned variant's `tuning` counts its trials as they run: `{"trials_done": 32, "trials_total": 96,
...}` (see the job's `tuning`).

The stream closes after `event: end`, sent when the job settles (`{"reason": "settled",
"status": "succeeded"}`), is deleted with its model (`{"reason": "deleted", "detail": ...}`), or
when this server shuts down (`{"reason": "shutdown", ...}`): the job goes on (a worker's in
Redis mode; in embedded mode, once this server is back), and is followed by opening the stream
again, on another replica or on this server once it is back.
Comment lines (`: ping`) keep idle connections open.
"""


class JobState(BaseModel):
    """The data of a `stage` event."""

    stage: VariantStatus
    status: JobStatus
    attempts: int
    error: str | None
    cache_hit: bool
    tuning: dict[str, Any] | None = None

    @classmethod
    def of(cls, job: JobRecord) -> JobState:
        return cls(
            stage=job.stage,
            status=job.status,
            attempts=job.attempts,
            error=job.error,
            cache_hit=job.cache_hit,
            tuning=job.tuning,
        )


class JobEnd(BaseModel):
    """The data of the final `end` event."""

    reason: Literal["settled", "deleted", "shutdown"]
    status: JobStatus | None = None
    detail: str | None = None


def existing_job(job_id: str, svc: Annotated[Services, Depends(services)]) -> JobRecord:
    """Resolved before the stream starts, so an unknown id is a plain 404 problem."""
    return svc.registry.get_job(job_id)


@router.get(
    "/v1/jobs/{job_id}/events",
    operation_id="job_events",
    summary="Stream a compile job's stage changes as server-sent events until it settles.",
    description=DESCRIPTION,
    response_class=EventSourceResponse,
)
async def job_events(
    job: Annotated[JobRecord, Depends(existing_job)], svc: Annotated[Services, Depends(services)]
) -> AsyncIterable[ServerSentEvent]:
    state = JobState.of(job)
    yield ServerSentEvent(event="stage", data=state)
    while job.status not in SETTLED_JOBS:
        if await svc.shutdown.wait(POLL_S):
            yield ServerSentEvent(event="end", data=JobEnd(reason="shutdown", detail=SHUTDOWN))
            return
        try:
            job = await run_in_threadpool(svc.registry.get_job, job.id)
        except NotFoundError as exc:
            yield ServerSentEvent(event="end", data=JobEnd(reason="deleted", detail=str(exc)))
            return
        except StoreUnavailableError:
            continue  # an outage pauses the stream; keep-alive comments hold the connection
        latest = JobState.of(job)
        if latest != state:
            state = latest
            yield ServerSentEvent(event="stage", data=state)
    yield ServerSentEvent(event="end", data=JobEnd(reason="settled", status=job.status))
