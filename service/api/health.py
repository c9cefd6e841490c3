"""Liveness, readiness, and Prometheus metrics."""

from __future__ import annotations

import asyncio
import functools
from typing import Annotated

from fastapi import APIRouter, Depends, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.concurrency import run_in_threadpool

from service import metrics
from service.api.deps import Services, services
from service.api.models import live_targets
from service.store import StoreUnavailableError

router = APIRouter(tags=["health"])


# Both on the event loop, not in the threadpool: requests that a hung store holds there must not
# make the liveness probe time out, and the pod restart, during an outage.
@router.get("/healthz", operation_id="healthz", summary="The process is up.")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get(
    "/",
    operation_id="alive",
    summary='KServe V1\'s liveness, {"status": "alive"} while the process is up, for its clients.',
)
async def alive() -> dict[str, str]:
    return {"status": "alive"}


# A probe gives up after a second (Kubernetes' default timeoutSeconds); a hung store would not.
PING_WAIT_S = 0.5


async def readiness(svc: Services) -> str:
    """ "ready" when the store answers. When it does not, "degraded" if this replica holds
    loaded runners, which serve on without it: a Redis outage must not take every replica out
    of its Service at once. Under `--workers N`, any of its processes' count: asked of this
    one alone, probes landing on one worker or another flapped between 200 and 503. Raises
    StoreUnavailableError when there is nothing to serve, and NotReadyError while the models
    that KILN_LOAD_MODELS names load."""
    svc.preload.check()
    try:
        await asyncio.wait_for(run_in_threadpool(svc.registry.store.ping), PING_WAIT_S)
    except (StoreUnavailableError, TimeoutError) as exc:
        if not svc.runtime.loaded_runners and not await run_in_threadpool(metrics.replica_runners):
            if isinstance(exc, TimeoutError):
                raise StoreUnavailableError(f"the store did not answer in {PING_WAIT_S} s") from exc
            raise
        return "degraded"
    return "ready"


@router.get(
    "/readyz",
    operation_id="readyz",
    summary="The store answers (ready), or loaded models serve without it (degraded); 503 otherwise, "
    "and while the models named in KILN_LOAD_MODELS load.",
)
async def readyz(svc: Annotated[Services, Depends(services)]) -> dict[str, str]:
    return {"status": await readiness(svc)}


# For Prometheus, not SDK users: no auth (like the probes) and left out of the OpenAPI spec.
@router.get("/metrics", include_in_schema=False)
async def prometheus_metrics(svc: Annotated[Services, Depends(services)]) -> Response:
    # The queue depth may ask Redis, and multiprocess mode reads files: off the event loop.
    body = await run_in_threadpool(metrics.scrape, functools.partial(queue_depth, svc))
    return Response(body, media_type=CONTENT_TYPE_LATEST)


def queue_depth(svc: Services) -> dict[str, int]:
    """Blocking: the queues of this host's targets and of those live workers serve, at 0 when
    empty, and any other that holds a job: a GPU worker's queue is not the API host's."""
    return svc.queue.depth({*svc.settings.host_targets(), *live_targets(svc)})
