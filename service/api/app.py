"""The FastAPI application: wiring, lifespan and routers."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from fastapi.telemetry import TelemetryConfig
from starlette.concurrency import run_in_threadpool
from starlette.routing import BaseRoute
from starlette.types import ASGIApp
from uvicorn.config import STARTUP_FAILURE

from compiler.threads import set_threads
from service import metrics, scratch
from service.api import (
    events,
    health,
    jobs,
    kserve_v1,
    log_settings,
    models,
    predict,
    problems,
    repository,
    shared_memory,
    tf_metadata,
    trace_settings,
    v2,
    variants,
)
from service.api.auth import parse_keys, scopes_of
from service.api.deps import Services
from service.api.hot_path import InferenceFirst
from service.api.middleware import BodyRoute, KeyBeforeBody, RequestContext
from service.api.model_repository import Repository, RepositoryPoller
from service.api.protocol import InferRoute, ProtocolRoute
from service.api.shutdown import Shutdown
from service.api.v2_grpc import start_grpc
from service.deletions import DeletionSweep
from service.errors import KilnError
from service.log_settings import LogControl
from service.logs import capture_strays, kiln_handlers
from service.memory import collect_young_less_often, freeze_heap
from service.preload import Preload
from service.queue import DramatiqQueue, EmbeddedQueue, JobQueue
from service.redelivery import EmbeddedRedelivery
from service.registry import Registry
from service.runtime import Runtime
from service.sandbox import SUPERVISOR_PID, die_with_parent
from service.settings import Settings, get_settings
from service.shared_memory import SharedMemory
from service.store import open_store
from service.trace_settings import TraceControl

log = logging.getLogger("kiln.api")

# Seconds that gRPC calls in flight get to finish once shutdown begins (they are then cancelled):
# the server stops at once, beside HTTP's drain, so that its clients' channels, which a load
# balancer does not move, go elsewhere.
GRPC_GRACE_S = 5.0


NO_TELEMETRY: TelemetryConfig = {"tracing": False, "metrics": False, "logs": False}


class KilnAPI(FastAPI):
    """FastAPI, with the v2 infer routes served ahead of its middleware (`hot_path`) unless
    `hot_path` is off: with OpenTelemetry on, FastAPI's router names each span's route, and
    tracing is worth the framework's cost."""

    def __init__(self, *, hot_path: bool, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.hot_path = hot_path

    def build_middleware_stack(self) -> ASGIApp:
        stack = super().build_middleware_stack()
        if self.max_body_size is not None:
            stack = problems.DeclaredTooLarge(stack, self.max_body_size, refusal)
        if self.hot_path:
            # The routers' own routes: FastAPI includes a router as a whole, not route by route.
            routes = [
                r
                for router in (v2.inference, kserve_v1.router)
                for r in router.routes
                if isinstance(r, InferRoute)
            ]
            stack = InferenceFirst(stack, routes)
        # Outermost, so that what Starlette answers itself (its 500, its 413) carries the request
        # id and is counted, as every other answer is.
        return RequestContext(stack)


def refusal(route: BaseRoute | None) -> Callable[[KilnError], ASGIApp]:
    """The response to an error raised outside the route, as the route's own errors answer."""
    if isinstance(route, ProtocolRoute | InferRoute):  # the inference protocols' shape
        return lambda exc: JSONResponse({"error": str(exc)}, exc.status_code, exc.headers)
    return lambda exc: problems.problem(exc.status_code, exc.title, str(exc), exc.headers)


def body_routes(routers: Iterable[APIRouter]) -> list[BodyRoute]:
    """The routes whose body FastAPI reads before their key check, in the app's order."""
    return [
        BodyRoute(route, scopes, refusal(route))
        for router in routers
        for route in router.routes
        if isinstance(route, APIRoute) and route.body_field is not None and (scopes := scopes_of(route))
    ]


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    supervisor = os.environ.get(SUPERVISOR_PID)
    if supervisor:  # a worker of `kiln serve --workers N`: stopped as it is, if it is killed
        die_with_parent(int(supervisor), signal.SIGTERM)
    api_keys = parse_keys(settings.api_keys)
    max_bytes = settings.max_request_bytes
    if kiln_handlers():  # uvicorn applied Kiln's log config in this process; torch is imported
        capture_strays()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        scratch.sweep()  # what a process killed mid-upload or mid-compile left on the disk
        store = open_store(settings)
        registry = Registry(store)
        queue: JobQueue = EmbeddedQueue(registry, settings) if settings.embedded else DramatiqQueue(settings)
        # Intra-op threads for every runtime in this process, set once (KILN_THREADS).
        set_threads(settings.threads)
        runtime = Runtime(registry, settings)
        repo = None if settings.model_repository is None else Repository(settings.model_repository)
        preload = Preload(
            runtime,
            settings.load_models,
            None if repo is None else lambda stopping: repo.deploy(app.state.services, stopping),
        )
        shared = SharedMemory(store, settings.shared_memory)
        logs = LogControl(store, settings.log_format, settings.route_ttl_s)
        traces = TraceControl(store, runtime.traces, settings.route_ttl_s)
        sweep = DeletionSweep(runtime, settings.deletion_sweep_s)
        redelivery = (
            EmbeddedRedelivery(registry, queue, settings.queue_requeue_s)
            if isinstance(queue, EmbeddedQueue)
            else None
        )
        shutdown = Shutdown()
        app.state.services = Services(
            settings,
            registry,
            queue,
            runtime,
            preload,
            shared,
            logs,
            traces,
            shutdown,
            repo,
            threading.BoundedSemaphore(settings.upload_checks),
        )
        poll_s = settings.model_repository_poll_s
        poller = None if repo is None or not poll_s else RepositoryPoller(repo, app.state.services, poll_s)
        if not api_keys:
            log.warning("KILN_API_KEYS is empty: Kiln is open to anyone who can reach it")
        grpc_server, grpc_drain = None, None
        try:  # a port that is taken fails the start, with everything opened so far closed
            grpc_server = await start_grpc(app.state.services, settings, api_keys, app.version, max_bytes)
            if redelivery is not None:  # what a restart interrupted, at once
                await run_in_threadpool(redelivery.run_once)
                redelivery.start()
            await run_in_threadpool(logs.run_once)  # the deployment's log settings, from the start
            await run_in_threadpool(traces.run_once)  # and its trace settings
            logs.start()
            traces.start()
            sweep.start()
            preload.start()
            if poller is not None:
                poller.start()
            shutdown.watch()
            if grpc_server is not None:  # its clients move on while HTTP drains, not after
                grpc_drain = asyncio.create_task(shutdown.then(grpc_server.stop, GRPC_GRACE_S))
            freeze_heap()  # what startup imported stays out of every later full collection
            collect_young_less_often()
            log.info("kiln ready (%s mode)", "embedded" if settings.embedded else "redis")
            yield
        finally:
            shutdown.unwatch()
            await run_in_threadpool(preload.stop)  # waits for a load in progress
            if poller is not None:  # as long as preload waits; it may wait for the lock, uncut
                await run_in_threadpool(poller.stop)
            await run_in_threadpool(logs.stop)
            await run_in_threadpool(traces.stop)
            await run_in_threadpool(sweep.stop)
            if redelivery is not None:
                await run_in_threadpool(redelivery.stop)
            if grpc_server is not None:  # awaits a drain under way
                await grpc_server.stop(GRPC_GRACE_S)
            if grpc_drain is not None:  # still waiting, when the app stops with no signal
                grpc_drain.cancel()
            runtime.close()
            queue.close()
            store.close()
            metrics.process_exiting()

    app = KilnAPI(
        hot_path=not settings.opentelemetry,
        title="Kiln",
        version="0.1.0",
        summary="A model server that compiles what it serves.",
        lifespan=lifespan,
        max_body_size=max_bytes,
        form_limits={"max_part_size": problems.FORM_FIELD_BYTES},
        telemetry=None if settings.opentelemetry else NO_TELEMETRY,
    )
    # Routes match in order. v2 inference comes first, for when the hot path is off (OpenTelemetry
    # on): matching it then tries two routes instead of every route. The repository extension
    # comes before the rest of v2, whose /v2/models/{name} would match /v2/models/stats. The v2
    # catch-all, which answers unknown /v2 paths in the protocol's error shape, comes last.
    extensions = (repository.router, shared_memory.router, log_settings.router, trace_settings.router)
    rest = (predict, kserve_v1, tf_metadata, health, models, variants, jobs, events)
    routers = [v2.inference, *extensions, v2.router, *(module.router for module in rest), v2.fallback]
    app.state.api_keys = api_keys
    if api_keys:  # else every route is open
        app.add_middleware(KeyBeforeBody, keys=api_keys, routes=body_routes(routers))
    problems.install(app)
    for router in routers:
        # The native predict's JSON is held to KILN_MAX_JSON_MB, as the inference protocols' is.
        app.include_router(
            router, max_body_size=settings.max_json_bytes if router is predict.router else None
        )
    return app


def served_app() -> FastAPI:
    """create_app, as `kiln serve` has uvicorn call it in each process. An app that cannot be
    built ends the process as uvicorn's own startup failures do: any other exit code has the
    supervisor of `--workers N` start another process, which fails alike, forever."""
    try:
        return create_app()
    except Exception:
        log.exception("the app could not be built")
        sys.exit(STARTUP_FAILURE)
