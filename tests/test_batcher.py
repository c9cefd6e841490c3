"""The dynamic batcher merges concurrent requests, splits results back exactly, and isolates errors."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from service import batcher as batcher_module
from service.batcher import GONE_CHECK_S, PEAK_CYCLES, Arrays, Batcher, BatchPolicy, BatchTiming, Phases
from service.errors import ClientGoneError, QueueFullError, TimeoutExpiredError, UnavailableError
from service.logs import request_id
from service.store import StoreUnavailableError

WEIGHTS = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)


class Recorder:
    """A real computation that records the batch sizes it was called with, and tags its result
    with that size, as the runtime tags a batch's outputs with the variant that ran it."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.calls: list[int] = []
        self.started: list[float] = []  # time.monotonic() at each call
        self.delay_s = delay_s
        self.lock = threading.Lock()

    def __call__(self, inputs: Arrays) -> tuple[Arrays, int]:
        size = int(inputs["x"].shape[0])
        with self.lock:
            self.calls.append(size)
            self.started.append(time.monotonic())
        if self.delay_s:
            threading.Event().wait(self.delay_s)
        x = inputs["x"]
        if not np.isfinite(x).all():
            raise ValueError("non-finite input")
        return {"y": x @ WEIGHTS, "s": x.sum(axis=1)}, size


def run(coro_factory: object) -> object:
    assert callable(coro_factory)
    return asyncio.run(coro_factory())


def requests(n: int, batch: int = 1) -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    return [rng.standard_normal((batch, 4)).astype(np.float32) for _ in range(n)]


def test_concurrent_requests_merge_and_split_exactly() -> None:
    recorder = Recorder()
    xs = requests(32)

    async def main() -> list[tuple[Arrays, int]]:
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(recorder, BatchPolicy(16, max_queue_delay_us=20_000), [pool])
            results = await asyncio.gather(*(batcher.submit({"x": x}, 1) for x in xs))
            batcher.close()
            return list(results)

    results = asyncio.run(main())
    assert sum(recorder.calls) == 32
    assert len(recorder.calls) < 32 and max(recorder.calls) > 1
    assert max(recorder.calls) <= 16
    # Every request learns the size of the batch that ran it.
    assert sorted(size for _, size in results) == sorted(n for n in recorder.calls for _ in range(n))
    for x, (result, _) in zip(xs, results, strict=True):
        alone, _ = recorder({"x": x})
        np.testing.assert_array_equal(result["s"], alone["s"])
        np.testing.assert_allclose(result["y"], alone["y"], rtol=1e-6, atol=1e-7)


def test_large_inputs_merge_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Eight inputs of 13 MB took the event loop 30 ms to merge, every other request waiting."""
    merged_on: list[bool] = []
    merge = batcher_module.merge

    def recording(parts: list[Arrays]) -> Arrays:
        merged_on.append(threading.current_thread() is threading.main_thread())
        return merge(parts)

    monkeypatch.setattr(batcher_module, "merge", recording)
    rows = batcher_module.MERGE_INLINE_BYTES // (4 * 4)  # float32 rows of 4: two such exceed it

    async def main() -> None:
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(Recorder(), BatchPolicy(8 * rows, max_queue_delay_us=50_000), [pool])
            for batch in (1, rows):
                xs = requests(2, batch)
                results = await asyncio.gather(*(batcher.submit({"x": x}, batch) for x in xs))
                for x, (result, _) in zip(xs, results, strict=True):
                    np.testing.assert_array_equal(result["s"], x.sum(axis=1))
            batcher.close()

    asyncio.run(main())
    assert merged_on == [True, False]  # small ones on the loop, where a thread costs more


def test_requests_queue_while_a_batch_runs_even_without_delay() -> None:
    recorder = Recorder(delay_s=0.05)

    async def main() -> None:
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(recorder, BatchPolicy(8), [pool])
            xs = requests(9)
            first = asyncio.ensure_future(batcher.submit({"x": xs[0]}, 1))
            await asyncio.sleep(0.02)  # the first request is now running, alone
            await asyncio.gather(first, *(batcher.submit({"x": x}, 1) for x in xs[1:]))
            batcher.close()

    asyncio.run(main())
    assert recorder.calls == [1, 8]


def test_preferred_size_closes_a_batch_early() -> None:
    recorder = Recorder()

    async def main() -> None:
        with ThreadPoolExecutor(1) as pool:
            policy = BatchPolicy(16, max_queue_delay_us=200_000, preferred_batch_sizes=(4,))
            batcher = Batcher(recorder, policy, [pool])
            await asyncio.gather(*(batcher.submit({"x": x}, 2) for x in requests(4, batch=2)))
            batcher.close()

    asyncio.run(main())
    assert recorder.calls == [4, 4]


def test_a_batch_takes_the_largest_preferred_size_the_queue_can_form() -> None:
    """Seven requests queue behind a running one. With preferred sizes 2 and 4, Triton runs the
    largest preferred batch it can form (4), not the first size reached (2), then of the three
    left a batch of 2, not of 3; the last runs alone."""
    recorder = Recorder(delay_s=0.1)

    async def main() -> None:
        with ThreadPoolExecutor(1) as pool:
            policy = BatchPolicy(8, preferred_batch_sizes=(2, 4))
            batcher = Batcher(recorder, policy, [pool])
            xs = requests(8)
            first = asyncio.ensure_future(batcher.submit({"x": xs[0]}, 1))
            await asyncio.sleep(0.02)  # the first request's batch is running, alone
            await asyncio.gather(first, *(batcher.submit({"x": x}, 1) for x in xs[1:]))
            batcher.close()

    asyncio.run(main())
    assert recorder.calls == [1, 4, 2, 1]


def test_a_batch_never_grows_past_the_largest_preferred_size() -> None:
    """As in Triton: a request that would take the batch past its largest preferred size starts
    the next batch instead, and the batch runs at once; so does one that holds that size or more
    from its first request, without waiting out the delay."""
    recorder = Recorder()
    policy = BatchPolicy(8, max_queue_delay_us=1_000_000, preferred_batch_sizes=(4,))

    async def main() -> tuple[float, float]:
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(recorder, policy, [pool])
            sent = time.monotonic()
            first, second = [asyncio.ensure_future(batcher.submit({"x": x}, 3)) for x in requests(2, batch=3)]
            await first
            first_s = time.monotonic() - sent
            await second  # alone, it waits out the delay
            sent = time.monotonic()
            await batcher.submit({"x": requests(1, batch=5)[0]}, 5)
            alone_s = time.monotonic() - sent
            batcher.close()
            return first_s, alone_s

    first_s, alone_s = asyncio.run(main())
    assert recorder.calls == [3, 3, 5]
    assert first_s < 0.5, first_s  # not the 1 s delay
    assert alone_s < 0.5, alone_s


@pytest.mark.parametrize(
    "change",
    [BatchPolicy(8), BatchPolicy(8, max_queue_delay_us=5_000_000, preferred_batch_sizes=(2,))],
    ids=["no-delay", "preferred"],
)
def test_a_change_of_policy_applies_to_the_batch_being_collected(change: BatchPolicy) -> None:
    """A request waits out a 5 s delay, until the delay is lowered to 0, or its size made a
    preferred one: then its batch runs at once, not at the end of the delay it began with."""
    recorder = Recorder()

    async def main() -> float:
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(recorder, BatchPolicy(8, max_queue_delay_us=5_000_000), [pool])
            waiting = asyncio.ensure_future(batcher.submit({"x": requests(1, batch=2)[0]}, 2))
            await asyncio.sleep(0.3)
            changed = time.monotonic()
            batcher.reconfigure(change)
            await waiting
            batcher.close()
            return time.monotonic() - changed

    elapsed = asyncio.run(main())
    assert recorder.calls == [2]
    assert elapsed < 2, elapsed


def test_different_shapes_never_merge() -> None:
    recorder = Recorder()

    def widen(x: np.ndarray) -> Arrays:
        return {"x": x}

    async def main() -> None:
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(
                lambda a: ({"z": a["x"] * 2}, None),
                BatchPolicy(8, 20_000),
                [pool],
                on_batch=lambda timing: recorder.calls.append(timing.batch_size),
            )
            a = np.ones((1, 4), np.float32)
            b = np.ones((1, 5), np.float32)
            out = await asyncio.gather(batcher.submit(widen(a), 1), batcher.submit(widen(b), 1))
            batcher.close()
            assert out[0][0]["z"].shape == (1, 4) and out[1][0]["z"].shape == (1, 5)

    asyncio.run(main())
    assert recorder.calls == [1, 1]


def test_timings_split_queue_from_compute() -> None:
    """What Triton's statistics extension reports, per batch: each request's wait apart from
    the run. Three requests behind a 100 ms delay, on a run that takes 50 ms; then, with no
    delay, one that waits behind a running batch of 100 ms; then one of a model that cannot
    batch, which waits for the executor's one thread, busy with another batch for 100 ms."""
    timings: list[BatchTiming] = []

    async def main() -> None:
        with ThreadPoolExecutor(1) as pool:
            delayed = Batcher(Recorder(0.05), BatchPolicy(8, 100_000), [pool], timings.append)
            await asyncio.gather(*(delayed.submit({"x": x}, 1) for x in requests(3)))
            delayed.close()
            eager = Batcher(Recorder(0.1), BatchPolicy(8), [pool], timings.append)
            running = asyncio.ensure_future(eager.submit({"x": requests(1)[0]}, 1))
            await asyncio.sleep(0.01)  # it runs, 90 ms to go
            await asyncio.gather(running, eager.submit({"x": requests(1, batch=2)[0]}, 2))
            running = asyncio.ensure_future(eager.submit({"x": requests(1)[0]}, 1))
            await asyncio.sleep(0.01)
            alone = Batcher(Recorder(0.05), BatchPolicy(1), [pool], timings.append)
            await asyncio.gather(running, alone.submit({"x": requests(1)[0]}, 1))
            eager.close()

    asyncio.run(main())
    merged, first, behind, _, alone = timings
    assert (merged.batch_size, len(merged.queued_s)) == (3, 3)
    assert 0.09 < max(merged.queued_s) < 0.3  # the oldest waited out the delay
    assert all(0.045 < t.infer_s < 0.4 for t in timings)
    assert 0 <= merged.input_s < 0.05 and 0 <= merged.output_s < 0.05
    assert first.batch_size == 1 and behind.batch_size == 2
    assert behind.queued_s[0] > first.queued_s[0] + 0.05  # it waited for `first` to finish
    assert alone.batch_size == 1 and alone.input_s == 0
    assert alone.queued_s[0] > 0.05  # waiting for the executor's thread is queue time too


