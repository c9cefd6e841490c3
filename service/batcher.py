"""Dynamic batching: concurrent requests for one runner are merged, run once and split back.

Like Triton's dynamic batcher: a batch closes when it reaches `max_batch_size`, or the largest
preferred size that the requests already queued can form, or at least the largest preferred size
(a request that would take it past that starts the next batch instead), or when its oldest
request has waited `max_queue_delay_us` since it arrived; a change of these settings applies to
the batch being collected too. Requests keep arriving while a batch runs, so under load
batches grow even with no delay at all. With `adaptive_queue_delay` a batch also closes, before
its delay, once the queue is empty and it holds as many live requests as were waiting or running
at once at the peak of this batch cycle and the PEAK_CYCLES before: with closed-loop clients
(each sends its next request when the last is answered) every client is then in it, and waiting
longer would add the delay to each request for a batch that is not coming (two clients of a
model whose batches fill to 8 under heavier load). Requests that could not join it (another
shape, too large) count towards the peak too: then it waits, as Triton does. `run` sees the
merged batch, so it can pick what runs it by the batch's size; what it returns beside the
outputs (the variant that ran) reaches every request of the batch. Past `max_queue_size`
requests waiting or running, new ones are refused at once with a 503, as Triton's queue policy
and TorchServe's job queue refuse them, rather than queued behind work their clients gave up
on; and a request still waiting at its deadline gets a 503 then, and never runs. Up to
`instances` batches run at once, each on a lane (an executor) of its own, as Triton runs a
model's instance_group: the next batch forms as soon as a lane is free.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Generic, TypeVar

import numpy as np

from service.errors import ClientGoneError, KilnError, QueueFullError, TimeoutExpiredError, UnavailableError
from service.store import StoreUnavailableError

Arrays = dict[str, np.ndarray]
T = TypeVar("T")  # what `run` returns beside the outputs
# Batch cycles whose peak of outstanding requests a batch may wait to reach: long enough that one
# quiet cycle does not end the batching of a steady load, short enough to follow a load that fell.
PEAK_CYCLES = 4
# A request that waited this long is asked, before it runs, whether its client is still there:
# under overload clients give up (and retry), and running what they left would only delay the
# requests still wanted. Asking costs about 20 us and a turn of the event loop, which a short
# wait is not worth.
GONE_CHECK_S = 0.05
# How long a thread that took up a request waits for the event loop to say whether its client
# is there, idle meanwhile: a loop that busy answers late, and the request runs.
GONE_ASK_S = 0.1
Gone = Callable[[], Awaitable[bool]]  # whether the request's client hung up
log = logging.getLogger("kiln.batcher")


@dataclass(frozen=True)
class BatchPolicy:
    max_batch_size: int
    max_queue_delay_us: int = 0
    preferred_batch_sizes: Sequence[int] = ()
    # Requests that may be waiting or running at once; past it, new ones get a 503. 0: no limit.
    max_queue_size: int = 0
    # Close a batch before its delay once it holds the recent peak of requests outstanding.
    adaptive_queue_delay: bool = False
    # Triton's priority levels (0: none): a request's priority, 1 the highest, else the default.
    priority_levels: int = 0
    default_priority_level: int = 0
    # Batches that may run at once (Triton's instance_group count), on as many lanes.
    instances: int = 1

    def level(self, priority: int) -> int:
        """The queue a request of this `priority` parameter waits in; 0 (none given) or out of
        range is the default level, as in Triton."""
        return priority if 1 <= priority <= self.priority_levels else self.default_priority_level


@dataclass(frozen=True)
class BatchTiming:
    """Where one execution's time went, in the phases of Triton's statistics extension. Only
    executions that succeeded report one: a merged batch that failed is not an execution, and
    its time falls in the queue time of its requests, which then run again one at a time. Only
    the requests it answered are in it: one given up on while it ran (a gRPC call cancelled) is
    a failure, and an execution that answered none is not reported, as a request that runs alone
    and is cancelled cannot be."""

    batch_size: int  # rows the model ran
    inferred: int  # rows of the requests it answered: Triton's inference count
    queued_s: list[float]  # per request answered: from its arrival until its batch started to run
    input_s: float  # merging the requests' inputs into one batch
    infer_s: float  # running the model
    output_s: float  # splitting the outputs back


@dataclass(frozen=True)
class Phases:
    """When one request's phases began, in time.monotonic(): Triton's trace timestamps. The
    compute phases are its batch's."""

    queued: float  # it arrived at the queue
    compute: float  # its batch began: its inputs merged
    input_end: float  # the model began to run
    output_start: float  # the model returned
    compute_end: float  # its outputs were split back


