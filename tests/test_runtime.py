"""The runtime runs each batch on the variant measured fastest at the batch's own size, and its
heap stays out of the collector's way without keeping evicted runners alive.

A real registry on the embedded store, a real ONNX Runtime artifact and the real TorchScript
file; only the latency tables are set by hand, so that which variant wins at which size is known.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anyio
import numpy as np
import pytest
import torch
from prometheus_client import REGISTRY
from starlette.concurrency import run_in_threadpool

from compiler.artifact import Artifact
from compiler.backends import get_backend
from compiler.errors import CompilerError, ModelRunError
from compiler.runner import Runner
from compiler.spec import InputSpec
from service.errors import (
    ConflictError,
    DeletedError,
    KilnError,
    QueueFullError,
    TimeoutExpiredError,
    UnavailableError,
)
from service.memory import YOUNG_COLLECTION_ALLOCATIONS, collect_young_less_often, freeze_heap, release_memory
from service.registry import MODEL_BLOB, ModelView, Registry
from service.runtime import Prediction, Runtime
from service.settings import Settings
from service.store.local import LocalStore
from tests.models import MODELS
from tests.registries import ready_version, reference

HOST = "cpu-x86_64-test-avx2"
MLP = MODELS["mlp"]
BASELINE = {1: 1.0, 8: 8.0}  # TorchScript, timed in the same run as each variant


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[Runtime]:
    """Model `mlp` v1: TorchScript, and ONNX Runtime measured slower at batch 1 and faster at 8."""
    pytest.importorskip("onnxruntime")
    registry = Registry(LocalStore(tmp_path / "store"))
    spec = InputSpec.from_dicts(MLP.inputs, 8)
    ort = get_backend("onnxruntime").compile(MLP.torchscript(), spec, HOST, {"threads": 1}).pack()
    variants = {"torchscript": reference(BASELINE), "onnxruntime": (HOST, ort, {1: 2.0, 8: 4.0})}
    ready_version(registry, MLP, variants, BASELINE, max_batch_size=8, max_queue_delay_us=200_000)
    rt = Runtime(registry, Settings(data_dir=tmp_path, targets=[HOST]))
    yield rt
    rt.close()


def expected(x: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        out: np.ndarray = MLP.module()(torch.from_numpy(x)).numpy()
    return out


def test_each_batch_runs_on_the_variant_fastest_at_its_size(runtime: Runtime) -> None:
    xs = [np.random.default_rng(i).standard_normal((1, 64)).astype(np.float32) for i in range(8)]
    route = runtime.route("mlp", None)
    for variant in route.variants:  # loaded beforehand: until then, a loaded one stands in
        runtime.load(route.version, variant)

    async def main() -> tuple[list[Prediction], Prediction]:
        merged = await asyncio.gather(*(runtime.predict("mlp", None, {"x": x}) for x in xs))
        alone = await runtime.predict("mlp", None, {"x": xs[0]})
        return list(merged), alone

    merged, alone = asyncio.run(main())
    [stats] = runtime.stats.doc("mlp")
    assert [b["batch_size"] for b in stats["batch_stats"]] == [1, 8]
    # Eight requests of batch 1 waited for each other and ran as one batch of 8: ONNX Runtime's.
    assert {p.variant.backend for p in merged} == {"onnxruntime"}
    # One request alone is a batch of 1, where TorchScript was measured faster.
    assert alone.variant.backend == "torchscript"
    for x, p in zip(xs, merged, strict=True):
        np.testing.assert_allclose(p.outputs["output0"], expected(x), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(alone.outputs["output0"], expected(xs[0]), rtol=1e-5, atol=1e-6)


def test_a_pinned_backend_runs_every_batch_size(runtime: Runtime) -> None:
    x = np.ones((1, 64), np.float32)
    pinned = asyncio.run(runtime.predict("mlp", None, {"x": x}, backend="onnxruntime"))
    assert pinned.variant.backend == "onnxruntime"
    np.testing.assert_allclose(pinned.outputs["output0"], expected(x), rtol=1e-4, atol=1e-5)


def test_released_memory_includes_cycles_frozen_out_of_the_collector() -> None:
    """The serving heap is frozen (gc.freeze) to keep full collections short; an eviction must
    still free a runner whose objects form a reference cycle."""

    class Node:
        pass

    a, b = Node(), Node()
    a.other, b.other = b, a  # type: ignore[attr-defined]
    alive = weakref.ref(a)
    freeze_heap()
    assert gc.get_freeze_count() > 0
    del a, b
    gc.collect()
    assert alive() is not None  # frozen: an ordinary collection does not see the cycle
    release_memory()
    assert alive() is None
    assert gc.get_freeze_count() > 0  # and what is still alive is frozen again


def test_young_collections_run_less_often_and_still_free_cycles() -> None:
    before = gc.get_threshold()
    try:
        collect_young_less_often()
        assert gc.get_threshold() == (YOUNG_COLLECTION_ALLOCATIONS, *before[1:])

        class Node:
            pass

        a, b = Node(), Node()
        a.other, b.other = b, a  # type: ignore[attr-defined]
        alive = weakref.ref(a)
        del a, b
        gc.collect(0)
        assert alive() is None
    finally:
        gc.set_threshold(*before)


def test_a_variant_that_fails_to_load_gives_way_to_the_next_best(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """ONNX Runtime is measured fastest, but its artifact does not load here: TorchScript serves,
    and the broken variant is left out instead of failing every request."""
    registry = Registry(LocalStore(tmp_path / "store"))
    broken = (HOST, b"not an artifact", {1: 0.5, 8: 4.0})
    variants = {"torchscript": reference(BASELINE), "onnxruntime": broken}
    ready_version(registry, MLP, variants, BASELINE, max_batch_size=8)
    rt = Runtime(registry, Settings(data_dir=tmp_path, targets=[HOST]))
    x = np.ones((2, 64), np.float32)

    async def main() -> list[Prediction]:
        # The second request skips the broken variant without trying it again.
        served = [await rt.predict("mlp", None, {"x": x}) for _ in range(2)]
        with pytest.raises(CompilerError, match="not a Kiln artifact"):  # pinned: nothing else may answer
            await rt.predict("mlp", None, {"x": x}, backend="onnxruntime")
        return served

    try:
        for served in asyncio.run(main()):
            assert served.variant.backend == "torchscript"
            np.testing.assert_allclose(served.outputs["output0"], expected(x), rtol=1e-5, atol=1e-6)
        assert rt.choose(rt.route("mlp", None).variants, batch=1).backend == "torchscript"
        # One try for the two requests: the second skipped the variant that had failed.
        failures = [r for r in caplog.records if "failed to load" in r.getMessage()]
        assert len(failures) == 1, failures
    finally:
        rt.close()


def test_a_refresh_that_read_a_model_before_it_was_unloaded_keeps_nothing(runtime: Runtime) -> None:
    """A deletion unloads the model while a refresh may be reading it from the store: that read
    must not put the deleted model's route back."""
    key = ("mlp", None)
    before_unload = runtime._generations["mlp"]  # what a refresh started now would carry
    runtime.unload("mlp")
    route = runtime._fetch_route(key, before_unload)  # the store still had it when it read
    assert route.version.version == 1
    assert key not in runtime._routes and ("mlp", 1) not in runtime._routes
    assert runtime.route("mlp", None).version.version == 1  # a fresh read is kept
    assert key in runtime._routes