def test_a_failing_batch_fails_only_its_requests() -> None:
    recorder = Recorder()

    async def main() -> None:
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(recorder, BatchPolicy(1), [pool])
            bad = np.full((1, 4), np.nan, np.float32)
            with pytest.raises(ValueError, match="non-finite"):
                await batcher.submit({"x": bad}, 1)
            good, _ = await batcher.submit({"x": np.ones((1, 4), np.float32)}, 1)
            batcher.close()
            assert good["y"].shape == (1, 3)

    asyncio.run(main())


def test_a_failing_merged_batch_fails_only_the_request_that_broke_it() -> None:
    """One request the model cannot take (here a NaN) must not fail the others batched with it:
    the merged batch runs again one request at a time."""
    recorder = Recorder()
    xs = requests(4)
    xs[2] = np.full((1, 4), np.nan, np.float32)
    timings: list[BatchTiming] = []

    async def main() -> list[object]:
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(recorder, BatchPolicy(8, max_queue_delay_us=200_000), [pool], timings.append)
            results = await asyncio.gather(*(batcher.submit({"x": x}, 1) for x in xs), return_exceptions=True)
            batcher.close()
            return list(results)

    results = asyncio.run(main())
    assert recorder.calls == [4, 1, 1, 1, 1]
    # The statistics count the three runs that succeeded, one request each, and nothing twice.
    assert [(t.batch_size, len(t.queued_s)) for t in timings] == [(1, 1)] * 3
    assert isinstance(results[2], ValueError)
    for i in (0, 1, 3):
        got = results[i]
        assert isinstance(got, tuple)
        np.testing.assert_allclose(got[0]["y"], xs[i] @ WEIGHTS, rtol=1e-6)
        assert got[1] == 1  # it ran alone


def test_a_request_left_waiting_by_a_failed_batch_runs_again_alone() -> None:
    """The request that broke a merged batch was given up on while it ran (a gRPC deadline): the
    one left waiting still runs again alone, and gets the model's answer, not the other's error."""
    recorder = Recorder(delay_s=0.3)
    good = requests(1)[0]

    async def main() -> tuple[Arrays, int]:
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(recorder, BatchPolicy(8, max_queue_delay_us=50_000), [pool])
            bad = asyncio.ensure_future(batcher.submit({"x": np.full((1, 4), np.nan, np.float32)}, 1))
            kept = asyncio.ensure_future(batcher.submit({"x": good}, 1))
            await asyncio.sleep(0.15)  # their batch of 2 runs, and will fail
            bad.cancel()
            answer = await kept
            batcher.close()
            return answer

    outputs, size = asyncio.run(main())
    assert recorder.calls == [2, 1]
    np.testing.assert_allclose(outputs["y"], good @ WEIGHTS, rtol=1e-6)
    assert size == 1