@dataclass(eq=False)  # compared by identity: removing one from a queue must not compare arrays
class _Request(Generic[T]):
    inputs: Arrays
    batch: int
    future: asyncio.Future[tuple[Arrays, T]]
    deadline: float | None  # time.monotonic() past which it is not run
    priority: int = 0  # the request's parameter
    level: int = 0  # its priority level under the batcher's policy: lower levels are batched first
    gone: Gone | None = None
    waiting: _Waiting | None = None
    on_run: Callable[[Phases], None] | None = None  # told when it ran (a traced request)
    # Submitted, maybe before its runner's load: from then its client is asked (GONE_CHECK_S).
    submitted: float = field(default_factory=time.monotonic)
    started: bool = field(init=False, default=False)  # its batch began: it is answered
    # Requests merge only when every non-batch dimension agrees.
    signature: tuple[tuple[str, tuple[int, ...], str], ...] = field(init=False)
    arrived: float = field(init=False, default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.signature = tuple(
            (name, arr.shape[1:], arr.dtype.str) for name, arr in sorted(self.inputs.items())
        )


class _Queue(Generic[T]):
    """The waiting requests: a deque per priority level, as in Triton, taken from the lowest
    level first and in arrival order within one. O(1) to add, O(levels waiting) to take."""

    def __init__(self) -> None:
        self._levels: dict[int, deque[_Request[T]]] = {}  # never an empty deque

    def append(self, request: _Request[T]) -> None:
        self._levels.setdefault(request.level, deque()).append(request)

    def appendleft(self, request: _Request[T]) -> None:
        self._levels.setdefault(request.level, deque()).appendleft(request)

    def popleft(self) -> _Request[T]:
        level = min(self._levels)
        waiting = self._levels[level]
        request = waiting.popleft()
        if not waiting:
            del self._levels[level]
        return request

    def remove(self, request: _Request[T]) -> None:
        """ValueError when it is not waiting."""
        waiting = self._levels.get(request.level)
        if waiting is None:
            raise ValueError("not queued")
        waiting.remove(request)
        if not waiting:
            del self._levels[request.level]

    def relevel(self, policy: BatchPolicy) -> None:
        """Under a new policy: each request at the level it gives, in arrival order."""
        waiting = sorted(self, key=lambda r: r.arrived)
        self._levels.clear()
        for request in waiting:
            request.level = policy.level(request.priority)
            self.append(request)

    def clear(self) -> None:
        self._levels.clear()

    def __iter__(self) -> Iterator[_Request[T]]:
        return itertools.chain.from_iterable(self._levels[level] for level in sorted(self._levels))

    def __len__(self) -> int:
        return sum(map(len, self._levels.values()))

    def __bool__(self) -> bool:
        return bool(self._levels)


class Batcher(Generic[T]):
    def __init__(
        self,
        run: Callable[[Arrays], tuple[Arrays, T]],
        policy: BatchPolicy,
        lanes: Sequence[Executor],
        on_batch: Callable[[BatchTiming], None] | None = None,
        on_pending: Callable[[int], None] | None = None,
        on_waiting: Callable[[int], None] | None = None,
    ) -> None:
        """`lanes`: where batches run, one at a time on each; a policy of max_batch_size 1 runs
        its requests side by side on the first. `on_batch` is called after every execution
        that succeeded, `on_pending(change)` as requests arrive (+1) and are answered (-1), and
        `on_waiting(change)` as they arrive (+1) and start to run, or are answered without (-1):
        from an executor thread when a request that runs alone starts."""
        self.run = run
        self.policy = policy
        self.lanes = list(lanes)
        # Each lane is idle, or held: by the batch being collected or by one running. A lane
        # dropped by `reconfigure` while held is released by its batch and not taken again.
        self._held: set[Executor] = set()
        self._freed = asyncio.Event()
        self.on_batch = on_batch
        self.on_pending = on_pending
        self.on_waiting = on_waiting
        # Not an asyncio.Queue: the collector looks at what is queued to pick a preferred size,
        # and puts back a request that starts the next batch.
        self._queue: _Queue[T] = _Queue()
        # Set when a request arrives or the policy changes: either may close the batch collected.
        self._wake = asyncio.Event()
        self._batch: list[_Request[T]] = []  # being collected
        self._running: dict[asyncio.Task[None], list[_Request[T]]] = {}  # batches, by their task
        self._task: asyncio.Task[None] | None = None
        self._events = asyncio.get_running_loop()  # made by a request: `drain` reaches it from threads
        self._drained: Future[None] | None = None  # draining: answered once no request is pending
        self._limit: asyncio.TimerHandle | None = None  # when a drain gives up on those waiting
        self._gave_up = asyncio.Event()  # that limit passed: those still waiting for a load too
        self._pending = 0  # submitted and not yet answered; only touched on the event loop
        # The most requests pending at once in this batch cycle, and in the last PEAK_CYCLES; a
        # new batcher has seen no load yet, so it waits as if batches could fill.
        self._peak = 0
        self._peaks: deque[int] = deque([policy.max_batch_size], maxlen=PEAK_CYCLES)

    async def submit(
        self,
        inputs: Arrays,
        batch: int,
        deadline: float | None = None,
        priority: int = 0,
        gone: Gone | None = None,
        on_run: Callable[[Phases], None] | None = None,
        ready: Callable[[], Awaitable[None]] | None = None,
    ) -> tuple[Arrays, T]:
        """The request's outputs; a TimeoutExpiredError at `deadline` (time.monotonic()) if it
        has not started to run by then, as Triton's queue policy rejects it: it never runs.
        `priority` is the request's parameter (see BatchPolicy.level). A batched request that
        waited past GONE_CHECK_S and whose client is `gone` then gets a ClientGoneError, and
        does not run; so does one of a model that cannot batch, once a thread takes it up.
        `on_run` is told when its phases began, once it ran. `ready` (its runner's load) is
        awaited before the request queues, the request waiting and counted against
        max_queue_size meanwhile."""
        if self._drained is not None:
            raise _stopped()
        limit = self.policy.max_queue_size
        if limit and self._pending >= limit:
            raise QueueFullError(
                f"{self._pending} requests are already waiting or running for this model (its "
                f"max_queue_size); send this one again shortly, or raise max_queue_size"
            )
        self._count(1)
        submitted = time.monotonic()
        waiting = _Waiting(self.on_waiting)
        try:
            if ready is not None:
                await self._until(ready, deadline)
            if self.policy.max_batch_size == 1:
                return await self._run_alone(inputs, batch, deadline, waiting, gone, on_run, submitted)
            if self._task is None or self._task.done():
                # A context of its own: the loop outlives the request that starts it, and what
                # it logs is no more that request's than any other's.
                self._task = asyncio.get_running_loop().create_task(
                    self._loop(), context=contextvars.Context()
                )
            future: asyncio.Future[tuple[Arrays, T]] = asyncio.get_running_loop().create_future()
            level = self.policy.level(priority)
            request = _Request(
                inputs, batch, future, deadline, priority, level, gone, waiting, on_run, submitted
            )
            self._queue.append(request)
            self._wake.set()
            expiry = None
            if deadline is not None:
                expiry = asyncio.get_running_loop().call_later(
                    deadline - time.monotonic(), self._expire, request
                )
            try:
                return await future
            finally:
                if expiry is not None:
                    expiry.cancel()
                if future.cancelled() and not request.started:
                    # Given up on (a gRPC call cancelled, a stream closed): out of the queue,
                    # with its inputs, as it is out of the count that max_queue_size bounds.
                    with contextlib.suppress(ValueError):  # taken into the batch forming
                        self._queue.remove(request)
        finally:
            waiting.left()
            self._count(-1)

    def reconfigure(self, policy: BatchPolicy, lanes: Sequence[Executor] | None = None) -> None:
        """Serve by `policy` from now on, and on `lanes` when given: the waiting requests take
        the priority levels it gives, and a batch running on a lane no longer listed finishes
        there. Safe from any thread."""
        # Batching turned on or off (dynamic_batching): the load seen so far says nothing of it.
        peaks = None if policy.max_batch_size == self.policy.max_batch_size else policy.max_batch_size
        self.policy = policy
        task = self._task
        if task is not None and not task.done():
            task.get_loop().call_soon_threadsafe(self._reconfigured, policy, lanes, peaks)
        else:  # nothing waits, nor runs
            self._adopt(lanes, peaks)

    def _reconfigured(self, policy: BatchPolicy, lanes: Sequence[Executor] | None, peaks: int | None) -> None:
        self._queue.relevel(policy)
        self._adopt(lanes, peaks)
        self._freed.set()  # more instances, or lanes, may let the next batch form
        self._wake.set()  # a shorter delay or another preferred size may close the batch collected

    def _adopt(self, lanes: Sequence[Executor] | None, peaks: int | None) -> None:
        if lanes is not None:
            self.lanes = list(lanes)
        if peaks is not None:
            self._peaks = deque([peaks], maxlen=PEAK_CYCLES)

    def _count(self, change: int) -> None:
        self._pending += change
        self._peak = max(self._peak, self._pending)
        if self.on_pending is not None:
            try:
                self.on_pending(change)
            except Exception:
                log.exception("pending requests callback failed")
        if change < 0 and self._drained is not None:
            self._stop_if_drained()

    async def _run_alone(
        self,
        inputs: Arrays,
        batch: int,
        deadline: float | None,
        waiting: _Waiting,
        gone: Gone | None,
        on_run: Callable[[Phases], None] | None,
        submitted: float,
    ) -> tuple[Arrays, T]:
        """A model that cannot batch runs its requests side by side in the executor, as Triton
        runs a model's instances, instead of one at a time behind the queue: every runner is
        safe to call from several threads (those that are not hold a lock of their own)."""
        alone = _Alone(time.monotonic(), submitted, waiting, gone, asyncio.get_running_loop())
        if deadline is None:
            result, began, ended = await self._run_timed(inputs, self.lanes[0], alone=alone)
        else:
            result, began, ended = await self._run_timed_within(inputs, deadline, alone)
        self._report(BatchTiming(batch, batch, [began - alone.arrived], 0.0, ended - began, 0.0))
        if on_run is not None:
            _tell(on_run, Phases(alone.arrived, began, began, ended, ended))
        return result

    async def _run_timed(
        self, inputs: Arrays, lane: Executor, claim: _Claim | None = None, alone: _Alone | None = None
    ) -> tuple[tuple[Arrays, T], float, float]:
        """`run` in the executor, with when it began and ended there: a request waits for an
        executor thread as it waits for a batch, and both count as its queue time. Not run if
        its `claim` expired while it waited for a thread, or its client hung up meanwhile."""

        def timed() -> tuple[tuple[Arrays, T], float, float]:
            # Asked first: a deadline that passes while the client is asked still counts, and
            # the asking is queue time, the request still waiting.
            if alone is not None and alone.hung_up(time.monotonic()):
                raise ClientGoneError("the client hung up while its request waited")
            began = time.monotonic()
            if claim is not None and not claim.start():
                raise _expired()
            if alone is not None:
                alone.waiting.left()
            return self.run(inputs), began, time.monotonic()

        # In the caller's context: what a request that runs alone logs carries its id.
        return await asyncio.get_running_loop().run_in_executor(lane, contextvars.copy_context().run, timed)

    async def _run_timed_within(
        self, inputs: Arrays, deadline: float, alone: _Alone
    ) -> tuple[tuple[Arrays, T], float, float]:
        """As `_run_timed`, answered at `deadline` if no thread has taken it up by then."""
        claim = _Claim(deadline)
        running = asyncio.ensure_future(self._run_timed(inputs, self.lanes[0], claim, alone))
        running.add_done_callback(_retrieve)  # read here if no one waits for it any more
        try:
            return await asyncio.wait_for(asyncio.shield(running), max(deadline - time.monotonic(), 0.0))
        except TimeoutError:
            if claim.expire():
                raise _expired() from None
            return await running  # it started in time: it is answered
        except asyncio.CancelledError:  # its client hung up: it need not run either
            if claim.expire():
                running.cancel()
            raise

    async def _idle_lane(self) -> Executor:
        """A lane to collect the next batch for, held until that batch has run: once fewer
        than `instances` batches run."""
        while True:
            idle = [lane for lane in self.lanes if lane not in self._held]
            if idle and len(self._running) < self.policy.instances:
                self._held.add(idle[0])
                return idle[0]
            self._freed.clear()
            await self._freed.wait()

    def _free(self, lane: Executor) -> None:
        self._held.discard(lane)
        self._freed.set()

    def _ran(self, lane: Executor, running: asyncio.Task[None]) -> None:
        del self._running[running]
        self._free(lane)

    @property
    def pending(self) -> int:
        """Requests submitted and not yet answered."""
        return self._pending

    def drain(self, limit_s: float) -> Future[None]:
        """Take no more requests (a 503) and stop once those in are answered, as Triton unloads
        a model: the requests waiting and running still run. Those still waiting for a batch
        `limit_s` from now get a 503; the batches running then finish, and the requests of a
        model that cannot batch all run, as they wait for a thread rather than a batch. Safe from
        any thread; the future is done once every request is answered (at once, on the event
        loop, for a batcher with none)."""
        drained: Future[None] = Future()

        def start() -> None:  # on the event loop, as submit's check of it is
            self._drained = drained
            self._limit = self._events.call_later(limit_s, self._give_up_waiting)
            self._stop_if_drained()

        try:
            self._events.call_soon_threadsafe(start)
        except RuntimeError:  # the loop is closed: no request is left to answer
            drained.set_result(None)
        return drained

    async def _until(self, ready: Callable[[], Awaitable[None]], deadline: float | None) -> None:
        """`ready` awaited; as for a request waiting in the queue, a TimeoutExpiredError at
        `deadline`, and a 503 at a drain's limit (an unload waited out the load, twice its limit)."""
        loading = asyncio.ensure_future(ready())
        gave_up = asyncio.ensure_future(self._gave_up.wait())
        timeout = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        try:
            await asyncio.wait({loading, gave_up}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gave_up.cancel()
            if not loading.done():
                loading.cancel()  # the request's wait alone: the load goes on for the others
        if self._gave_up.is_set():
            raise _stopped()
        if not loading.done() or loading.cancelled():
            raise _expired()
        loading.result()

    def _give_up_waiting(self) -> None:
        """A drain's limit: the requests not yet in a running batch get a 503."""
        self._gave_up.set()
        waiting = [*self._batch, *self._queue]
        self._queue.clear()
        for r in waiting:  # one in the batch being collected is then skipped there, as expired
            if not r.future.done():
                r.future.set_exception(_stopped())

    def _stop_if_drained(self) -> None:
        if self._drained is not None and not self._pending and not self._drained.done():
            self.close()
            if self._limit is not None:
                self._limit.cancel()
            self._drained.set_result(None)

    def close(self) -> None:
        """Stop the batching task; the requests still waiting get a 503. Safe from any thread."""
        task = self._task
        if task is not None and not task.done():
            task.get_loop().call_soon_threadsafe(task.cancel)

    async def _wait(self, timeout: float | None) -> None:
        """Until a request arrives, the policy changes or `timeout` passes."""
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout)

    def _largest(self) -> int:
        """The size no batch grows past: max_batch_size, or the largest preferred size, as Triton
        sends a batch that reached that at once, and one that the next request would take past
        it without that request."""
        policy = self.policy
        return min(policy.max_batch_size, max(policy.preferred_batch_sizes, default=policy.max_batch_size))

    def _fits(self, request: _Request[T], first: _Request[T], size: int) -> bool:
        return request.signature == first.signature and size + request.batch <= self._largest()

    def _recent_peak(self) -> int:
        return max(self._peak, *self._peaks)

    def _queued_grow_to_preferred(self, first: _Request[T], size: int) -> bool:
        """Whether the requests queued now, taken in order, would grow the batch to a larger
        preferred size: Triton runs the largest preferred batch it can form, not the first."""
        for request in self._queue:
            if not self._fits(request, first, size):
                return False
            size += request.batch
            if size in self.policy.preferred_batch_sizes:
                return True
        return False

    async def _collect(self) -> list[_Request[T]]:
        while not self._queue:
            await self._wait(None)
        first = self._queue.popleft()
        self._batch = batch = [first]
        size = first.batch
        # The delay counts from the oldest arrival in the batch, as in Triton: under load the
        # oldest request has often waited for the batch before this one already, and should not
        # wait a whole delay more. With priority levels a later one may come first, and an older
        # join it.
        oldest = first.arrived
        # The policy is read again at each turn: a change applies to the batch being collected.
        while size < self._largest():
            if size in self.policy.preferred_batch_sizes and not self._queued_grow_to_preferred(first, size):
                break
            # Requests running on other lanes count in the peak but cannot join this batch.
            expected = self._recent_peak() - sum(map(_live, self._running.values()))
            if self.policy.adaptive_queue_delay and not self._queue and _live(batch) >= expected:
                break
            if not self._queue:
                left = oldest + self.policy.max_queue_delay_us / 1e6 - time.monotonic()
                if left <= 0:
                    break
                await self._wait(left)
                continue
            # Requests already queued join even past the delay: they waited behind a running batch.
            request = self._queue.popleft()
            if not self._fits(request, first, size):
                self._queue.appendleft(request)  # starts the next batch
                break
            batch.append(request)
            size += request.batch
            oldest = min(oldest, request.arrived)
        self._peaks.append(self._peak)
        # What is outstanding now, beside batches running on other lanes: the last batch on this
        # lane is answered, though its requests' submit() may not yet have counted them out.
        self._peak = len(batch) + len(self._queue)
        return batch

    async def _loop(self) -> None:
        try:
            while True:
                lane = await self._idle_lane()  # a batch forms once it has somewhere to run
                try:
                    # Asked before they are marked started: one whose deadline passes meanwhile
                    # is still answered as expired, and not run.
                    requests = [r for r in await self._present(await self._collect()) if self._runnable(r)]
                except BaseException:  # closed, or a bug: a loop started later needs the lane
                    self._free(lane)
                    raise
                self._batch = []
                if not requests:
                    self._free(lane)
                    continue
                running = asyncio.get_running_loop().create_task(self._execute(requests, lane))
                self._running[running] = requests
                running.add_done_callback(partial(self._ran, lane))
        except asyncio.CancelledError:
            self._fail_waiting()
            # End normally: a stored CancelledError's traceback would keep this frame, and with
            # it the last batch's arrays, alive in a reference cycle after the batcher is dropped.
            return

    def _runnable(self, request: _Request[T]) -> bool:
        """Not given up on (expired, or its client hung up), and so started: its batch formed."""
        if request.deadline is not None and time.monotonic() > request.deadline:
            self._expire(request)  # its timer may not have fired yet
        request.started = not request.future.done()
        if request.started and request.waiting is not None:
            request.waiting.left()
        return request.started

    async def _present(self, requests: list[_Request[T]]) -> list[_Request[T]]:
        """Those whose clients are still there, as far as the ones that waited long can say: all
        asked at once, since each answer takes a turn or two of the event loop. One that cannot
        say (its check raised) counts as there."""
        now = time.monotonic()
        asked = [r for r in requests if r.gone is not None and now - r.submitted > GONE_CHECK_S]
        if not asked:
            return requests
        answers = await asyncio.gather(*(r.gone() for r in asked if r.gone), return_exceptions=True)
        left = set()
        for r, answer in zip(asked, answers, strict=True):
            if isinstance(answer, BaseException):
                log.debug("could not ask whether a request's client is there: %r", answer)
            elif answer:
                left.add(id(r))
                if not r.future.done():
                    r.future.set_exception(ClientGoneError("the client hung up while its request waited"))
        return [r for r in requests if id(r) not in left]

    def _expire(self, request: _Request[T]) -> None:
        """Its deadline passed: answered now, and out of the queue, where it would count towards
        a batch's size and hold its inputs, unless its batch formed already."""
        if request.started or request.future.done():
            return
        request.future.set_exception(_expired())
        with contextlib.suppress(ValueError):  # collected into the forming batch: skipped there
            self._queue.remove(request)

    def _fail_waiting(self) -> None:
        """Closed: every request still waiting or running gets an answer instead of hanging."""
        waiting = [*self._batch, *itertools.chain.from_iterable(self._running.values()), *self._queue]
        for running in self._running:
            running.cancel()
        self._batch = []
        self._queue.clear()
        error = _stopped()
        for r in waiting:
            if not r.future.done():
                r.future.set_exception(error)

    async def _execute(self, requests: list[_Request[T]], lane: Executor) -> None:
        """Run one batch. Whatever fails, fails its own requests: the loop must live on. A merged
        batch that fails runs again one request at a time, so that one request the model cannot
        take (an index out of range, say) fails alone and not the others it was batched with."""
        started = time.monotonic()
        try:
            inputs = [r.inputs for r in requests]
            if len(inputs) > 1 and sum(a.nbytes for i in inputs for a in i.values()) > MERGE_INLINE_BYTES:
                merged = await asyncio.to_thread(merge, inputs)
            else:
                merged = merge(inputs)
            merged_at = time.monotonic()
            (outputs, tag), began, ended = await self._run_timed(merged, lane)
            handed_back = time.monotonic()  # the wait for the event loop is no phase's
            parts = split(outputs, [r.batch for r in requests])
            split_at = time.monotonic()
        except Exception as exc:
            # The service's fault, not an input's: a rerun would only fail again (an outage of
            # the store, waited out once by each request).
            if len(requests) == 1 or isinstance(exc, KilnError | StoreUnavailableError):
                for r in requests:
                    if not r.future.done():
                        r.future.set_exception(exc)
                return
            log.warning("a batch of %d requests failed (%s); running them one at a time", len(requests), exc)
            # Even one left waiting runs again: the request that broke the batch may be one
            # given up on while it ran.
            for r in requests:
                if not r.future.done():
                    await self._execute([r], lane)
            return
        answered = []
        for r, part in zip(requests, parts, strict=True):
            if not r.future.done():
                if r.on_run is not None:
                    # Its compute starts as its batch's run does, merged just before: a wait for
                    # the lane (another model's batch on it) is queue time, as in the statistics.
                    computed_from = began - (merged_at - started)
                    _tell(r.on_run, Phases(r.arrived, computed_from, began, ended, split_at))
                r.future.set_result((part, tag))
                answered.append(r)
        if answered:
            queued = [began - r.arrived - (merged_at - started) for r in answered]
            size, inferred = sum(r.batch for r in requests), sum(r.batch for r in answered)
            compute = (merged_at - started, ended - began, split_at - handed_back)
            self._report(BatchTiming(size, inferred, queued, *compute))

    def _report(self, timing: BatchTiming) -> None:
        if self.on_batch is not None:
            try:
                self.on_batch(timing)
            except Exception:
                log.exception("batch statistics callback failed")


def _tell(on_run: Callable[[Phases], None], phases: Phases) -> None:
    """A request's phases, to whoever traces it: a bug there must not keep it unanswered."""
    try:
        on_run(phases)
    except Exception:
        log.exception("a request's phases callback failed")


def _live(requests: list[_Request[T]]) -> int:
    """How many are still unanswered: one that expired, or whose client hung up, is answered."""
    return sum(not r.future.done() for r in requests)


def _expired() -> TimeoutExpiredError:
    return TimeoutExpiredError("the request's timeout expired before it started to run; it was not run")


def _retrieve(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


class _Waiting:
    """A request among those waiting to run (Triton's pending count), which it leaves once: when
    it starts to run, or is answered without, from whichever thread comes first."""

    def __init__(self, counted: Callable[[int], None] | None) -> None:
        self._counted = counted
        self._lock = threading.Lock()
        self._waiting = self._count(1)  # a count that failed is not taken back

    def left(self) -> None:
        with self._lock:
            if not self._waiting:
                return
            self._waiting = False
        self._count(-1)

    def _count(self, change: int) -> bool:
        if self._counted is None:
            return False
        try:
            self._counted(change)
        except Exception:
            log.exception("waiting requests callback failed")
            return False
        return True


def _stopped() -> UnavailableError:
    return UnavailableError(
        "the model stopped serving here (unloaded, deleted, or the server is stopping) while this "
        "request waited for it"
    )


@dataclass
class _Alone:
    """A request of a model that cannot batch, as the thread that takes it up sees it."""

    arrived: float
    submitted: float  # as _Request.submitted
    waiting: _Waiting
    gone: Gone | None
    loop: asyncio.AbstractEventLoop

    def hung_up(self, now: float) -> bool:
        """Whether its client hung up, asked (of the event loop, from the thread) only once it
        waited past GONE_CHECK_S, as a batch's requests are. One that cannot say is there."""
        gone = self.gone
        if gone is None or now - self.submitted <= GONE_CHECK_S:
            return False

        async def ask() -> bool:
            return await gone()

        asking = ask()
        try:
            answer = asyncio.run_coroutine_threadsafe(asking, self.loop)
        except RuntimeError:  # the loop closed: the server is stopping
            asking.close()
            return False
        try:
            return bool(answer.result(GONE_ASK_S))
        except Exception as exc:
            answer.cancel()
            log.debug("could not ask whether a request's client is there: %r", exc)
            return False


class _Claim:
    """Who first takes a request that runs alone: the thread that runs it, or its timeout."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self._lock = threading.Lock()
        self._state: str | None = None

    def start(self) -> bool:
        with self._lock:
            self._state = self._state or ("started" if time.monotonic() <= self.deadline else "expired")
            return self._state == "started"

    def expire(self) -> bool:
        with self._lock:
            self._state = self._state or "expired"
            return self._state == "expired"


# Inputs this small are merged on the event loop, where a thread's round trip costs more than
# the copy; a larger batch's would stall every other request (8 inputs of 13 MB took 30 ms).
MERGE_INLINE_BYTES = 256 * 1024


def merge(parts: list[Arrays]) -> Arrays:
    if len(parts) == 1:
        return parts[0]
    return {name: np.concatenate([p[name] for p in parts], axis=0) for name in parts[0]}


def split(outputs: Arrays, sizes: list[int]) -> list[Arrays]:
    if len(sizes) == 1:
        return [outputs]
    total = sum(sizes)
    for name, value in outputs.items():
        if value.ndim == 0 or value.shape[0] != total:
            raise ValueError(f"output {name!r} has no batch dimension; it cannot be split back")
    offsets = np.cumsum([0, *sizes])
    return [
        {name: np.ascontiguousarray(value[offsets[i] : offsets[i + 1]]) for name, value in outputs.items()}
        for i in range(len(sizes))
    ]