def test_a_load_is_neither_joined_nor_undone_by_a_refresh_that_read_the_model_unloaded(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Requests keep coming while an operator loads a model again: a refresh that read it still
    unloaded must not answer the load's own route with 409, nor then free the runner it loaded."""
    registry = runtime.registry
    registry.set_unloaded("mlp", True)
    read, release = threading.Event(), threading.Event()
    get_model = registry.get_model

    def held_after_reading(name: str) -> ModelView:
        view = get_model(name)
        if not read.is_set():
            read.set()
            release.wait(10)
        return view

    monkeypatch.setattr(registry, "get_model", held_after_reading)
    with ThreadPoolExecutor(1) as pool:
        stale = pool.submit(runtime.route, "mlp", None)
        assert read.wait(10)
        registry.set_unloaded("mlp", False)  # what POST .../load does
        runtime.reroute("mlp")
        route = runtime.route("mlp", None)
        runtime.runner(route, 1, wait=True)  # this runner alone: ONNX Runtime does not load behind
        release.set()
        with pytest.raises(ConflictError, match="unloaded"):
            stale.result(10)  # it read the model unloaded, and says so to its own request
    assert runtime.loaded_runners == 1
    assert runtime.route("mlp", None).version.version == 1


def test_an_unloaded_model_is_refused_without_asking_the_store_each_time(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime.registry.set_unloaded("mlp", True)
    with pytest.raises(ConflictError, match=r"POST /v2/repository/models/mlp/load"):
        runtime.route("mlp", None)
    monkeypatch.setattr(runtime.registry, "get_model", lambda name: pytest.fail("asked the store"))
    for version in (None, 1):
        with pytest.raises(ConflictError):
            runtime.route("mlp", version)


class SlowToLoad:
    """A backend that takes `seconds` to load, and counts its loads and the batch sizes its
    runners are called with, and what `observe()` said at each call."""

    def __init__(self, name: str, seconds: float, observe: Callable[[], object] | None) -> None:
        self.backend = get_backend(name)
        self.seconds = seconds
        self.observe = observe
        self.calls: list[int] = []
        self.observed: list[object] = []
        self.loads = 0

    def load(self, artifact: Artifact) -> Runner:
        self.loads += 1
        time.sleep(self.seconds)
        runner = self.backend.load(artifact)
        real_run = runner.run

        def run(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
            self.calls.append(len(inputs["x"]))
            if self.observe is not None:
                self.observed.append(self.observe())
            return real_run(inputs)

        runner.run = run  # type: ignore[method-assign]
        return runner


def slow_onnxruntime(
    monkeypatch: pytest.MonkeyPatch, seconds: float, observe: Callable[[], object] | None = None
) -> SlowToLoad:
    slow = SlowToLoad("onnxruntime", seconds, observe)
    real = get_backend
    monkeypatch.setattr(
        "compiler.backends.get_backend", lambda name: slow if name == "onnxruntime" else real(name)
    )
    return slow


def test_a_faster_variant_loads_behind_the_one_serving(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ONNX Runtime is the faster at batch 8 but is not loaded yet: TorchScript, loaded, answers
    at once while ONNX Runtime loads in the background (once, however many batches ask), and
    serves once it has loaded, warmed up before any batch could reach it."""
    slow = slow_onnxruntime(monkeypatch, 2.0, lambda: runtime.loaded_runners)
    x8 = np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)

    async def main() -> tuple[Prediction, Prediction, float, Prediction]:
        first = await runtime.predict("mlp", None, {"x": x8[:1]})  # loads TorchScript
        began = time.monotonic()
        stood_in = await runtime.predict("mlp", None, {"x": x8})
        await runtime.predict("mlp", None, {"x": x8})  # asks for ONNX Runtime again
        waited = time.monotonic() - began
        deadline = time.monotonic() + 30
        while runtime.loaded_runners < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return first, stood_in, waited, await runtime.predict("mlp", None, {"x": x8})

    first, stood_in, waited, swapped = asyncio.run(main())
    assert first.variant.backend == "torchscript"
    assert waited < 1.0  # neither waited for the 2 s load
    assert slow.loads == 1
    assert stood_in.variant.backend == "torchscript"
    np.testing.assert_allclose(stood_in.outputs["output0"], expected(x8), rtol=1e-4, atol=1e-5)
    assert swapped.variant.backend == "onnxruntime"  # once loaded in the background
    np.testing.assert_allclose(swapped.outputs["output0"], expected(x8), rtol=1e-4, atol=1e-5)
    # WARMUP_RUNS at batch 8, the size it serves, while only TorchScript was in service; then
    # the swapped-in batch.
    assert (slow.calls, slow.observed) == ([8, 8, 8], [1, 1, 2])


def test_a_request_waiting_for_its_runner_to_load_is_pending(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Triton's pending count includes a request that waits for its model's runner to load, so
    that an autoscaler reading it sees the requests a cold replica holds: it counts from the
    start of the 2 s load, not from the queue that follows."""
    slow_onnxruntime(monkeypatch, 2.0)
    x = np.random.default_rng(0).standard_normal((2, 64)).astype(np.float32)

    def pending() -> float | None:
        labels = {"model": "mlp", "version": "1"}
        return REGISTRY.get_sample_value("nv_inference_pending_request_count", labels)

    async def main() -> float:
        began = time.monotonic()
        request = asyncio.create_task(runtime.predict("mlp", None, {"x": x}, backend="onnxruntime"))
        while not pending() and not request.done():
            await asyncio.sleep(0.02)
        counted = time.monotonic() - began
        await request
        return counted

    assert asyncio.run(main()) < 1.5
    assert pending() == 0


def test_a_first_load_loads_the_other_batch_size_variant_behind(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first request, at batch 1, waits for TorchScript; ONNX Runtime, which serves batch 8,
    then loads in the background without a batch of 8 asking, so the first one finds it loaded
    and warmed up."""
    slow = slow_onnxruntime(monkeypatch, 0.5, lambda: runtime.loaded_runners)
    x8 = np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)

    async def main() -> tuple[Prediction, Prediction]:
        first = await runtime.predict("mlp", None, {"x": x8[:1]})
        deadline = time.monotonic() + 10
        while runtime.loaded_runners < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return first, await runtime.predict("mlp", None, {"x": x8})

    first, batched = asyncio.run(main())
    assert first.variant.backend == "torchscript"
    # Loaded once, warmed up (WARMUP_RUNS) before it was in service, then run for the batch of 8.
    assert (slow.loads, slow.calls, slow.observed) == (1, [8, 8, 8], [1, 1, 2])
    assert batched.variant.backend == "onnxruntime"
    np.testing.assert_allclose(batched.outputs["output0"], expected(x8), rtol=1e-4, atol=1e-5)


def test_requests_waiting_for_a_load_count_against_max_queue_size(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A cold model's burst, with max_queue_size 3: the requests past it are refused (503) at
    once, not held until the 1.5 s load ends; one whose timeout passes while it waits for the
    load is answered then; the runner loads once, and answers the two left."""
    slow = slow_onnxruntime(monkeypatch, 1.5)
    strict = Runtime(runtime.registry, Settings(data_dir=tmp_path, targets=[HOST], max_queue_size=3))
    strict.route("mlp", None)  # routed: each request below reaches its batcher in turn
    x = np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)

    async def main() -> tuple[list[BaseException | Prediction], float, float, list[Prediction]]:
        began = time.monotonic()

        def ask(timeout_us: int | None = None) -> asyncio.Task[Prediction]:
            return asyncio.create_task(strict.predict("mlp", None, {"x": x}, "onnxruntime", timeout_us))

        admitted = [ask(), ask()]
        expiring = ask(200_000)
        refused = await asyncio.gather(*(ask() for _ in range(10)), return_exceptions=True)
        refused_in = time.monotonic() - began
        with pytest.raises(TimeoutExpiredError):
            await expiring
        return refused, refused_in, time.monotonic() - began, list(await asyncio.gather(*admitted))

    try:
        refused, refused_in, expired_in, answered = asyncio.run(main())
    finally:
        strict.close()
    assert all(isinstance(r, QueueFullError) for r in refused), refused
    assert refused_in < 0.5
    assert 0.15 < expired_in < 1.0
    assert slow.loads == 1
    for prediction in answered:
        assert prediction.variant.backend == "onnxruntime"
        np.testing.assert_allclose(prediction.outputs["output0"], expected(x), rtol=1e-4, atol=1e-5)


def test_requests_waiting_for_a_load_hold_no_thread(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sixty requests arrive while their runner loads (1.5 s): it loads once, on one thread, and
    the others wait for it without a thread each; AnyIO's threadpool (40 threads), which routes
    share (another model's config reads the store on it), still answers at once meanwhile."""
    slow = slow_onnxruntime(monkeypatch, 1.5)
    runtime.route("mlp", None)
    x = np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)

    async def main() -> tuple[float, list[Prediction]]:
        asked = [
            asyncio.create_task(runtime.predict("mlp", None, {"x": x}, backend="onnxruntime"))
            for _ in range(60)
        ]
        await asyncio.sleep(0.2)  # all wait for the load
        began = time.monotonic()
        await run_in_threadpool(time.monotonic)
        return time.monotonic() - began, list(await asyncio.gather(*asked))

    threadpool_in, answered = asyncio.run(main())
    assert threadpool_in < 0.5
    assert slow.loads == 1
    assert all(p.variant.backend == "onnxruntime" for p in answered)


def test_a_failed_load_fails_every_request_waiting_for_it_and_the_next_tries_again(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The requests that waited for a load that failed all get its error, without each trying
    the load again in turn; a request after them loads the runner afresh."""
    slow = slow_onnxruntime(monkeypatch, 0.5)
    loads = slow.load

    def fails_first(artifact: Artifact) -> Runner:
        if slow.loads:
            return loads(artifact)
        slow.loads += 1
        time.sleep(0.5)
        raise RuntimeError("the device ran out of memory")

    monkeypatch.setattr(slow, "load", fails_first)
    x = np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)

    async def main() -> tuple[list[BaseException | Prediction], Prediction]:
        asked = (runtime.predict("mlp", None, {"x": x}, backend="onnxruntime") for _ in range(5))
        failed = await asyncio.gather(*asked, return_exceptions=True)
        return failed, await runtime.predict("mlp", None, {"x": x}, backend="onnxruntime")

    failed, answered = asyncio.run(main())
    assert all(isinstance(f, RuntimeError) and "ran out of memory" in str(f) for f in failed), failed
    assert slow.loads == 2
    assert answered.variant.backend == "onnxruntime"


def test_a_variant_slower_than_torchscript_never_stands_in(runtime: Runtime) -> None:
    """ONNX Runtime is loaded and TorchScript is not, but at batch 1 ONNX Runtime was measured
    slower: TorchScript loads and serves, the upload's own speed being the floor."""
    route = runtime.route("mlp", None)
    [ort] = [v for v in route.variants if v.backend == "onnxruntime"]
    runtime.load(route.version, ort)
    x = np.ones((1, 64), np.float32)
    served = asyncio.run(runtime.predict("mlp", None, {"x": x}))
    assert served.variant.backend == "torchscript"
    assert runtime.loaded_runners == 2


def test_a_benched_variant_never_stands_in(runtime: Runtime) -> None:
    """ONNX Runtime, loaded and fastest at batch 8, failed a batch that TorchScript ran: benched,
    it stays loaded, and it stood in while TorchScript loaded, failing again."""
    route = runtime.route("mlp", None)
    [ort] = [v for v in route.variants if v.backend == "onnxruntime"]
    runtime.load(route.version, ort)
    runtime._unloadable[ort.id] = time.monotonic() + 60  # as a failed batch benches it
    x8 = np.ones((8, 64), np.float32)
    served = asyncio.run(runtime.predict("mlp", None, {"x": x8}))
    assert served.variant.backend == "torchscript"


def test_each_batching_model_runs_its_batches_on_one_thread(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two batchers of one version (unpinned, and ONNX Runtime pinned) with requests in flight
    at once: each runs every batch on one thread of its own, where torch keeps its thread team."""
    threads: dict[str, set[int]] = {"torchscript": set(), "onnxruntime": set()}
    real = get_backend

    class Tracing:
        def __init__(self, name: str) -> None:
            self.backend = real(name)

        def load(self, artifact: Artifact) -> Runner:
            runner = self.backend.load(artifact)
            run, name = runner.run, runner.backend

            def traced(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
                threads[name].add(threading.get_ident())
                return run(inputs)

            runner.run = traced  # type: ignore[method-assign]
            return runner

    monkeypatch.setattr("compiler.backends.get_backend", Tracing)
    x = np.ones((1, 64), np.float32)

    async def main() -> None:
        for _ in range(20):
            await asyncio.gather(
                runtime.predict("mlp", None, {"x": x}), runtime.predict("mlp", None, {"x": x}, "onnxruntime")
            )

    asyncio.run(main())
    assert len(threads["torchscript"]) == 1 and len(threads["onnxruntime"]) == 1, threads
    assert threads["torchscript"] != threads["onnxruntime"]


def test_a_warm_up_loads_and_runs_the_variant_of_each_batch_size(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TorchScript serves batch 1 and ONNX Runtime batch 8. With TorchScript loaded, a request at
    batch 8 would be answered by it while ONNX Runtime loads behind; a warm-up waits for ONNX
    Runtime and runs it, at batch 8, before it returns."""
    slow = slow_onnxruntime(monkeypatch, 0.5)
    route = runtime.route("mlp", None)
    runtime.load(route.version, next(v for v in route.variants if v.backend == "torchscript"))
    warmed = runtime.warm("mlp")
    assert [v.backend for v in warmed] == ["torchscript", "onnxruntime"]
    assert slow.loads == 1
    assert slow.calls == [8, 8]  # WARMUP_RUNS
    assert runtime.loaded_runners == 2


def test_a_runner_loaded_across_an_unload_is_not_kept(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unload (or a deletion) while a runner loads: the warm-up says the model is unloaded,
    and the runner it loaded does not stay in memory."""
    slow = slow_onnxruntime(monkeypatch, 1.0)
    with ThreadPoolExecutor(1) as pool:
        warming = pool.submit(runtime.warm, "mlp")
        deadline = time.monotonic() + 10
        while slow.loads == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        runtime.unload("mlp")
        with pytest.raises(ConflictError, match="unloaded"):
            warming.result(30)
    assert slow.loads == 1
    assert runtime.loaded_runners == 0


def test_a_version_deleted_while_its_runner_loads_fails_its_requests(runtime: Runtime) -> None:
    """Once this process forgot the version (Stats.forget, as its sweep does when the store lost
    it), a compiled variant's load fails the request as deleted, rather than being left out for
    the next variant over and over; and a request not yet loading fails at once."""
    route = runtime.route("mlp", None)
    runtime.stats.forget("mlp", held={1}, stored=set())
    with pytest.raises(DeletedError, match="version 1 of 'mlp' was deleted"):
        runtime.runner(route, 8, wait=True)  # ONNX Runtime's batch size
    with pytest.raises(DeletedError):
        asyncio.run(runtime.predict("mlp", None, {"x": np.ones((1, 64), np.float32)}))
    assert runtime.loaded_runners == 0 and runtime.stats.doc("mlp") == []


def test_a_version_deleted_by_another_process_after_routing_is_a_404(runtime: Runtime) -> None:
    """Another process deleted the version, and collected its bytes, within this process's
    KILN_ROUTE_TTL_S: the load finds no bytes, and the request is answered as deleted (404),
    not with the store's BlobNotFoundError (500)."""
    route = runtime.route("mlp", None)
    runtime.registry.delete_model("mlp")  # as another process does: this one is not told
    with pytest.raises(DeletedError, match="version 1 of 'mlp' was deleted"):
        runtime.runner(route, 1, wait=True)


def test_serving_settings_changed_here_reach_the_batcher_at_once(runtime: Runtime) -> None:
    """A PATCH this process answers: the requests that come before its route's next read, which
    the first of them starts and the others do not wait for, already queue under the new policy."""
    asyncio.run(runtime.predict("mlp", None, {"x": np.ones((1, 64), np.float32)}))
    [batcher] = runtime._batchers.values()
    record = runtime.registry.update_serving("mlp", 1, {"max_queue_size": 3})
    runtime.reconfigure("mlp", record)
    assert batcher.policy.max_queue_size == 3


def test_serving_settings_changed_on_another_replica_reach_the_batcher(runtime: Runtime) -> None:
    """A PATCH on another replica changes the version in the store; this process's batcher takes
    the new policy when the route is next read, with no request lost or rerouted."""
    asyncio.run(runtime.predict("mlp", None, {"x": np.ones((1, 64), np.float32)}))
    [batcher] = runtime._batchers.values()
    assert (batcher.policy.max_queue_delay_us, batcher.policy.max_queue_size) == (200_000, 1024)
    runtime.registry.update_serving("mlp", 1, {"max_queue_delay_us": 0, "max_queue_size": 3})
    # The refresh that a request starts once its route is a TTL old.
    runtime._fetch_route(("mlp", None), runtime._generations["mlp"])
    assert (batcher.policy.max_queue_delay_us, batcher.policy.max_queue_size) == (0, 3)
    assert runtime._batchers == {("mlp", 1, None): batcher}
    # More instances: as many lanes, its first one kept; fewer again: the first one alone.
    [lane] = batcher.lanes
    runtime.registry.update_serving("mlp", 1, {"instances": 2})  # of KILN_INFERENCE_WORKERS (4)
    runtime._fetch_route(("mlp", None), runtime._generations["mlp"])
    assert len(set(batcher.lanes)) == 2 and batcher.lanes[0] is lane
    runtime.registry.update_serving("mlp", 1, {"instances": 1})
    runtime._fetch_route(("mlp", None), runtime._generations["mlp"])
    assert batcher.lanes == [lane]


Failure = Callable[[str, Mapping[str, np.ndarray]], str | None]


def failing(monkeypatch: pytest.MonkeyPatch, fails: Failure) -> list[str]:
    """Runners that raise RuntimeError(message) where `fails(backend, inputs)` gives a message;
    returns the backends of the runs, as they come."""
    real = get_backend
    runs: list[str] = []

    class Failing:
        def __init__(self, name: str) -> None:
            self.backend = real(name)

        def load(self, artifact: Artifact) -> Runner:
            runner = self.backend.load(artifact)
            inner = runner.run

            def run(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
                runs.append(runner.backend)
                message = fails(runner.backend, inputs)
                if message is not None:
                    raise RuntimeError(message)
                return inner(inputs)

            runner.run = run  # type: ignore[method-assign]
            return runner

    monkeypatch.setattr("compiler.backends.get_backend", Failing)
    return runs


def test_a_variant_that_fails_on_a_batch_gives_way_to_torchscript(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """ONNX Runtime serves batches of 8 until one fails in it that TorchScript runs: TorchScript
    answers that batch, and the next ones, without the variant being run and logged at each. A
    request that pins the failing backend gets its failure, Kiln's (a 500), not TorchScript's answer."""
    runs = failing(
        monkeypatch, lambda backend, _: "a kernel this build got wrong" if backend == "onnxruntime" else None
    )
    x = np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)
    served = [asyncio.run(runtime.predict("mlp", None, {"x": x})) for _ in range(3)]
    assert [p.variant.backend for p in served] == ["torchscript"] * 3
    for prediction in served:
        np.testing.assert_allclose(prediction.outputs["output0"], expected(x), rtol=1e-5, atol=1e-6)
    assert runs.count("onnxruntime") == 1
    assert len([r for r in caplog.records if "failed on a batch" in r.getMessage()]) == 1
    with pytest.raises(RuntimeError, match="a kernel this build got wrong"):
        asyncio.run(runtime.predict("mlp", None, {"x": x}, backend="onnxruntime"))


async def in_batchers(runtime: Runtime, count: int) -> None:
    """Wait until `count` requests are in the model's batchers (and so past their route)."""
    deadline = time.monotonic() + 30
    while sum(b.pending for b in runtime._batchers.values()) < count and time.monotonic() < deadline:
        await asyncio.sleep(0.01)


def test_an_unload_lets_the_requests_in_flight_finish(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As Triton unloads a model: the batch running and the requests queued behind it are
    answered by the model, not with 503; a request after the unload gets 409, its route read
    from the store (which unloads the model again here, as an unload on another replica would);
    and the runners go once the requests in flight are answered, not before."""
    gate, running = threading.Event(), threading.Event()

    def held(backend: str, inputs: Mapping[str, np.ndarray]) -> None:
        running.set()
        gate.wait(10)

    failing(monkeypatch, held)
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)

    async def main() -> tuple[list[Prediction], int]:
        first = asyncio.ensure_future(runtime.predict("mlp", None, {"x": x[:1]}))
        await asyncio.to_thread(running.wait, 10)  # its batch runs
        queued = [asyncio.ensure_future(runtime.predict("mlp", None, {"x": x[i : i + 1]})) for i in (1, 2, 3)]
        await in_batchers(runtime, 4)
        runtime.registry.set_unloaded("mlp", True)  # as the unload endpoint does
        await asyncio.to_thread(runtime.unload, "mlp")
        with pytest.raises(ConflictError, match="unloaded"):
            await runtime.predict("mlp", None, {"x": x[:1]})
        during = runtime.loaded_runners
        gate.set()
        return list(await asyncio.gather(first, *queued)), during

    answered, during = asyncio.run(main())
    for i, prediction in enumerate(answered):
        np.testing.assert_allclose(
            prediction.outputs["output0"], expected(x[i : i + 1]), rtol=1e-5, atol=1e-6
        )
    assert during == 1
    deadline = time.monotonic() + 10
    while runtime.loaded_runners and time.monotonic() < deadline:
        time.sleep(0.02)
    assert runtime.loaded_runners == 0


@pytest.mark.parametrize("meanwhile", ["nothing", "a load and an unload", "a default version"])
def test_an_unloads_runners_go_once_its_requests_are_answered(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch, meanwhile: str
) -> None:
    """Whatever comes while the requests in flight run (ONNX Runtime loading for the batch of
    8 they merge into, TorchScript standing in; a load and another unload; another default
    version), the runners of a model that stays unloaded go once those requests are answered."""
    gate, running = threading.Event(), threading.Event()
    gate.set()

    def held(backend: str, inputs: Mapping[str, np.ndarray]) -> None:
        running.set()
        gate.wait(10)

    runs = failing(monkeypatch, held)
    route = runtime.route("mlp", None)
    runtime.load(route.version, next(v for v in route.variants if v.backend == "torchscript"))
    gate.clear()
    running.clear()
    x = np.random.default_rng(0).standard_normal((9, 64)).astype(np.float32)

    async def main() -> list[Prediction]:
        # TorchScript at batch 1, held: the eight behind it merge into a batch of 8, which ONNX
        # Runtime serves best, and which loads while TorchScript stands in.
        first = asyncio.ensure_future(runtime.predict("mlp", None, {"x": x[:1]}))
        await asyncio.to_thread(running.wait, 10)
        queued = [
            asyncio.ensure_future(runtime.predict("mlp", None, {"x": x[i : i + 1]})) for i in range(1, 9)
        ]
        await in_batchers(runtime, 9)
        registry = runtime.registry
        registry.set_unloaded("mlp", True)
        await asyncio.to_thread(runtime.unload, "mlp")
        if meanwhile == "a load and an unload":
            assert registry.serve_again("mlp", registry.last_unload("mlp"))
            runtime.reroute("mlp", loaded=True)
            registry.set_unloaded("mlp", True)
            await asyncio.to_thread(runtime.unload, "mlp")
        elif meanwhile == "a default version":
            registry.set_default_version("mlp", 1)
            runtime.reroute("mlp")
        gate.set()
        return list(await asyncio.gather(first, *queued))

    for i, prediction in enumerate(asyncio.run(main())):
        np.testing.assert_allclose(
            prediction.outputs["output0"], expected(x[i : i + 1]), rtol=1e-5, atol=1e-6
        )
    # The load behind the batch may end after its requests are answered: it is not kept either.
    deadline = time.monotonic() + 30
    while (
        "onnxruntime" not in runs or runtime._loading or runtime._draining
    ) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "onnxruntime" in runs
    assert runtime.loaded_runners == 0, runs


def test_a_model_loaded_again_while_its_requests_drain_keeps_what_it_loads(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A load that comes while an unload's requests still run serves again at once: the
    runners its warm-up loads stay, and so do those the requests ran on."""
    gate, running = threading.Event(), threading.Event()

    def first_held(backend: str, inputs: Mapping[str, np.ndarray]) -> None:
        if not running.is_set():
            running.set()
            gate.wait(10)

    failing(monkeypatch, first_held)
    # ONNX Runtime loads only with the warm-up, while the request drains.
    monkeypatch.setattr(runtime, "_load_other_sizes_behind", lambda route, variant: None)
    x = np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)

    async def main() -> Prediction:
        first = asyncio.ensure_future(runtime.predict("mlp", None, {"x": x}))
        await asyncio.to_thread(running.wait, 10)
        registry = runtime.registry
        registry.set_unloaded("mlp", True)
        await asyncio.to_thread(runtime.unload, "mlp")
        assert registry.serve_again("mlp", registry.last_unload("mlp"))
        runtime.reroute("mlp", loaded=True)
        warmed = await asyncio.to_thread(runtime.warm, "mlp")
        assert [v.backend for v in warmed] == ["torchscript", "onnxruntime"]
        gate.set()
        return await first

    np.testing.assert_allclose(asyncio.run(main()).outputs["output0"], expected(x), rtol=1e-5, atol=1e-6)
    deadline = time.monotonic() + 10
    while runtime._draining and time.monotonic() < deadline:
        time.sleep(0.02)
    assert runtime.loaded_runners == 2


def test_inputs_the_model_itself_fails_on_leave_the_variant_in_service(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch that ONNX Runtime fails on and TorchScript fails on too (an index out of range)
    is the request's fault: a 400 (ModelRunError), pinned or not, and the variant serves the
    next batch; one bad request a minute does not keep a model off its fastest variant."""
    runs = failing(
        monkeypatch, lambda _, inputs: "index out of range in self" if inputs["x"][0, 0] > 100 else None
    )
    x = np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)
    bad = x.copy()
    bad[0, 0] = 1000
    for backend in (None, "onnxruntime"):
        with pytest.raises(ModelRunError, match=r"the model failed on these inputs: .*index out of range"):
            asyncio.run(runtime.predict("mlp", None, {"x": bad}, backend=backend))
    served = asyncio.run(runtime.predict("mlp", None, {"x": x}))
    assert served.variant.backend == "onnxruntime"
    np.testing.assert_allclose(served.outputs["output0"], expected(x), rtol=1e-5, atol=1e-6)
    assert runs.count("onnxruntime") == 3


def test_a_request_given_up_on_while_its_batch_runs_counts_only_as_a_failure(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As Triton counts them: queue and compute time only on the success path, so that queue's
    count is success's. A request cancelled while its batch of 2 runs (a gRPC deadline) is a
    failure (CANCELED), and no inference; the execution still counts at the size it ran."""
    gate, running = threading.Event(), threading.Event()

    def held(backend: str, inputs: Mapping[str, np.ndarray]) -> None:
        if len(inputs["x"]) == 2:
            running.set()
            gate.wait(10)

    failing(monkeypatch, held)
    route = runtime.route("mlp", None)
    runtime.load(route.version, next(v for v in route.variants if v.backend == "torchscript"))
    x = np.random.default_rng(0).standard_normal((2, 64)).astype(np.float32)
    labels = {"model": "mlp", "version": "1", "reason": "CANCELED"}
    cancelled = REGISTRY.get_sample_value("nv_inference_request_failure", labels) or 0.0

    async def main() -> Prediction:
        kept = asyncio.ensure_future(runtime.predict("mlp", None, {"x": x[:1]}))
        left = asyncio.ensure_future(runtime.predict("mlp", None, {"x": x[1:]}))
        await asyncio.to_thread(running.wait, 10)  # their batch of 2 runs
        left.cancel()
        gate.set()
        with pytest.raises(asyncio.CancelledError):
            await left
        return await kept

    np.testing.assert_allclose(asyncio.run(main()).outputs["output0"], expected(x[:1]), rtol=1e-5, atol=1e-6)
    [stats] = runtime.stats.doc("mlp")
    counts = {phase: d["count"] for phase, d in stats["inference_stats"].items()}
    assert counts == {
        "success": 1,
        "fail": 1,
        "queue": 1,
        "compute_input": 1,
        "compute_infer": 1,
        "compute_output": 1,
        "cache_hit": 0,
        "cache_miss": 0,
    }
    assert (stats["inference_count"], stats["execution_count"]) == (1, 1)
    assert [(b["batch_size"], b["compute_infer"]["count"]) for b in stats["batch_stats"]] == [(2, 1)]
    assert REGISTRY.get_sample_value("nv_inference_request_failure", labels) == cancelled + 1


def test_an_eviction_that_refcounting_freed_leaves_the_frozen_heap_unwalked() -> None:
    """Thawing the frozen heap walks all of torch's and TVM's objects with the GIL held, which
    stalled every request at each eviction: release_memory does it only for a dropped runner
    that a collection of the objects made since the heap was frozen leaves alive."""

    class Node:
        other: object

    release_memory()  # walks it all: the count of objects frozen since starts afresh
    a, b = Node(), Node()
    a.other, b.other = b, a
    frozen_garbage = weakref.ref(a)
    freeze_heap()
    del a, b
    runner, held, holder = Node(), Node(), Node()  # freed by refcounting, and by a young cycle
    held.other, holder.other = holder, held
    dropped = [weakref.ref(runner), weakref.ref(held)]
    del runner, held, holder
    release_memory(dropped)
    assert [ref() for ref in dropped] == [None, None]
    assert frozen_garbage() is not None  # the frozen heap was not walked
    release_memory()
    assert frozen_garbage() is None


def test_a_dropped_runner_that_a_frozen_cycle_holds_is_freed() -> None:
    class Node:
        other: object

    a, b = Node(), Node()
    a.other, b.other = b, a
    runner = weakref.ref(a)
    freeze_heap()  # as after its load
    del a, b
    release_memory([runner])
    assert runner() is None


def test_frozen_cyclic_garbage_is_freed_once_a_quarter_of_the_heap_was_frozen_since_its_walk() -> None:
    """Objects frozen while alive (requests in flight at a load) and later left in a cycle are
    not kept forever when no eviction needs a walk."""

    class Node:
        other: object

    release_memory()
    a, b = Node(), Node()
    a.other, b.other = b, a
    garbage = weakref.ref(a)
    freeze_heap()
    del a, b
    release_memory([])
    assert garbage() is not None
    grown = [[] for _ in range(gc.get_freeze_count() // 3)]  # alive: frozen by the next freeze
    freeze_heap()
    assert garbage() is None
    del grown


def test_an_unload_answers_the_requests_waiting_for_a_load_at_its_drain_limit(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As it answers those waiting for a batch: they waited out the load (1.5 s past a limit of
    0.3), and then their batch loaded the runner again, on an inference lane."""
    slow = slow_onnxruntime(monkeypatch, 1.5)
    monkeypatch.setattr("service.runtime.UNLOAD_DRAIN_S", 0.3)
    runtime.route("mlp", None)
    x = np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)

    async def ask(began: float) -> tuple[str, float]:
        try:
            await runtime.predict("mlp", None, {"x": x}, backend="onnxruntime")
            answer = "answered"
        except UnavailableError:
            answer = "503"
        return answer, time.monotonic() - began

    async def main() -> list[tuple[str, float]]:
        began = time.monotonic()
        asking = [asyncio.create_task(ask(began)) for _ in range(4)]
        await asyncio.sleep(0.2)
        runtime.unload("mlp")
        return list(await asyncio.gather(*asking))

    answers = asyncio.run(main())
    assert [answer for answer, _ in answers] == ["503"] * 4
    assert max(at for _, at in answers) < 1.2, answers  # at 0.5 s, not once the load ended
    time.sleep(1.5)  # the load, not cut short, ends
    assert slow.loads == 1


def test_stored_torchscript_that_no_longer_loads_is_the_servers_error(tmp_path: Path) -> None:
    """Not the request's: a 400 "Invalid model" told clients their request was at fault."""
    registry = Registry(LocalStore(tmp_path / "store"))
    ready_version(registry, MLP, {"torchscript": reference(BASELINE)}, BASELINE)
    sha = registry.get_version("mlp", 1).sha256
    registry.store.put_blob(MODEL_BLOB.format(sha256=sha), [b"garbage" * 100])
    runtime = Runtime(registry, Settings(data_dir=tmp_path, targets=[HOST]))
    try:
        with pytest.raises(
            KilnError, match="the stored TorchScript of 'mlp' version 1 no longer loads"
        ) as raised:
            asyncio.run(runtime.predict("mlp", None, {"x": np.zeros((1, 64), np.float32)}))
        assert raised.value.status_code == 500
    finally:
        runtime.close()


def test_a_stale_route_is_read_without_a_thread_of_the_pool(tmp_path: Path) -> None:
    """Uploads waiting for their checks can hold all of AnyIO's threads: a prediction of a
    loaded model waited for one to read its route again, 25 s behind 60 uploads."""
    registry = Registry(LocalStore(tmp_path / "store"))
    ready_version(registry, MLP, {"torchscript": reference(BASELINE)}, BASELINE)
    runtime = Runtime(registry, Settings(data_dir=tmp_path, targets=[HOST], route_ttl_s=0.05))
    x = np.ones((1, 64), np.float32)

    async def main() -> float:
        await runtime.predict("mlp", None, {"x": x})  # routed, and its runner loaded
        release = threading.Event()
        threads = int(anyio.to_thread.current_default_thread_limiter().total_tokens)
        holders = [asyncio.ensure_future(run_in_threadpool(release.wait, 30)) for _ in range(threads)]
        await asyncio.sleep(0.2)  # every thread taken, and the route stale
        started = time.monotonic()
        try:
            await asyncio.wait_for(runtime.predict("mlp", None, {"x": x}), 10)
            return time.monotonic() - started
        finally:
            release.set()
            await asyncio.gather(*holders)

    try:
        assert asyncio.run(main()) < 2
    finally:
        runtime.close()