def test_requests_given_up_on_while_they_run_are_not_counted() -> None:
    """Triton counts queue and compute time only for requests that succeed: one given up on while
    its batch runs (the runtime counts it a failure, CANCELED) is left out of the batch's timing,
    which still counts the rows the model ran. A batch, or a request that runs alone, given up on
    whole while it runs reports nothing: a cancelled request counts on the success path in
    neither."""
    timings: list[BatchTiming] = []
    x, xx = requests(1)[0], requests(1, batch=2)[0]

    async def given_up(batcher: Batcher[int], rows: np.ndarray) -> None:
        running = asyncio.ensure_future(batcher.submit({"x": rows}, len(rows)))
        await asyncio.sleep(0.1)
        running.cancel()
        await asyncio.sleep(0.3)  # its run ends

    async def main() -> None:
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(
                Recorder(0.2), BatchPolicy(8, max_queue_delay_us=50_000), [pool], timings.append
            )
            kept = asyncio.ensure_future(batcher.submit({"x": x}, 1))
            await given_up(batcher, xx)  # merged with `kept`
            await kept
            await given_up(batcher, x)
            batcher.close()
            alone = Batcher(Recorder(0.2), BatchPolicy(1), [pool], timings.append)
            await given_up(alone, x)

    asyncio.run(main())
    assert [len(t.queued_s) for t in timings] == [1]
    assert (timings[0].batch_size, timings[0].inferred) == (3, 1)


def test_a_merged_batch_failed_by_a_store_outage_is_not_run_again() -> None:
    """An unreachable store is the service's fault (a 503), not an input's: every request of the
    batch gets it at once, rather than each running again alone to wait on the store again."""
    calls: list[int] = []

    def unavailable(inputs: Arrays) -> tuple[Arrays, int]:
        calls.append(len(inputs["x"]))
        raise StoreUnavailableError("the store cannot be reached")

    async def main() -> list[object]:
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(unavailable, BatchPolicy(8, max_queue_delay_us=200_000), [pool])
            results = await asyncio.gather(
                *(batcher.submit({"x": x}, 1) for x in requests(6)), return_exceptions=True
            )
            batcher.close()
            return list(results)

    results = asyncio.run(main())
    assert calls == [6]
    assert all(isinstance(r, StoreUnavailableError) for r in results), results


def test_the_queue_delay_counts_from_a_requests_arrival() -> None:
    """A request that arrived while a batch ran has waited already: its batch starts once its own
    arrival is a delay old, not a whole delay after the running batch ends."""
    recorder = Recorder(delay_s=0.3)
    delay_s = 0.3

    async def main() -> float:
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(recorder, BatchPolicy(8, max_queue_delay_us=int(delay_s * 1e6)), [pool])
            first = asyncio.ensure_future(batcher.submit({"x": requests(1)[0]}, 1))
            await asyncio.sleep(delay_s + 0.05)  # the first request's batch is running now
            arrived = time.monotonic()
            await batcher.submit({"x": requests(1)[0]}, 1)
            await first
            batcher.close()
            return arrived

    arrived = asyncio.run(main())
    assert recorder.calls == [1, 1]
    # Arrived 0.05 s into the first batch (0.3 s long): its own starts at arrival + 0.3 s; counted
    # from the first batch's end, the delay made that arrival + 0.55 s.
    assert recorder.started[1] - arrived < 0.45, recorder.started[1] - arrived


@pytest.mark.parametrize("max_batch_size", [1, 4])
def test_a_full_queue_refuses_requests_at_once_and_recovers(max_batch_size: int) -> None:
    recorder = Recorder(delay_s=0.3)

    async def main() -> float:
        with ThreadPoolExecutor(2) as pool:
            batcher = Batcher(recorder, BatchPolicy(max_batch_size, max_queue_size=3), [pool])
            admitted = [asyncio.ensure_future(batcher.submit({"x": x}, 1)) for x in requests(3)]
            await asyncio.sleep(0.05)  # all three are in, waiting or running
            begun = time.monotonic()
            with pytest.raises(QueueFullError, match="max_queue_size"):
                await batcher.submit({"x": requests(1)[0]}, 1)
            refused_in = time.monotonic() - begun
            for result in await asyncio.gather(*admitted):
                assert result[0]["y"].shape == (1, 3)
            await batcher.submit({"x": requests(1)[0]}, 1)  # answered: the queue emptied
            batcher.close()
            return refused_in

    refused_in = asyncio.run(main())
    assert refused_in < 0.1  # at once, not after the 0.3 s batches ahead of it
    assert sum(recorder.calls) == 4  # the refused request never ran
    assert QueueFullError.status_code == 503 and QueueFullError.headers["Retry-After"]


def test_closing_answers_every_waiting_request() -> None:
    """An unload closes the batcher: the batch running and the requests queued behind it get a
    503-class error at once, instead of hanging until their clients time out."""
    recorder = Recorder(delay_s=0.2)

    async def main() -> list[object]:
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(recorder, BatchPolicy(2), [pool])
            pending = [asyncio.ensure_future(batcher.submit({"x": x}, 1)) for x in requests(5)]
            await asyncio.sleep(0.05)  # the first batch is running, the rest wait
            batcher.close()
            return await asyncio.wait_for(asyncio.gather(*pending, return_exceptions=True), 5)

    results = asyncio.run(main())
    assert all(isinstance(r, UnavailableError) for r in results), results
    assert "unloaded" in str(results[0])


@pytest.mark.parametrize("limit_s", [10.0, 0.1])
def test_draining_answers_the_requests_in_and_refuses_the_next(limit_s: float) -> None:
    """An unload drains the batcher, as Triton lets a model's requests in flight finish: the
    batch running and those queued behind it run, and a request after gets a 503; past the
    drain's limit those still waiting for a batch get a 503, and the batch running finishes.
    The drain is done once every request is answered."""
    gated = Gated()

    async def main() -> tuple[list[object], bool]:
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(gated, BatchPolicy(2), [pool])
            inflight = [asyncio.ensure_future(batcher.submit(tag(0), 1))]
            await asyncio.sleep(0.05)  # its batch is running, alone
            inflight += [asyncio.ensure_future(batcher.submit(tag(n), 1)) for n in (1, 2, 3)]
            await asyncio.sleep(0)
            drained = asyncio.wrap_future(await asyncio.to_thread(batcher.drain, limit_s))  # from a thread
            await asyncio.sleep(0.01)
            with pytest.raises(UnavailableError, match="stopped serving"):
                await batcher.submit(tag(4), 1)
            early = drained.done()
            await asyncio.sleep(0.2)  # past the shorter limit
            gated.gate.set()
            results = await asyncio.gather(*inflight, return_exceptions=True)
            await asyncio.wait_for(drained, 5)
            return results, early

    results, early = asyncio.run(main())
    assert not early
    if limit_s > 1:
        assert [r[0]["y"][0, 0] for r in results] == [0, 1, 2, 3]  # type: ignore[index]
        assert gated.batches == [[0], [1, 2], [3]]
    else:
        assert results[0][0]["y"][0, 0] == 0  # type: ignore[index]
        assert all(isinstance(r, UnavailableError) for r in results[1:]), results
        assert gated.batches == [[0]]  # the queued requests never ran


