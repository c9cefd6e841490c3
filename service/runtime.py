"""The runtime: batches requests, routes each batch to a variant, and keeps runners in an LRU.

A model version's requests are batched together, and each batch runs on the variant that was
measured fastest at the batch's own size: ONNX Runtime may win at batch 1 and Inductor at 8.
A batch holds a reference to the runner it started with, so swapping in a faster variant or
evicting one never drops a request in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import math
import threading
import time
import weakref
from collections import OrderedDict, defaultdict
from collections.abc import Mapping, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor, wait
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, replace
from functools import partial
from typing import NoReturn

import numpy as np
import torch
from starlette.concurrency import run_in_threadpool

from compiler.artifact import Artifact
from compiler.backends import load_artifact
from compiler.benchmark import benchmark_batches
from compiler.dims import OutsideDimsError
from compiler.errors import CompilerError, ModelRunError, failure
from compiler.runner import Renamed, Runner
from compiler.spec import InputSpec
from service import metrics
from service.batcher import Arrays, Batcher, BatchPolicy, BatchTiming, Gone
from service.errors import ConflictError, DeletedError, KilnError, NotFoundError
from service.logs import request_id
from service.memory import freeze_heap, release_memory
from service.records import VariantRecord, VersionRecord
from service.registry import ARTIFACT_BLOB, MODEL_BLOB, Registry
from service.response_cache import HASH_INLINE_BYTES, Key, ResponseCache, response_key
from service.router import (
    ANY_TARGET,
    REFERENCE,
    choose_variant,
    cost_ratio,
    servable,
    serving_group,
    serving_version,
)
from service.settings import Settings
from service.stats import Stats, deleted_error, failure_reason
from service.store import BlobNotFoundError, StoreUnavailableError
from service.traces import Trace, Traces

log = logging.getLogger("kiln.runtime")

MB = 1024 * 1024
# How long a request waits for the store to refresh a stale route before it serves the old one.
ROUTE_WAIT_S = 0.5
# How long a variant that failed to load is left out before a request tries it again.
UNLOADABLE_RETRY_S = 60.0
# How long an unload lets the requests already in run before it answers the rest with 503:
# Triton lets a model's requests in flight finish before it unloads it.
UNLOAD_DRAIN_S = 30.0
# How long an unload waits for its model's batchers to say they are idle (a turn of the event loop).
IDLE_DRAIN_WAIT_S = 1.0
# At most one background load of a runner this often: when the budget holds only one of a
# version's runners, each load would evict the stand-in and the next batch size load it back.
LOAD_BEHIND_EVERY_S = 60.0
# A warm-up's calls per batch size: TorchScript's profiling executor profiles a graph on its
# first call and runs it optimized from its second.
WARMUP_RUNS = 2


@dataclass(frozen=True)
class Route:
    version: VersionRecord
    spec: InputSpec
    variants: list[VariantRecord]
    fetched_at: float
    # The store did not answer the last refresh: serve this without waiting for the next one.
    store_failed: bool = False


@dataclass(frozen=True)
class Prediction:
    outputs: dict[str, np.ndarray]
    version: int
    variant: VariantRecord


@dataclass
class Loaded:
    runner: Runner
    model: str
    version: int
    # The artifact's size: weights and code, which is what a loaded runner holds in memory.
    size_bytes: int


def warm_up(runner: Runner, spec: InputSpec, batches: Sequence[int]) -> None:
    """Run the runner WARMUP_RUNS times at each batch size, on seeded random inputs."""
    for batch in batches:
        inputs = spec.random_inputs(batch, np.random.default_rng(0))
        try:
            for _ in range(WARMUP_RUNS):
                runner.run(inputs)
        except Exception as exc:
            raise RuntimeError(f"its warm-up at batch {batch} failed: {exc}") from exc


def _unloaded(name: str) -> ConflictError:
    return ConflictError(
        f"model {name!r} is unloaded: POST /v2/repository/models/{name}/load serves it again"
    )


def batch_policy(version: VersionRecord, settings: Settings) -> BatchPolicy:
    """Batch only what can be split back: a batched spec whose outputs all lead with the batch,
    each row its own request's, and only where dynamic batching is on; else each request runs
    alone."""
    config = version.config
    queue = settings.max_queue_size if config.max_queue_size is None else config.max_queue_size
    batchable = version.spec().batched and all(o.batched and o.rows_apart for o in version.outputs)
    if not batchable or not config.dynamic_batching:
        return BatchPolicy(1, max_queue_size=queue)
    delay = config.max_queue_delay_us
    return BatchPolicy(
        config.max_batch_size or 1,
        settings.max_queue_delay_us if delay is None else delay,
        tuple(config.preferred_batch_sizes),
        queue,
        config.adaptive_queue_delay,
        config.priority_levels,
        # The lowest level when unset; capped, since two changes at once can store one past it.
        min(config.default_priority_level or config.priority_levels, config.priority_levels),
        config.instances,
    )


class Runtime:
    def __init__(self, registry: Registry, settings: Settings) -> None:
        self.registry = registry
        self.settings = settings
        self.targets = set(settings.host_targets())
        self.stats = Stats()
        self.traces = Traces()
        self._routes: dict[tuple[str, int | None], Route] = {}
        self._loaded: OrderedDict[str, Loaded] = OrderedDict()
        self._lock = threading.Lock()
        self._loading: dict[str, threading.Lock] = {}
        # A request's runner not yet loaded loads once, on a thread of this pool, however many
        # requests wait for it (on their event loop, not each on a thread: a cold model's burst
        # held all of AnyIO's 40, and every other route that uses them waited for the load).
        self._request_loads: dict[tuple[str, str | None], Future[tuple[VariantRecord, Loaded]]] = {}
        self._request_load_pool = ThreadPoolExecutor(8, thread_name_prefix="kiln-request-load")
        self._refreshing: dict[tuple[str, int | None], Future[Route]] = {}
        # Per model, how many times it was unloaded or rerouted: a refresh started before is stale.
        self._generations: defaultdict[str, int] = defaultdict(int)
        # Per model, how many times it was unloaded: a runner whose load began before is not kept
        # (nor one of a version deleted meanwhile: Stats.deleted).
        self._unloads: defaultdict[str, int] = defaultdict(int)
        self._evictions = 0
        self._closed = False
        # Model -> when a refresh last found it unloaded: until a TTL later, its requests are
        # refused without asking the store, as a ready model's are served from its route.
        self._unloaded_at: dict[str, float] = {}
        # Per model, how many times it was loaded again, and that count at its latest unload: an
        # unload's runners go once its requests are answered, unless the model was loaded again
        # since, and serves on them.
        self._reloads: defaultdict[str, int] = defaultdict(int)
        self._reloads_at_unload: dict[str, int] = {}
        # Variant id -> when to try loading it again.
        self._unloadable: dict[str, float] = {}
        # Refreshes run here: with a hung store each takes its socket timeout, so enough threads
        # that one model's wait does not queue another's first route behind it.
        self._route_pool = ThreadPoolExecutor(8, thread_name_prefix="kiln-route")
        # Variants loaded while another of their version serves (runner keys in flight here).
        self._load_pool = ThreadPoolExecutor(2, thread_name_prefix="kiln-load")
        self._loaded_behind_at: dict[str, float] = {}  # runner key -> when its load began
        # Per model version, and per backend for requests that pin one.
        self._batchers: dict[tuple[str, int, str | None], Batcher[VariantRecord]] = {}
        # Unloaded, their requests in flight still running: the batchers (and the model version
        # they serve), and the routes their batches find their variants by, until those requests
        # are answered.
        self._draining: dict[Batcher[VariantRecord], tuple[str, int]] = {}
        self._draining_routes: dict[tuple[str, int], Route] = {}
        # Models that cannot batch run their requests side by side here.
        self._executor = ThreadPoolExecutor(settings.inference_workers, thread_name_prefix="kiln-infer")
        # A batching model runs one batch at a time (`instances` at a time), each always on the
        # same one of as many one-thread lanes: torch gives each thread that calls it an OpenMP
        # team of its own (KILN_THREADS each: several instances oversubscribe the cores unless
        # it is lowered), and ResNet-18's TorchScript calls ran 1.6-1.8x slower rotated over 4
        # threads than on one.
        self._lanes: list[Executor] = [
            ThreadPoolExecutor(1, thread_name_prefix=f"kiln-lane{i}")
            for i in range(settings.inference_workers)
        ]
        self._next_lane = 0  # where the next batcher's lanes begin, round the lanes in turn
        self._responses = ResponseCache(settings.response_cache_mb * MB)

    # Routing -----------------------------------------------------------------------------

    def _fresh_route(self, key: tuple[str, int | None]) -> Route | None:
        cached = self._routes.get(key)
        if cached is not None and time.monotonic() - cached.fetched_at < self.settings.route_ttl_s:
            return cached
        return None

    def route(self, name: str, version: int | None) -> Route:
        """Blocking (store I/O). A stale route is refreshed once however many requests ask, in
        the background: the request that starts a refresh waits for it at most ROUTE_WAIT_S,
        the others not at all, nor anyone while the store is failing; the route they had serves
        meanwhile. A slow or unreachable store thus never holds up predictions of a model this
        process knows (each request had waited out the socket timeout, 5 s, on a paused Redis)."""
        found = self._route_or_refresh((name, version))
        if isinstance(found, Route):
            return found
        refresh, cached = found
        if cached is None:
            return refresh.result()
        try:
            return refresh.result(timeout=ROUTE_WAIT_S)
        except (FutureTimeout, StoreUnavailableError):
            return cached

    def _route_or_refresh(self, key: tuple[str, int | None]) -> Route | tuple[Future[Route], Route | None]:
        """The route to serve now; else the refresh to wait for, at most ROUTE_WAIT_S when there
        is a route to serve past it, and that route (None: none, the refresh is waited out)."""
        fresh = self._fresh_route(key)
        if fresh is not None:
            return fresh
        self._refuse_if_unloaded(key[0])
        cached = self._routes.get(key)
        refresh, started = self._refresh(key)
        if cached is not None and (not started or cached.store_failed):
            return cached
        return refresh, cached

    def _refresh(self, key: tuple[str, int | None]) -> tuple[Future[Route], bool]:
        """The refresh of this route in flight, and whether this call started it."""
        with self._lock:
            refresh = self._refreshing.get(key)
            if refresh is not None:
                return refresh, False
            generation = self._generations[key[0]]
            refresh = self._refreshing[key] = self._route_pool.submit(self._fetch_route, key, generation)

        def done(finished: Future[Route]) -> None:
            with self._lock:  # a load may have put a newer refresh in its place
                if self._refreshing.get(key) is finished:
                    del self._refreshing[key]

        refresh.add_done_callback(done)
        return refresh, True

    def _fetch_route(self, key: tuple[str, int | None], generation: int) -> Route:
        """Read a route from the store; keep it unless the model was unloaded meanwhile: a
        refresh that read a version before its deletion must not put it back."""
        name, version = key
        try:
            if version is None:
                view = self.registry.get_model(name)
                self._check_loaded(name, view.unloaded, generation)
                chosen, variants = serving_version(view, self.targets)
            else:
                chosen = self.registry.get_version(name, version)
                self._check_loaded(name, self.registry.is_unloaded(name), generation)
                variants = self.registry.variants_of(chosen)
        except StoreUnavailableError:
            cached = self._routes.get(key)
            if cached is not None:  # tried again a TTL from now, and not waited for
                self._keep_routes(
                    name, generation, {key: replace(cached, fetched_at=time.monotonic(), store_failed=True)}
                )
            raise
        except NotFoundError:
            self._routes.pop(key, None)
            raise
        route = Route(chosen, chosen.spec(), variants, time.monotonic())
        before = self._routes.get((name, chosen.version))
        # Under its number too: that is how a batch, in the executor, finds its variants.
        if self._keep_routes(name, generation, {key: route, (name, chosen.version): route}):
            self._apply_serving(before, chosen)  # else a newer read applies its own
        return route

    def _apply_serving(self, before: Route | None, version: VersionRecord) -> None:
        """A version's serving settings, as last read from the store, reach this process: a
        change on any replica applies here within a route TTL. Its batchers take the new
        policy, and a response cache turned off forgets the version's answers."""
        if before is not None and before.version.config.response_cache and not version.config.response_cache:
            self._responses.drop(version.name, version.version)
        policy = batch_policy(version, self.settings)
        for (name, number, _), batcher in list(self._batchers.items()):  # a copy: see unload
            if (name, number) == (version.name, version.version) and batcher.policy != policy:
                log.info("%s v%d batches with %s from now on", name, number, policy)
                first = self._lanes.index(batcher.lanes[0]) if batcher.lanes[0] in self._lanes else None
                lanes = self._lanes_for(policy, first)
                batcher.reconfigure(policy, None if lanes == batcher.lanes else lanes)

    def _check_loaded(self, name: str, unloaded: bool, generation: int) -> None:
        """An unload received by another process reaches this one at its next refresh of the
        model's route, which then unloads it here too (its runners go once the requests here
        are answered); unless a load came meanwhile."""
        if not unloaded:
            return
        with self._lock:
            current = self._generations[name] == generation
            if current:
                self._unloaded_at[name] = time.monotonic()
        if current:
            self.unload(name)
        raise _unloaded(name)

    def _refuse_if_unloaded(self, name: str) -> None:
        seen = self._unloaded_at.get(name)
        if seen is not None and time.monotonic() - seen < self.settings.route_ttl_s:
            raise _unloaded(name)

    def reroute(self, name: str, loaded: bool = False) -> None:
        """A model was `loaded` again, or given another default version: its next request reads
        its route afresh, without joining or keeping a refresh in flight, which may have read
        the model still unloaded or the old default."""
        with self._lock:
            self._new_generation(name)
            self._reloads[name] += loaded
            if loaded:  # what a drain's requests loaded behind was not kept: load it again now
                for key in [k for k in self._loaded_behind_at if k.startswith(f"{name}/")]:
                    del self._loaded_behind_at[key]
            self._unloaded_at.pop(name, None)
            self._routes.pop((name, None), None)

    def reconfigure(self, name: str, version: VersionRecord) -> None:
        """Serving settings of the model changed here, to `version`'s: its batchers take them at
        once, as the requests that come before its route's next read would not; that read (at
        their next request) applies the rest. Until then a batch runs on the route it has,
        without asking the store on an inference thread."""
        with self._lock:
            self._new_generation(name)
            before = self._routes.get((name, version.version))
            for key, route in list(self._routes.items()):
                if key[0] == name:  # a batcher made meanwhile takes the new settings too
                    current = version if route.version.version == version.version else route.version
                    self._routes[key] = replace(route, version=current, fetched_at=-math.inf)
        self._apply_serving(before, version)

    def _new_generation(self, name: str) -> None:
        """Under the lock: refreshes of the model in flight, which may have read it as it was,
        keep nothing, and are neither joined nor waited for."""
        self._generations[name] += 1
        for key in [k for k in self._refreshing if k[0] == name]:
            del self._refreshing[key]

    def _keep_routes(self, name: str, generation: int, routes: dict[tuple[str, int | None], Route]) -> bool:
        """Whether they were kept: not when the model was unloaded or rerouted meanwhile."""
        with self._lock:
            current = self._generations[name] == generation
            if current:
                self._routes.update(routes)
            return current

    async def aroute(self, name: str, version: int | None) -> Route:
        """As `route`, waiting on the event loop, not on a thread of AnyIO's pool: uploads
        waiting for their checks can hold all 40, and predictions of loaded models stalled
        behind them for 25 s."""
        found = self._route_or_refresh((name, version))
        if isinstance(found, Route):
            return found
        refresh, cached = found
        waiting = asyncio.wrap_future(refresh)
        if cached is None:
            return await waiting
        # A refresh that fails past the wait is nobody's to await: its error is read here.
        waiting.add_done_callback(lambda done: done.cancelled() or done.exception())
        try:
            return await asyncio.wait_for(asyncio.shield(waiting), ROUTE_WAIT_S)
        except (TimeoutError, StoreUnavailableError):
            return cached

    # Inference ---------------------------------------------------------------------------

    async def predict(
        self,
        name: str,
        version: int | None,
        inputs: Mapping[str, object],
        backend: str | None = None,
        timeout_us: int | None = None,
        priority: int = 0,
        gone: Gone | None = None,
    ) -> Prediction:
        """`timeout_us` (see effective_timeout) bounds the request's wait from now: past it, a
        TimeoutExpiredError, unless its batch formed before. `priority`: Triton's request
        parameter (BatchPolicy.level). `gone`: whether its client hung up (Batcher.submit).
        Requests the trace settings sample (service.traces) are traced from their arrival, once
        routed: one of an unknown model or version is not."""
        arrived = time.monotonic()
        begun = time.perf_counter()
        route = await self.aroute(name, version)
        trace = self.traces.sample(name, arrived, route.version.version)
        asked = (name, route, inputs, backend, timeout_us, priority, gone, arrived, begun)
        if trace is None:
            return await self._predict(*asked)
        try:
            return await self._predict(*asked, trace)
        finally:
            trace.end(request_id.get())

    async def _predict(
        self,
        name: str,
        route: Route,
        inputs: Mapping[str, object],
        backend: str | None,
        timeout_us: int | None,
        priority: int,
        gone: Gone | None,
        arrived: float,
        begun: float,
        trace: Trace | None = None,
    ) -> Prediction:
        arrays = route.spec.coerce(inputs)
        batch = route.spec.check(arrays)
        number = route.version.version
        started = time.perf_counter()
        # A pinned backend asks for that backend's answer, which the cache does not know.
        cache_key, looked_up, unloads = None, 0.0, self._unloads[name]
        epoch = self._responses.epoch(name)
        if route.version.config.response_cache and backend is None and self._responses.max_bytes:
            cache_key = await self._response_key(name, number, arrays)
            cached = self._responses.get(cache_key)
            done = time.perf_counter()
            if cached is not None:
                self.stats.cache_hit(name, number, done - started, done - begun)
                return Prediction(dict(cached.outputs), number, cached.variant)
            looked_up = done - started
        # The variant for this request alone is loaded before it queues, the request counted in
        # its batcher meanwhile (against max_queue_size; pending, which an autoscaler reads: the
        # requests a cold replica holds); a batch may still pick another.
        key = runner_key(route.version, self.choose(route.variants, batch, backend))
        ready = None if self._cached(key) is not None else partial(self._load_for, key, route, batch, backend)
        try:
            timeout_us = effective_timeout(timeout_us, route.version.config.default_timeout_us)
            deadline = None if timeout_us is None else arrived + timeout_us / 1e6
            batcher = self._batcher(route.version, backend)
            on_run = None if trace is None else trace.ran
            outputs, variant = await batcher.submit(arrays, batch, deadline, priority, gone, on_run, ready)
        except BaseException as exc:  # a client that hung up (cancelled) is a failed request too
            self.stats.failed(name, number, time.perf_counter() - started, failure_reason(exc))
            raise
        if cache_key is not None:
            inserting = time.perf_counter()
            # Else its answers were dropped meanwhile, with the model's runners or the version.
            if self._unloads[name] == unloads and not self.stats.deleted(name, number):
                self._responses.put(cache_key, outputs, variant, epoch)
            self.stats.cache_miss(name, number, looked_up + time.perf_counter() - inserting)
        done = time.perf_counter()
        self.stats.answered(name, number, done - started, done - begun, variant.backend, variant.target)
        return Prediction(outputs, number, variant)

    async def _load_for(self, runner: str, route: Route, batch: int, backend: str | None) -> None:
        """The request's runner (`runner`, its key) loaded, in the context of the request that
        starts the load (its log lines carry its id) and off the inference threads. A failed load
        fails every request waiting for it, and the next request tries again."""
        key = (runner, backend)

        def load() -> tuple[VariantRecord, Loaded]:
            try:
                return self.runner(route, batch, backend)
            finally:
                with self._lock:
                    del self._request_loads[key]

        with self._lock:
            loading = self._request_loads.get(key)
            if loading is None:
                call = partial(contextvars.copy_context().run, load)
                loading = self._request_loads[key] = self._request_load_pool.submit(call)
        # Shielded: a request given up on must not cancel the load that others wait for.
        await asyncio.shield(asyncio.wrap_future(loading))

    async def _response_key(self, name: str, number: int, arrays: Arrays) -> Key:
        if sum(a.nbytes for a in arrays.values()) <= HASH_INLINE_BYTES:
            return response_key(name, number, arrays)
        return await run_in_threadpool(response_key, name, number, arrays)  # hashlib frees the GIL

    def _batcher(self, version: VersionRecord, backend: str | None) -> Batcher[VariantRecord]:
        name, number = version.name, version.version
        key = (name, number, backend)
        batcher = self._batchers.get(key)
        if batcher is None:

            def run(arrays: Arrays) -> tuple[Arrays, VariantRecord]:
                return self._run(name, number, backend, arrays)

            queue_seconds = self.stats.labelled(metrics.QUEUE_SECONDS, name, number)
            batch_size = self.stats.labelled(metrics.BATCH_SIZE, name, number)

            def on_batch(timing: BatchTiming) -> None:
                self.stats.execution(name, number, timing)
                batch_size.observe(timing.batch_size)
                for seconds in timing.queued_s:
                    queue_seconds.observe(seconds)

            # The newest read of the version: a request may hold one older than a change's.
            newest = self._routes.get((name, number))
            policy = batch_policy(version if newest is None else newest.version, self.settings)
            pending = self.stats.labelled(metrics.PENDING_REQUESTS, name, number)
            waiting = self.stats.labelled(metrics.NV_PENDING, name, number, True)
            lanes = self._lanes_for(policy)
            batcher = self._batchers[key] = Batcher(run, policy, lanes, on_batch, pending.inc, waiting.inc)
        return batcher

    def _lanes_for(self, policy: BatchPolicy, first: int | None = None) -> list[Executor]:
        """Where a batcher of `policy` runs: requests that cannot batch side by side in the
        pool; batches on `instances` lanes (at most every lane), from the `first`, else from the
        next batcher's turn."""
        if policy.max_batch_size == 1:
            return [self._executor]
        count = min(policy.instances, len(self._lanes))
        if first is None:
            first, self._next_lane = self._next_lane, self._next_lane + count
        return [self._lanes[(first + i) % len(self._lanes)] for i in range(count)]

    def _run(
        self, name: str, number: int, backend: str | None, arrays: Arrays
    ) -> tuple[Arrays, VariantRecord]:
        """In the executor: run a batch on the variant measured fastest at its size. Its
        request routed it a moment ago: the route is at hand without asking the store. Where a
        compiled variant cannot run the batch (sizes it was not built for, compiler.dims, or a
        failure verification did not meet), TorchScript answers, as the upload would; what the
        model itself raises on the inputs is the request's error (ModelRunError, a 400), as in
        Triton."""
        key = (name, number)
        route = self._routes.get(key) or self._draining_routes.get(key) or self.route(name, number)
        batch = route.spec.check(arrays)
        variant, loaded = self.runner(route, batch, backend)
        try:
            return loaded.runner.run(arrays), variant
        except Exception as exc:
            # A pinned backend's refusal of sizes is a 400 that says why; its lack of memory, the host's.
            pinned = backend is not None and (isinstance(exc, OutsideDimsError) or out_of_memory(exc))
            if variant.backend == REFERENCE or pinned:
                fail_request(exc)
            failed = exc
        # TorchScript, the model as uploaded, tells whose failure it was: the inputs' (an index
        # out of range) when it fails too, and then the variant stays in service; else the variant's.
        reference, uploaded = self.runner(route, batch, REFERENCE)
        try:
            outputs = uploaded.runner.run(arrays)
        except Exception as exc:
            fail_request(exc)
        if backend is not None:
            raise failed  # the pinned backend's answer was asked for, and it has none: Kiln's fault
        if not isinstance(failed, OutsideDimsError) and not out_of_memory(failed):
            # Left out as one that fails to load is: not run, and logged, at every batch.
            self._unloadable[variant.id] = time.monotonic() + UNLOADABLE_RETRY_S
            log.warning(
                "%s variant %s failed on a batch that TorchScript runs (%s); TorchScript serves for %.0f s",
                variant.backend,
                variant.id,
                failure(failed),
                UNLOADABLE_RETRY_S,
            )
        return outputs, reference

    def choose(self, variants: list[VariantRecord], batch: int, backend: str | None = None) -> VariantRecord:
        """The variant to serve at this batch size, leaving out those that failed to load
        unless the request pinned their backend."""
        now = time.monotonic()
        usable = [v for v in variants if backend is not None or self._unloadable.get(v.id, 0.0) <= now]
        return choose_variant(usable, self.targets, batch, backend)

    def runner(
        self, route: Route, batch: int, backend: str | None = None, wait: bool = False
    ) -> tuple[VariantRecord, Loaded]:
        """Blocking: the chosen variant, loaded. When another variant of the version is loaded
        already (a faster one just became ready), that one serves while the chosen one loads in
        the background, as Triton keeps a version serving until its successor has loaded: a swap
        never holds up a request; `wait` (a warm-up, which loads every batch size's variant
        itself) waits for the chosen one instead. A compiled variant
        that fails to load (its artifact gone, a runtime this host lacks) is left out for
        UNLOADABLE_RETRY_S and the next best serves, down to TorchScript: one bad artifact must
        not take its model down."""
        while True:
            variant = self.choose(route.variants, batch, backend)
            loaded = self._cached(runner_key(route.version, variant))
            if loaded is not None:
                return variant, loaded
            if backend is not None:
                return variant, self.load(route.version, variant)  # pinned: nothing else may answer
            stand_in = None if wait else self._stand_in(route, batch)
            if stand_in is not None:
                self._load_behind(route, variant)
                return stand_in
            try:
                loaded = self._load_or_leave_out(route.version, variant)
            except (StoreUnavailableError, DeletedError):
                raise  # the store's fault, or the version's, not the variant's
            except Exception:
                if variant.backend == REFERENCE:
                    raise
            else:
                if not wait:
                    self._load_other_sizes_behind(route, variant)
                return variant, loaded

    def _load_other_sizes_behind(self, route: Route, variant: VariantRecord) -> None:
        """After a request waited for a load: the variants that serve the version's other timed
        batch sizes load in the background, so that its first batch of another size finds its
        runner loaded (on a GPU host TVM may serve single requests and TorchScript batches of 8)
        rather than waiting for a second load. Not when the budget is full: that would evict."""
        for size in benchmark_batches(route.spec):
            other = self.choose(route.variants, size)
            with self._lock:
                loaded = runner_key(route.version, other) in self._loaded
            if other.id != variant.id and not loaded and not self.over_budget():
                self._load_behind(route, other)

    def warm(self, name: str) -> list[VariantRecord]:
        """Blocking: load the variants that serve the model's requests at batch 1 and at its
        max batch, and run each WARMUP_RUNS times: TorchScript's profiling executor optimizes a graph only
        after its first calls, and other runtimes allocate on theirs. The model's first
        requests then wait for neither. Returns the variants, one per batch size."""
        with self._lock:
            unloads = self._unloads[name]
        route = self.route(name, None)
        warmed = []
        for batch in benchmark_batches(route.spec):
            variant, loaded = self.runner(route, batch, wait=True)
            warm_up(loaded.runner, route.spec, [batch])
            warmed.append(variant)
        if self._unloads[name] != unloads:  # its runners were not kept
            raise _unloaded(name)
        return warmed

    def over_budget(self) -> bool:
        """Whether the loaded runners fill KILN_RUNTIME_MAX_MB: the next load evicts one."""
        with self._lock:
            return sum(x.size_bytes for x in self._loaded.values()) >= self.settings.runtime_max_mb * MB

    @property
    def evictions(self) -> int:
        """How many runners the budget has evicted in this process."""
        return self._evictions

    def _load_or_leave_out(
        self,
        version: VersionRecord,
        variant: VariantRecord,
        unloads: int | None = None,
        warm_batches: Sequence[int] = (),
    ) -> Loaded:
        try:
            return self.load(version, variant, unloads, warm_batches)
        except (StoreUnavailableError, DeletedError):
            raise
        except Exception as exc:
            if variant.backend != REFERENCE:
                log.error("variant %s failed to load; serving without it: %s", variant.id, exc)
                self._unloadable[variant.id] = time.monotonic() + UNLOADABLE_RETRY_S
            raise

    def _stand_in(self, route: Route, batch: int) -> tuple[VariantRecord, Loaded] | None:
        """The fastest variant of the route's version that is loaded already and no slower than
        TorchScript at this batch size (a stand-in never serves slower than the upload), if any;
        not one benched for failing a batch, which stays loaded."""
        candidates = []
        now = time.monotonic()
        for v in serving_group(servable(route.variants, self.targets)):
            ratio = cost_ratio(v, batch)
            if ratio is not None and ratio <= 1 and self._unloadable.get(v.id, 0.0) <= now:
                with self._lock:  # looked at, not touched: only the one that serves is used
                    if runner_key(route.version, v) in self._loaded:
                        candidates.append((ratio, v))
        if not candidates:
            return None
        _, variant = min(candidates, key=lambda candidate: candidate[0])
        loaded = self._cached(runner_key(route.version, variant))
        return None if loaded is None else (variant, loaded)

    def _load_behind(self, route: Route, variant: VariantRecord) -> None:
        version = route.version
        key = runner_key(version, variant)
        now = time.monotonic()
        with self._lock:
            if now - self._loaded_behind_at.get(key, -LOAD_BEHIND_EVERY_S) < LOAD_BEHIND_EVERY_S:
                return  # loading, or loaded a while ago and evicted since: the stand-in serves
            self._loaded_behind_at[key] = now
            unloads = self._unloads[version.name]
        # Nobody waits for this load, so it also takes the runner's first calls at the sizes it
        # will serve (TorchScript's profiling runs, cuDNN's first calls at a new shape) before
        # any request can reach it.
        sizes = [b for b in benchmark_batches(route.spec) if self.choose(route.variants, b).id == variant.id]

        def load() -> None:
            try:  # not kept if the model was unloaded since the request that asked for it
                self._load_or_leave_out(version, variant, unloads, sizes)
            except Exception as exc:  # a compiled variant's failure is logged where it is left out
                if variant.backend == REFERENCE or isinstance(exc, StoreUnavailableError):
                    log.warning("background load of variant %s failed: %s", variant.id, exc)

        with contextlib.suppress(RuntimeError):  # the runtime is closing: the stand-in serves
            self._load_pool.submit(contextvars.copy_context().run, load)  # log lines keep the request id

    def _cached(self, key: str) -> Loaded | None:
        with self._lock:
            loaded = self._loaded.get(key)
            if loaded is not None:
                self._loaded.move_to_end(key)
            return loaded

    def load(
        self,
        version: VersionRecord,
        variant: VariantRecord,
        unloads: int | None = None,
        warm_batches: Sequence[int] = (),
    ) -> Loaded:
        """Blocking: load a variant's runner once, however many requests ask at the same time,
        and warm it up at `warm_batches` before any request can use it. The runner is used but
        not kept when its model was unloaded or deleted, or the runtime closed, since `unloads`
        (the model's count of unloads when the caller chose it; by default, when this load
        began): it must not outlive them in memory. Nor is one that an unload's requests still
        running began or ended among: those are the last it serves."""
        key = runner_key(version, variant)
        self.stats.start(version.name, version.version)
        ours = (version.name, version.version)
        with self._lock:
            loading = self._loading.setdefault(key, threading.Lock())
            unloads = self._unloads[version.name] if unloads is None else unloads
            draining = self._draining_out(*ours)
        evicted: list[weakref.ref[Runner]] = []
        kept = False
        try:
            with loading:
                loaded = self._cached(key)
                if loaded is None:
                    loaded = self._load(version, variant)
                    warm_up(loaded.runner, version.spec(), warm_batches)
                    with self._lock:
                        kept = (
                            not self._closed
                            and self._unloads[version.name] == unloads
                            and not self.stats.deleted(version.name, version.version)
                            and not draining
                            and not self._draining_out(*ours)
                        )
                        if kept:
                            self._loaded[key] = loaded
                            evicted = self._evict_over_budget()
                            self._publish_loaded()
        finally:
            with self._lock:
                self._loading.pop(key, None)
        if evicted:
            release_memory(evicted)
        elif kept:
            freeze_heap()  # the new runner's objects too
        return loaded

    def _load(self, version: VersionRecord, variant: VariantRecord) -> Loaded:
        started = time.perf_counter()
        store = self.registry.store
        try:
            if variant.artifact_key is None:
                payload = store.get_blob(MODEL_BLOB.format(sha256=version.sha256))
                artifact = Artifact(variant.backend, ANY_TARGET, version.spec(), payload)
            else:
                artifact = Artifact.unpack(store.get_blob(ARTIFACT_BLOB.format(key=variant.artifact_key)))
        except BlobNotFoundError:
            # Routed before its version's deletion (by another process, within KILN_ROUTE_TTL_S),
            # which collected its bytes: a 404, as for any request that a deletion overtakes.
            if version.version not in self.registry.version_numbers(version.name):
                raise deleted_error(version.name, version.version) from None
            raise
        try:
            runner = load_artifact(artifact)
        except CompilerError as exc:
            if variant.artifact_key is not None:
                raise  # a compiled variant: left out, and the next best serves
            # Bytes that loaded at upload: the store's fault, not the request's (a 400 said so).
            raise KilnError(
                f"the stored TorchScript of {version.name!r} version {version.version} no longer "
                f"loads ({exc}); upload the model again"
            ) from exc
        if version.config.output_names:
            runner = Renamed(runner, version.config.output_names)
        log.info(
            "loaded %s variant %s of %s v%d in %.2f s",
            variant.backend,
            variant.id,
            version.name,
            version.version,
            time.perf_counter() - started,
        )
        return Loaded(runner, version.name, version.version, len(artifact.payload))

    def _evict_over_budget(self) -> list[weakref.ref[Runner]]:
        """Evict least recently used runners until the budget holds; the newest always stays.
        Returns weak references to those that went; the caller then releases their memory,
        outside the lock."""
        budget = self.settings.runtime_max_mb * MB
        evicted = []
        while len(self._loaded) > 1 and sum(x.size_bytes for x in self._loaded.values()) > budget:
            key, gone = self._loaded.popitem(last=False)
            log.info("evicted runner %s of %s (%.1f MB)", key, gone.model, gone.size_bytes / MB)
            evicted.append(weakref.ref(gone.runner))
        self._evictions += len(evicted)
        return evicted

    def unload(self, name: str, version: int | None = None) -> None:
        """Take a model, or one of its versions, out of service in this process (deleted, or
        unloaded): new requests no longer find it, those already in run to their answer (see
        Batcher.drain, UNLOAD_DRAIN_S), and then its runners go."""

        def gone(model: str, number: int) -> bool:
            return model == name and version in (None, number)

        with self._lock:
            self._generations[name] += 1  # refreshes in flight now keep nothing they read
            if version is None:  # loads in flight are not kept (a deleted version's: Stats.deleted)
                self._unloads[name] += 1
                self._reloads_at_unload[name] = self._reloads[name]
        self._responses.drop(name, version)  # its answers go with its runners
        routes = {}
        # Copies: requests on the event loop may add entries meanwhile.
        for route_key, route in list(self._routes.items()):
            if gone(route_key[0], route.version.version):
                self._routes.pop(route_key, None)
                routes[(name, route.version.version)] = route
        batchers = {}
        for model, number, backend in [k for k in list(self._batchers) if gone(k[0], k[1])]:
            batcher = self._batchers.pop((model, number, backend), None)  # None: a concurrent unload took it
            if batcher is not None:
                batchers[batcher] = (model, number)
        with self._lock:
            self._draining_routes.update(routes)
            self._draining.update(batchers)
        release = partial(self._release, name, version, routes, [*batchers])
        drains = [batcher.drain(UNLOAD_DRAIN_S) for batcher in batchers]
        # A batcher with no request in is drained at once, on the event loop: then the runners
        # go before this returns (unless this runs on the event loop, which must not wait).
        idle = [drain for drain, batcher in zip(drains, batchers, strict=True) if not batcher.pending]
        if idle and not on_event_loop():
            wait(idle, timeout=IDLE_DRAIN_WAIT_S)
        if all(drain.done() for drain in drains):
            release()
            return

        def release_once_drained() -> None:  # off the event loop, as freeing memory collects garbage
            wait(drains)
            release()

        threading.Thread(target=release_once_drained, name="kiln-release", daemon=True).start()

    def _draining_out(self, name: str, number: int) -> bool:
        """Under the lock: whether an unload's requests still run on this version's runners,
        the last it serves (a deleted version, or a model not loaded again since)."""
        if (name, number) not in self._draining.values():
            return False
        return self.stats.deleted(name, number) or self._reloads[name] == self._reloads_at_unload.get(name)

    def _release(
        self,
        name: str,
        version: int | None,
        routes: dict[tuple[str, int], Route],
        batchers: list[Batcher[VariantRecord]],
    ) -> None:
        """Once an unload's requests are answered, its runners go (those loaded while they ran
        too), and the memory they held: not those that another unload's requests still run on,
        which go with those; nor, for a model, once it was loaded again since its latest unload
        (it serves on them). A deleted version never serves again."""
        self._responses.drop(name, version)  # what its requests answered meanwhile
        with self._lock:
            for batcher in batchers:
                self._draining.pop(batcher, None)
            for route_key, route in routes.items():
                if self._draining_routes.get(route_key) is route:
                    del self._draining_routes[route_key]
            busy = set(self._draining.values())
            going = []
            if version is not None or self._reloads[name] == self._reloads_at_unload.get(name):
                going = [
                    key
                    for key, loaded in self._loaded.items()
                    if loaded.model == name
                    and version in (None, loaded.version)
                    and (loaded.model, loaded.version) not in busy
                ]
            dropped = [weakref.ref(self._loaded.pop(key).runner) for key in going]
            if going:
                self._publish_loaded()
        if going:
            release_memory(dropped)

    @property
    def loaded_runners(self) -> int:
        return len(self._loaded)

    def _publish_loaded(self) -> None:
        """Called under the lock on every change: a gauge read at scrape time would miss the
        other uvicorn workers' runners in multiprocess mode."""
        metrics.LOADED_RUNNERS.set(len(self._loaded))
        metrics.LOADED_BYTES.set(sum(x.size_bytes for x in self._loaded.values()))

    def close(self) -> None:
        with self._lock:
            draining = list(self._draining)
        for batcher in [*self._batchers.values(), *draining]:
            batcher.close()
        self._batchers.clear()
        with self._lock:
            self._closed = True
            self._loaded.clear()
            self._publish_loaded()
        for executor in (self._executor, *self._lanes):
            executor.shutdown(wait=False, cancel_futures=True)
        self._route_pool.shutdown(wait=False, cancel_futures=True)
        self._load_pool.shutdown(wait=False, cancel_futures=True)
        self._request_load_pool.shutdown(wait=False, cancel_futures=True)


def on_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def fail_request(exc: Exception) -> NoReturn:
    """Raise what the model raised on a request's inputs as the request's error (a 400); Kiln's
    own errors (a pinned variant's refusal of sizes, a 400 too), and the host's lack of memory,
    as they are."""
    if isinstance(exc, CompilerError) or out_of_memory(exc):
        raise exc
    raise ModelRunError(f"the model failed on these inputs: {failure(exc)}") from exc


def out_of_memory(exc: BaseException) -> bool:
    """The host's fault, not the request's: torch raises RuntimeError when its allocator fails."""
    return isinstance(exc, MemoryError | torch.OutOfMemoryError) or "can't allocate memory" in str(exc)


def effective_timeout(requested_us: int | None, default_us: int | None) -> int | None:
    """As Triton's queue policy: a request's own timeout counts when it is set (not 0) and
    shorter than the model's default; a request cannot wait longer than its model allows."""
    if not requested_us:
        return default_us
    return requested_us if default_us is None else min(requested_us, default_us)


def runner_key(version: VersionRecord, variant: VariantRecord) -> str:
    """Per model version: two names sharing an artifact may batch differently."""
    artifact = variant.artifact_key or f"torchscript:{version.sha256}"
    return f"{version.name}/{version.version}/{artifact}"