def test_a_request_given_up_on_while_it_waits_leaves_the_queue() -> None:
    """Cancelled behind a running batch (a gRPC call cancelled, its stream closed): out of the
    queue with its inputs at once, not left there until a batch reaches it, while max_queue_size
    already lets another in its place; those still waiting run as they would have."""
    gated = Gated()

    async def main() -> tuple[int, list[object]]:
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(gated, BatchPolicy(4, max_queue_size=3), [pool])
            first = asyncio.ensure_future(batcher.submit(tag(0), 1))
            await asyncio.sleep(0.05)  # its batch is running, alone
            for n in range(1, 101):  # each cancelled: the queue never holds more than one
                given_up = asyncio.ensure_future(batcher.submit(tag(n), 1))
                await asyncio.sleep(0)
                given_up.cancel()
                await asyncio.gather(given_up, return_exceptions=True)
            kept = asyncio.ensure_future(batcher.submit(tag(101), 1))
            await asyncio.sleep(0)
            queued = len(batcher._queue)
            gated.gate.set()
            results = await asyncio.gather(first, kept)
            batcher.close()
            return queued, [r[0]["y"][0, 0] for r in results]

    queued, answers = asyncio.run(main())
    assert queued == 1
    assert answers == [0, 101]
    assert gated.batches == [[0], [101]]


def quiet_loop_errors() -> list[dict[str, object]]:
    """asyncio's reports of errors nobody read ("Task exception was never retrieved"), kept."""
    errors: list[dict[str, object]] = []
    asyncio.get_running_loop().set_exception_handler(lambda loop, context: errors.append(context))
    return errors


@pytest.mark.parametrize("max_batch_size", [1, 4])
def test_a_request_past_its_timeout_is_answered_then_and_never_run(max_batch_size: int) -> None:
    """Triton's queue policy: a request still waiting at its deadline gets a 503 then, not
    after the work ahead of it, and is not run when its turn comes."""
    recorder = Recorder(delay_s=0.4)
    first, late, patient = requests(3)

    async def main() -> tuple[float, object, list[dict[str, object]]]:
        errors = quiet_loop_errors()
        with ThreadPoolExecutor(1) as pool:  # one thread: the late request waits for it too
            batcher = Batcher(recorder, BatchPolicy(max_batch_size), [pool])
            running = asyncio.ensure_future(batcher.submit({"x": first}, 1))
            await asyncio.sleep(0.05)  # the first runs; the others wait behind it
            waited = asyncio.ensure_future(batcher.submit({"x": patient}, 1, time.monotonic() + 10))
            begun = time.monotonic()
            with pytest.raises(TimeoutExpiredError, match="timeout expired"):
                await batcher.submit({"x": late}, 1, time.monotonic() + 0.1)
            answered_in = time.monotonic() - begun
            await running
            result = await waited
            await asyncio.sleep(0.05)  # the late one's turn in the executor has come and gone
            batcher.close()
            return answered_in, result, errors

    answered_in, (result, _), errors = asyncio.run(main())
    assert 0.09 < answered_in < 0.3  # at its deadline, not after the 0.4 s run ahead of it
    assert sum(recorder.calls) == 2  # the first and the patient one: the late one never ran
    alone, _ = recorder({"x": patient})
    np.testing.assert_allclose(result["y"], alone["y"], rtol=1e-6)
    assert errors == []


def test_an_expired_request_leaves_the_queue_and_the_next_batch_whole() -> None:
    recorder = Recorder(delay_s=0.3)
    first, late, a, b = requests(4)

    async def main() -> None:
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(recorder, BatchPolicy(2), [pool])
            running = asyncio.ensure_future(batcher.submit({"x": first}, 1))
            await asyncio.sleep(0.05)
            expired = asyncio.ensure_future(batcher.submit({"x": late}, 1, time.monotonic() + 0.05))
            rest = [asyncio.ensure_future(batcher.submit({"x": x}, 1)) for x in (a, b)]
            with pytest.raises(TimeoutExpiredError):
                await expired
            await asyncio.gather(running, *rest)
            batcher.close()

    asyncio.run(main())
    assert recorder.calls == [1, 2]  # a and b in one batch: the expired one took no place in it


def test_a_client_that_hangs_up_before_its_turn_is_not_run_when_it_has_a_deadline() -> None:
    recorder = Recorder(delay_s=0.2)
    first, gone = requests(2)

    async def main() -> list[dict[str, object]]:
        errors = quiet_loop_errors()
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(recorder, BatchPolicy(1), [pool])
            running = asyncio.ensure_future(batcher.submit({"x": first}, 1))
            await asyncio.sleep(0.05)
            hung_up = asyncio.ensure_future(batcher.submit({"x": gone}, 1, time.monotonic() + 10))
            await asyncio.sleep(0.05)
            hung_up.cancel()
            await running
            await asyncio.sleep(0.1)
            batcher.close()
            return errors

    assert asyncio.run(main()) == []
    assert recorder.calls == [1]


def closed_loop(
    policy: BatchPolicy, clients: int, cycles: int, run_s: float, stagger_s: float = 0.0
) -> tuple[list[int], float]:
    """`clients` callers, each sending its next request as soon as the last is answered, as wrk
    does, after a random pause of up to `stagger_s`: the sizes of the batches run, and the mean
    seconds per cycle."""
    recorder = Recorder(delay_s=run_s)
    rng = np.random.default_rng(2)

    async def client(batcher: Batcher[int], x: np.ndarray) -> None:
        for _ in range(cycles):
            await asyncio.sleep(rng.uniform(0, stagger_s))
            await batcher.submit({"x": x}, 1)

    async def main() -> float:
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(recorder, policy, [pool])
            began = time.monotonic()
            await asyncio.gather(*(client(batcher, x) for x in requests(clients)))
            batcher.close()
            return (time.monotonic() - began) / cycles

    per_cycle = asyncio.run(main())
    return recorder.calls, per_cycle


def test_an_adaptive_delay_stops_waiting_once_every_recent_client_is_in_the_batch() -> None:
    """Two clients of a model whose batches could hold 8: with Triton's delay each batch waits
    the whole 200 ms for requests that are not coming; with the adaptive delay it runs once both
    requests are in it, after the first few cycles, which wait while the load is still unknown."""
    triton = BatchPolicy(8, max_queue_delay_us=200_000)
    calls, waited = closed_loop(triton, clients=2, cycles=6, run_s=0.01)
    assert calls == [2] * 6 and waited >= 0.2
    adaptive = BatchPolicy(8, max_queue_delay_us=200_000, adaptive_queue_delay=True)
    calls, _ = closed_loop(adaptive, clients=2, cycles=12, run_s=0.01)
    assert calls == [2] * 12  # still merged: the pair arrives together
    recorder = Recorder(delay_s=0.01)

    async def timed_cycles() -> list[float]:
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(recorder, adaptive, [pool])
            xs = requests(2)
            took = []
            for _ in range(8):
                began = time.monotonic()
                await asyncio.gather(*(batcher.submit({"x": x}, 1) for x in xs))
                took.append(time.monotonic() - began)
            batcher.close()
            return took

    took = asyncio.run(timed_cycles())
    assert min(took[:4]) >= 0.2  # no load seen yet: waits as Triton does
    assert max(took[5:]) < 0.1  # every recent client is in the batch: it runs at once


def test_an_adaptive_delay_still_fills_batches_under_heavier_load() -> None:
    """Eight clients: each batch still waits for all eight, as the requests outstanding at once
    peaked at 8 in the cycles before; and once the load falls to one client, a lone request
    no longer waits."""
    adaptive = BatchPolicy(8, max_queue_delay_us=200_000, adaptive_queue_delay=True)
    calls, per_cycle = closed_loop(adaptive, clients=8, cycles=10, run_s=0.01)
    assert calls == [8] * 10 and per_cycle < 0.1
    # The clients' requests arrive up to 3 ms apart: a batch still waits for all eight, where
    # closing on the first would run them in fragments.
    calls, per_cycle = closed_loop(adaptive, clients=8, cycles=10, run_s=0.01, stagger_s=0.003)
    assert calls == [8] * 10 and per_cycle < 0.1
    recorder = Recorder()

    async def load_falls() -> float:
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(recorder, adaptive, [pool])
            for _ in range(5):
                await asyncio.gather(*(batcher.submit({"x": x}, 1) for x in requests(8)))
            for _ in range(PEAK_CYCLES + 1):  # one client: the peak of 8 ages out
                await batcher.submit({"x": requests(1)[0]}, 1)
            began = time.monotonic()
            await batcher.submit({"x": requests(1)[0]}, 1)
            batcher.close()
            return time.monotonic() - began

    assert asyncio.run(load_falls()) < 0.1
    assert recorder.calls == [8] * 5 + [1] * (PEAK_CYCLES + 2)


def test_an_adaptive_delay_counts_only_live_requests_in_the_batch() -> None:
    """Three clients have been sending; a fourth request joins the forming batch and its client
    hangs up. The batch holds three requests once the second client's arrives, but only two
    live ones: it waits for the third client rather than running without it."""
    recorder = Recorder()
    adaptive = BatchPolicy(8, max_queue_delay_us=300_000, adaptive_queue_delay=True)

    async def main() -> None:
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(recorder, adaptive, [pool])
            for _ in range(PEAK_CYCLES + 1):  # a peak of three requests outstanding
                await asyncio.gather(*(batcher.submit({"x": x}, 1) for x in requests(3)))
            x = requests(1)[0]
            first = asyncio.ensure_future(batcher.submit({"x": x}, 1))
            gone = asyncio.ensure_future(batcher.submit({"x": x}, 1))
            await asyncio.sleep(0.01)
            gone.cancel()
            await asyncio.sleep(0.02)
            second = asyncio.ensure_future(batcher.submit({"x": x}, 1))
            await asyncio.sleep(0.03)
            third = asyncio.ensure_future(batcher.submit({"x": x}, 1))
            await asyncio.gather(first, second, third)
            batcher.close()

    asyncio.run(main())
    assert recorder.calls == [3] * (PEAK_CYCLES + 1) + [3]


class Gated:
    """A run whose first batch waits for the gate, so that requests queue behind it; it records
    each batch by the tags of its rows (see `tag`), and when each started."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.batches: list[list[int]] = []
        self.started: list[float] = []

    def __call__(self, inputs: Arrays) -> tuple[Arrays, int]:
        self.gate.wait(10)
        self.started.append(time.monotonic())
        self.batches.append([int(v) for v in inputs["x"][:, 0]])
        return {"y": inputs["x"]}, 0


def tag(n: int) -> Arrays:
    return {"x": np.full((1, 4), n, np.float32)}


def behind_a_batch(
    policy: BatchPolicy, queued: list[tuple[int, float | None]], change: BatchPolicy | None = None
) -> list[list[int]]:
    """The batches that run when requests tagged 1, 2, ... with these (priority, seconds to
    their deadline) queue behind a batch of request 0; `change` is applied before it ends."""
    gated = Gated()

    async def main() -> None:
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(gated, policy, [pool])
            first = asyncio.ensure_future(batcher.submit(tag(0), 1))
            await asyncio.sleep(0.05)  # its batch is running, alone
            rest = [
                asyncio.ensure_future(
                    batcher.submit(tag(i + 1), 1, None if s is None else time.monotonic() + s, priority)
                )
                for i, (priority, s) in enumerate(queued)
            ]
            await asyncio.sleep(0.1)  # deadlines of 0.05 s pass
            if change is not None:
                batcher.reconfigure(change)
            gated.gate.set()
            await asyncio.gather(first, *rest, return_exceptions=True)
            batcher.close()

    asyncio.run(main())
    return gated.batches


def priorities(*values: int) -> list[tuple[int, float | None]]:
    return [(p, None) for p in values]


def test_priority_levels_batch_higher_priorities_first() -> None:
    """Triton's priority levels: requests queue by level, 1 first, in arrival order within one; a
    priority of 0 or out of range waits at the default level. Without levels, arrival order."""
    # Levels 1..3, default 2: 0 and 9 wait at 2, with the requests that asked for it.
    policy = BatchPolicy(2, priority_levels=3, default_priority_level=2)
    assert behind_a_batch(policy, priorities(3, 0, 2, 1, 9, 1, 3)) == [[0], [4, 6], [2, 3], [5, 1], [7]]
    assert behind_a_batch(BatchPolicy(2), priorities(3, 0, 2, 1)) == [[0], [1, 2], [3, 4]]


def test_waiting_requests_follow_a_change_of_priority_levels() -> None:
    levels = BatchPolicy(2, priority_levels=3, default_priority_level=3)
    # Turned off: arrival order again, not the order the levels had put them in.
    assert behind_a_batch(levels, priorities(3, 2, 1), change=BatchPolicy(2)) == [[0], [1, 2], [3]]
    # Turned on: the waiting requests take their levels.
    assert behind_a_batch(BatchPolicy(2), priorities(3, 2, 1), change=levels) == [[0], [3, 2], [1]]


def test_an_expired_request_leaves_the_queue_from_behind_another() -> None:
    """Removed from anywhere in the queue, not only its head: it takes no place in a batch."""
    assert behind_a_batch(BatchPolicy(2), [(0, None), (0, 0.05), (0, None)]) == [[0], [1, 3]]
    policy = BatchPolicy(2, priority_levels=2, default_priority_level=2)
    assert behind_a_batch(policy, [(1, None), (2, 0.05), (1, None), (2, None)]) == [[0], [1, 3], [4]]


def test_the_delay_counts_from_the_oldest_request_in_the_batch() -> None:
    """A request of priority 1 leads the batch that an older one joins: the batch waits out the
    delay from the older one's arrival, as in Triton, not from its own."""
    gated = Gated()
    policy = BatchPolicy(4, max_queue_delay_us=300_000, priority_levels=2, default_priority_level=2)

    async def main() -> float:
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(gated, policy, [pool])
            full = {"x": np.zeros((4, 4), np.float32)}  # a whole batch: it runs at once
            first = asyncio.ensure_future(batcher.submit(full, 4))
            await asyncio.sleep(0.05)
            old = asyncio.ensure_future(batcher.submit(tag(1), 1))
            await asyncio.sleep(0.35)  # past its delay already
            new = asyncio.ensure_future(batcher.submit(tag(2), 1, None, 1))
            await asyncio.sleep(0)
            released = time.monotonic()
            gated.gate.set()
            await asyncio.gather(first, old, new)
            batcher.close()
            return released

    released = asyncio.run(main())
    assert gated.batches == [[0, 0, 0, 0], [2, 1]]
    assert gated.started[1] - released < 0.15, gated.started[1] - released  # not the 0.3 s delay


def side_by_side(policy: BatchPolicy, lanes: int, change: BatchPolicy | None = None) -> list[object]:
    """The answers to two requests, the second sent while the first's batch runs, of a model
    whose batches each wait for another to run beside them (up to half a second). `change`, with
    every lane, is applied between them; before it the batcher has the first lane only."""
    side = threading.Barrier(2, timeout=0.5)

    def run(inputs: Arrays) -> tuple[Arrays, int]:
        side.wait()
        return {"y": inputs["x"]}, 0

    async def main() -> list[object]:
        pools = [ThreadPoolExecutor(1) for _ in range(lanes)]
        try:
            batcher = Batcher(run, policy, pools if change is None else pools[:1])
            first = asyncio.ensure_future(batcher.submit(tag(1), 1))
            await asyncio.sleep(0.05)  # its batch is running, alone
            if change is not None:
                batcher.reconfigure(change, pools)
            second = asyncio.ensure_future(batcher.submit(tag(2), 1))
            answers = await asyncio.gather(first, second, return_exceptions=True)
            batcher.close()
            return answers
        finally:
            for pool in pools:
                pool.shutdown()

    return asyncio.run(main())


def test_instances_run_batches_side_by_side() -> None:
    """Triton's instance_group count: with two instances the second request's batch runs on
    the second lane while the first's runs; with one it waits, and the first's batch, alone,
    gives up waiting for a partner."""
    assert [type(a) for a in side_by_side(BatchPolicy(4, instances=2), lanes=2)] == [tuple, tuple]
    one = side_by_side(BatchPolicy(4), lanes=2)
    assert isinstance(one[0], threading.BrokenBarrierError), one
    # More instances than lanes: one batch a lane.
    assert isinstance(side_by_side(BatchPolicy(4, instances=2), lanes=1)[0], threading.BrokenBarrierError)


def test_a_change_of_instances_applies_to_the_next_batch() -> None:
    answers = side_by_side(BatchPolicy(4), lanes=2, change=BatchPolicy(4, instances=2))
    assert [type(a) for a in answers] == [tuple, tuple], answers


def test_closing_answers_the_requests_of_every_running_batch() -> None:
    gated = Gated()

    async def main() -> list[object]:
        with ThreadPoolExecutor(1) as a, ThreadPoolExecutor(1) as b:
            batcher = Batcher(gated, BatchPolicy(2, instances=2), [a, b])
            first = asyncio.ensure_future(batcher.submit(tag(1), 1))
            await asyncio.sleep(0.05)
            second = asyncio.ensure_future(batcher.submit(tag(2), 1))
            await asyncio.sleep(0.05)  # both batches are running
            batcher.close()
            answers = await asyncio.wait_for(asyncio.gather(first, second, return_exceptions=True), 5)
            gated.gate.set()
            return answers

    answers = asyncio.run(main())
    assert all(isinstance(a, UnavailableError) for a in answers), answers
    assert gated.batches == [[1], [2]] or gated.batches == [[2], [1]]


def test_a_batcher_serves_again_after_closing() -> None:
    """A request after a close starts the batching loop again, which finds its lane free."""
    recorder = Recorder()

    async def main() -> tuple[Arrays, int]:
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(recorder, BatchPolicy(4), [pool])
            await batcher.submit(tag(1), 1)
            await asyncio.sleep(0.02)  # the loop waits for the next batch, holding the lane
            batcher.close()
            await asyncio.sleep(0.02)
            answer = await asyncio.wait_for(batcher.submit(tag(2), 1), 5)
            batcher.close()
            return answer

    assert asyncio.run(main())[1] == 1


def test_lanes_taken_away_and_given_back_while_busy_run_one_batch_each() -> None:
    """Two batches hold both lanes while the instances go down to one and back up to two: once
    they end, the two lanes serve two batches side by side again, one on each."""
    gate, side = threading.Event(), threading.Barrier(2, timeout=1)

    def run(inputs: Arrays) -> tuple[Arrays, int]:
        if inputs["x"][0, 0] < 10:
            gate.wait(5)  # the first two batches hold their lanes
        else:
            side.wait()  # the last two run only beside each other
        return {"y": inputs["x"]}, 0

    async def main() -> list[object]:
        with ThreadPoolExecutor(1) as a, ThreadPoolExecutor(1) as b:
            batcher = Batcher(run, BatchPolicy(4, instances=2), [a, b])
            held = []
            for n in (1, 2):
                held.append(asyncio.ensure_future(batcher.submit(tag(n), 1)))
                await asyncio.sleep(0.05)  # a batch of its own
            batcher.reconfigure(BatchPolicy(4), [a])
            await asyncio.sleep(0.01)
            batcher.reconfigure(BatchPolicy(4, instances=2), [a, b])
            await asyncio.sleep(0.01)
            gate.set()
            await asyncio.gather(*held)
            first = asyncio.ensure_future(batcher.submit(tag(11), 1))
            await asyncio.sleep(0.05)
            answers = await asyncio.gather(first, batcher.submit(tag(12), 1), return_exceptions=True)
            batcher.close()
            return answers

    answers = asyncio.run(main())
    assert [type(a) for a in answers] == [tuple, tuple], answers


def test_an_adaptive_delay_does_not_wait_for_requests_running_on_another_lane() -> None:
    """Two clients made the recent peak 2. While one's request runs long on one lane, the
    other's batch on the second lane closes at once: the running request cannot join it."""

    def run(inputs: Arrays) -> tuple[Arrays, int]:
        if inputs["x"][0, 0] == 9:
            time.sleep(0.5)
        return {"y": inputs["x"]}, 0

    async def main() -> float:
        with ThreadPoolExecutor(1) as a, ThreadPoolExecutor(1) as b:
            policy = BatchPolicy(8, max_queue_delay_us=2_000_000, adaptive_queue_delay=True, instances=2)
            batcher = Batcher(run, policy, [a, b])
            for _ in range(PEAK_CYCLES + 2):
                await asyncio.gather(batcher.submit(tag(1), 1), batcher.submit(tag(1), 1))
            long = asyncio.ensure_future(batcher.submit({"x": np.full((8, 4), 9, np.float32)}, 8))
            await asyncio.sleep(0.05)  # a full batch: it runs at once
            began = time.monotonic()
            await batcher.submit(tag(1), 1)
            waited = time.monotonic() - began
            await long
            batcher.close()
            return waited

    assert asyncio.run(main()) < 1.0  # not the 2 s delay


def test_a_request_whose_client_hung_up_is_not_run() -> None:
    """Behind a long batch: a request whose client is gone is answered so and not run, once it
    has waited past GONE_CHECK_S; one still wanted runs; a client is not asked sooner."""
    gated, asked = Gated(), []

    def client(there: bool, n: int) -> Callable[[], Awaitable[bool]]:
        async def gone() -> bool:
            asked.append(n)
            return not there

        return gone

    async def main() -> list[object]:
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(gated, BatchPolicy(4), [pool])
            first = asyncio.ensure_future(batcher.submit(tag(0), 1, gone=client(False, 0)))
            await asyncio.sleep(0.01)  # its batch runs at once: no one is asked
            left, stayed = (
                asyncio.ensure_future(batcher.submit(tag(n), 1, gone=client(n == 2, n))) for n in (1, 2)
            )
            await asyncio.sleep(GONE_CHECK_S * 2)
            gated.gate.set()
            answers = await asyncio.gather(first, left, stayed, return_exceptions=True)
            batcher.close()
            return answers

    first, left, stayed = asyncio.run(main())
    assert isinstance(left, ClientGoneError), left
    assert isinstance(first, tuple) and isinstance(stayed, tuple)
    assert gated.batches == [[0], [2]]
    assert asked == [1, 2]


@pytest.mark.parametrize("deadline_s", [None, 10.0])
def test_a_request_of_a_model_that_cannot_batch_is_not_run_once_its_client_hung_up(
    deadline_s: float | None,
) -> None:
    """Waiting for a thread, as a batching model's requests wait for a batch: a request whose
    client hung up is answered so when a thread takes it up, and not run; the thread asks the
    event loop only for a request that waited past GONE_CHECK_S, and one that cannot say runs."""
    gated, asked = Gated(), []

    def client(answer: bool | None, n: int) -> Callable[[], Awaitable[bool]]:
        async def gone() -> bool:
            asked.append(n)
            if answer is None:
                raise OSError("cannot say")
            return answer

        return gone

    async def main() -> list[object]:
        with ThreadPoolExecutor(1) as pool:  # one thread: the others wait for it
            batcher = Batcher(gated, BatchPolicy(1), [pool])
            deadline = None if deadline_s is None else time.monotonic() + deadline_s
            first = asyncio.ensure_future(batcher.submit(tag(0), 1, deadline, gone=client(True, 0)))
            await asyncio.sleep(0.01)  # it runs at once: its client is not asked
            waiting = [
                asyncio.ensure_future(batcher.submit(tag(n), 1, deadline, gone=client(answer, n)))
                for n, answer in ((1, True), (2, False), (3, None))
            ]
            await asyncio.sleep(GONE_CHECK_S * 2)
            gated.gate.set()
            answers = await asyncio.gather(first, *waiting, return_exceptions=True)
            batcher.close()
            return answers

    first, left, stayed, unknown = asyncio.run(main())
    assert isinstance(left, ClientGoneError), left
    assert all(isinstance(a, tuple) for a in (first, stayed, unknown))
    assert gated.batches == [[0], [2], [3]]
    assert asked == [1, 2, 3]


def test_a_traced_requests_wait_for_its_lane_is_queue_time_as_in_the_statistics() -> None:
    """Behind another model's batch of 200 ms on the one lane: the trace counted the wait as
    inference (COMPUTE_INPUT_END to COMPUTE_OUTPUT_START), where the statistics count it queued."""
    phases: list[Phases] = []
    timings: list[BatchTiming] = []

    async def main() -> None:
        with ThreadPoolExecutor(1) as pool:
            other = Batcher(Recorder(0.2), BatchPolicy(4), [pool])
            traced = Batcher(Recorder(), BatchPolicy(4), [pool], timings.append)
            running = asyncio.ensure_future(other.submit({"x": requests(1)[0]}, 1))
            await asyncio.sleep(0.02)
            await traced.submit({"x": requests(1)[0]}, 1, on_run=phases.append)
            await running
            other.close()
            traced.close()

    asyncio.run(main())
    [seen], [timing] = phases, timings
    assert seen.output_start - seen.input_end == pytest.approx(timing.infer_s, abs=1e-6)
    assert seen.compute - seen.queued == pytest.approx(timing.queued_s[0], abs=1e-6)
    assert timing.queued_s[0] > 0.1 and timing.infer_s < 0.1


@pytest.mark.parametrize("max_batch_size", [4, 1])
def test_a_request_whose_client_hung_up_while_its_runner_loaded_is_not_run(max_batch_size: int) -> None:
    """The wait for a load counts towards GONE_CHECK_S: the batch formed at once after it, so no
    client was asked, and a burst of clients that gave up on a cold model all ran, as successes."""
    gated, asked = Gated(), []
    gated.gate.set()

    def client(there: bool, n: int) -> Callable[[], Awaitable[bool]]:
        async def gone() -> bool:
            asked.append(n)
            return not there

        return gone

    async def load() -> None:
        await asyncio.sleep(GONE_CHECK_S * 2)

    async def main() -> list[object]:
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(gated, BatchPolicy(max_batch_size), [pool])
            answers = await asyncio.gather(
                *(batcher.submit(tag(n), 1, gone=client(n == 1, n), ready=load) for n in (1, 2)),
                return_exceptions=True,
            )
            batcher.close()
            return answers

    stayed, left = asyncio.run(main())
    assert isinstance(left, ClientGoneError), left
    assert isinstance(stayed, tuple)
    assert gated.batches == [[1]]
    assert sorted(asked) == [1, 2]


def test_a_deadline_that_passes_while_the_thread_asks_still_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    """A model that cannot batch: its request is not run once its deadline passed while the
    thread that took it up waited for its client's answer (which never came in time)."""
    monkeypatch.setattr(batcher_module, "GONE_ASK_S", 0.5)
    gated = Gated()

    async def slow() -> bool:
        await asyncio.sleep(1.0)
        return False

    async def main() -> list[object]:
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(gated, BatchPolicy(1), [pool])
            first = asyncio.ensure_future(batcher.submit(tag(0), 1))
            await asyncio.sleep(0.01)
            # Taken up at 0.2 s, asked until 0.7 s: its deadline, at 0.4 s, passes meanwhile.
            late = asyncio.ensure_future(batcher.submit(tag(1), 1, time.monotonic() + 0.4, gone=slow))
            await asyncio.sleep(0.2)
            gated.gate.set()
            answers = await asyncio.gather(first, late, return_exceptions=True)
            await asyncio.sleep(0.6)  # the thread's ask has given up by now
            batcher.close()
            return answers

    first, late = asyncio.run(main())
    assert isinstance(first, tuple)
    assert isinstance(late, TimeoutExpiredError), late
    assert gated.batches == [[0]]


def test_clients_are_asked_at_once_and_a_failed_ask_or_a_deadline_still_counts() -> None:
    """Behind a long batch: the waiting requests' clients are all asked at once (the answers take
    a turn of the event loop each); one whose asking raises counts as there and runs; one whose
    deadline passes while it is asked is answered as expired, and does not run."""
    gated, asking, peak = Gated(), [0], [0]

    def client(n: int) -> Callable[[], Awaitable[bool]]:
        async def gone() -> bool:
            asking[0] += 1
            peak[0] = max(peak[0], asking[0])
            await asyncio.sleep(0.2 if n == 9 else 0.01)
            asking[0] -= 1
            if n == 1:
                raise RuntimeError("cannot tell")
            return False

        return gone

    async def main() -> list[object]:
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(gated, BatchPolicy(16), [pool])
            first = asyncio.ensure_future(batcher.submit(tag(0), 1))
            await asyncio.sleep(0.01)
            waiting = [asyncio.ensure_future(batcher.submit(tag(n), 1, gone=client(n))) for n in range(1, 9)]
            # Its deadline passes while its client is asked (0.2 s): after GONE_CHECK_S, before that.
            late = batcher.submit(tag(9), 1, time.monotonic() + GONE_CHECK_S * 2 + 0.05, gone=client(9))
            expiring = asyncio.ensure_future(late)
            await asyncio.sleep(GONE_CHECK_S * 2)
            gated.gate.set()
            answers = await asyncio.gather(first, *waiting, expiring, return_exceptions=True)
            batcher.close()
            return answers

    answers = asyncio.run(main())
    assert all(isinstance(a, tuple) for a in answers[:9]), answers
    assert isinstance(answers[9], TimeoutExpiredError), answers[9]
    assert peak[0] == 9  # all nine asked side by side
    assert gated.batches == [[0], list(range(1, 9))]


@pytest.mark.parametrize(("max_batch_size", "waiting"), [(2, 1), (1, 2)])
def test_waiting_requests_are_counted_until_they_start(max_batch_size: int, waiting: int) -> None:
    """Triton's pending count: requests waiting to run, not those running. A batch of 2 takes two
    of three requests; without batching, one thread takes one. Each is counted in and out once,
    an expired one too."""
    counts: list[int] = []

    def counted(change: int) -> None:
        counts.append((counts[-1] if counts else 0) + change)

    gate = threading.Event()

    def blocked(inputs: Arrays) -> tuple[Arrays, int]:
        gate.wait(5)
        return {"y": inputs["x"]}, 0

    async def main() -> int:
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(blocked, BatchPolicy(max_batch_size), [pool], on_waiting=counted)
            tasks = [asyncio.ensure_future(batcher.submit({"x": x}, 1)) for x in requests(3)]
            expiring = asyncio.ensure_future(batcher.submit({"x": requests(1)[0]}, 1, time.monotonic() + 0.1))
            await asyncio.sleep(0.3)
            while_blocked = counts[-1]
            with pytest.raises(TimeoutExpiredError):
                await expiring  # never ran: counted out when answered
            gate.set()
            await asyncio.gather(*tasks)
            batcher.close()
            return while_blocked

    while_blocked = asyncio.run(main())
    changes = [b - a for a, b in zip([0, *counts], counts, strict=False)]
    assert while_blocked == waiting and min(counts) >= 0 and counts[-1] == 0, counts
    assert changes.count(1) == changes.count(-1) == 4, counts


def test_log_lines_carry_the_request_id_of_their_own_request_only() -> None:
    """The batch loop starts inside the first request that needs it and outlives it: a later
    batch's failure was logged with that first request's id. A request that runs alone (a model
    that cannot batch) logs with its own id, from the inference thread too."""
    ids_at_log: list[str | None] = []
    ids_at_run: list[str | None] = []

    class Ids(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            ids_at_log.append(request_id.get())

    def run_alone(inputs: Arrays) -> tuple[Arrays, int]:
        ids_at_run.append(request_id.get())
        return Recorder()(inputs)

    async def main() -> None:
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(Recorder(), BatchPolicy(8, max_queue_delay_us=20_000), [pool])
            request_id.set("first")
            await batcher.submit({"x": requests(1)[0]}, 1)
            request_id.set("later")
            bad = np.full((1, 4), np.nan, np.float32)
            answers = [batcher.submit({"x": x}, 1) for x in (requests(1)[0], bad)]
            assert isinstance((await asyncio.gather(*answers, return_exceptions=True))[1], ValueError)
            batcher.close()
            alone = Batcher(run_alone, BatchPolicy(1), [pool])
            request_id.set("alone")
            await alone.submit({"x": requests(1)[0]}, 1)
            alone.close()

    handler, logger = Ids(level=logging.WARNING), logging.getLogger("kiln.batcher")
    logger.addHandler(handler)
    try:
        asyncio.run(main())
    finally:
        logger.removeHandler(handler)
    assert ids_at_log == [None]  # "a batch of 2 requests failed": no one request's
    assert ids_at_run == ["alone"]
