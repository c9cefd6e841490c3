"""Per model-version inference statistics, in the shape of Triton's statistics extension, so
that what reads Triton's (perf_analyzer's server-side report, tritonclient's
get_inference_statistics) reads Kiln's: requests' queue time apart from their compute. The same
numbers feed Triton's Prometheus series (`nv_inference_*`, service.metrics)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import defaultdict
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from prometheus_client import Gauge, Histogram

from service import metrics
from service.batcher import BatchTiming
from service.errors import ClientGoneError, DeletedError, KilnError, QueueFullError, TimeoutExpiredError
from service.store import StoreError

US = 1e6
M = TypeVar("M", Gauge, Histogram)
REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")


def failure_reason(exc: BaseException) -> str:
    """Triton's `reason` of a failed request: what refused it, or the model's own failure."""
    if isinstance(exc, QueueFullError | TimeoutExpiredError):
        return "REJECTED"
    if isinstance(exc, ClientGoneError | asyncio.CancelledError):
        return "CANCELED"
    if isinstance(exc, KilnError | StoreError):  # the service's own: unloaded, the store down...
        return "OTHER"
    return "BACKEND"  # what the model raised


@dataclass
class _Count:
    value: int = 0
    series: Gauge | None = None  # Triton's Prometheus series of the same number

    def add(self, count: int) -> None:
        self.value += count
        if self.series is not None:
            self.series.inc(count)


@dataclass
class _Duration:
    count: int = 0
    ns: int = 0
    # Triton's Prometheus series of the same numbers, where it has them: a count, microseconds.
    counted: Gauge | None = None
    us: Gauge | None = None

    def add(self, seconds: float, count: int = 1) -> None:
        self.count += count
        self.ns += int(seconds * 1e9) * count
        if self.counted is not None:
            self.counted.inc(count)
        if self.us is not None:
            self.us.inc(seconds * count * US)

    def add_each(self, seconds: list[float]) -> None:
        """One of each duration, its series moved once."""
        self.count += len(seconds)
        self.ns += sum(int(s * 1e9) for s in seconds)
        if self.counted is not None:
            self.counted.inc(len(seconds))
        if self.us is not None:
            self.us.inc(sum(seconds) * US)

    def doc(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass
class _Compute:
    input: _Duration = field(default_factory=_Duration)
    infer: _Duration = field(default_factory=_Duration)
    output: _Duration = field(default_factory=_Duration)

    def add(self, timing: BatchTiming, count: int) -> None:
        self.input.add(timing.input_s, count)
        self.infer.add(timing.infer_s, count)
        self.output.add(timing.output_s, count)

    def doc(self) -> dict[str, dict[str, int]]:
        return {
            "compute_input": self.input.doc(),
            "compute_infer": self.infer.doc(),
            "compute_output": self.output.doc(),
        }


@dataclass
class ModelStats:
    inference_count: _Count  # samples (batch elements) inferred and answered
    execution_count: _Count  # model runs: fewer than requests when batching merges them
    success: _Duration
    queue: _Duration
    # Per request, as Triton counts them: each request of a batch is charged the batch's times.
    compute: _Compute
    # Response cache: a hit's lookup answers the request; a miss's lookup and insertion.
    cache_hit: _Duration
    cache_miss: _Duration
    fail: _Duration = field(default_factory=_Duration)  # Triton counts failures by reason
    batches: dict[int, _Compute] = field(default_factory=lambda: defaultdict(_Compute))
    last_inference_ms: int = 0

    @classmethod
    def of(cls, name: str, version: int) -> ModelStats:
        """A version's statistics, each fed to its Triton series, labelled once (a lookup per
        request would cost more); every series exists from now, at 0."""
        labels = (name, str(version))
        for reason in REASONS:
            metrics.NV_REQUEST_FAILURE.labels(*labels, reason)
        metrics.NV_PENDING.labels(*labels)
        return cls(
            inference_count=_Count(series=metrics.NV_INFERENCE_COUNT.labels(*labels)),
            execution_count=_Count(series=metrics.NV_EXEC_COUNT.labels(*labels)),
            success=_Duration(
                counted=metrics.NV_REQUEST_SUCCESS.labels(*labels), us=metrics.NV_REQUEST_US.labels(*labels)
            ),
            queue=_Duration(us=metrics.NV_QUEUE_US.labels(*labels)),
            compute=_Compute(
                _Duration(us=metrics.NV_COMPUTE_INPUT_US.labels(*labels)),
                _Duration(us=metrics.NV_COMPUTE_INFER_US.labels(*labels)),
                _Duration(us=metrics.NV_COMPUTE_OUTPUT_US.labels(*labels)),
            ),
            cache_hit=_Duration(
                counted=metrics.NV_CACHE_HITS.labels(*labels), us=metrics.NV_CACHE_HIT_US.labels(*labels)
            ),
            cache_miss=_Duration(
                counted=metrics.NV_CACHE_MISSES.labels(*labels), us=metrics.NV_CACHE_MISS_US.labels(*labels)
            ),
        )


def deleted_error(name: str, version: int) -> DeletedError:
    return DeletedError(f"version {version} of {name!r} was deleted")


class Stats:
    def __init__(self) -> None:
        self._models: dict[tuple[str, int], ModelStats] = {}
        self._lock = threading.Lock()
        # Models with series here: those of the model alone outlive its versions' statistics.
        self._seen: set[str] = set()
        # Versions forgotten as deleted. Their numbers are never reused, so none counts again
        # here, as a request of theirs still in flight would: its series back, with no
        # statistics left to find them by.
        self._deleted: set[tuple[str, int]] = set()

    def start(self, name: str, version: int) -> None:
        """A version loads: its series exist from now, at 0, as Triton makes them at a model's
        load, so that rate() and increase() count its first requests and failures. DeletedError
        for a deleted one."""
        with self._lock:
            if self._of(name, version) is None:
                raise deleted_error(name, version)

    def deleted(self, name: str, version: int) -> bool:
        with self._lock:
            return (name, version) in self._deleted

    def _of(self, name: str, version: int) -> ModelStats | None:
        """Under the lock; None for a deleted version."""
        stats = self._models.get((name, version))
        if stats is None:
            if (name, version) in self._deleted:
                return None
            stats = self._models[(name, version)] = ModelStats.of(name, version)
            self._seen.add(name)
        return stats

    def labelled(self, metric: M, name: str, version: int, per_version: bool = False) -> M:
        """The child of one of a model's series, or of its version's, that a batcher or a load
        keeps moving. DeletedError for a deleted version: its request fails as if routed after."""
        with self._lock:
            if (name, version) in self._deleted:
                raise deleted_error(name, version)
            self._seen.add(name)
            return metric.labels(name, str(version)) if per_version else metric.labels(name)

    def models(self) -> set[str]:
        """The models with series here."""
        with self._lock:
            return set(self._seen)

    def versions(self, name: str) -> set[int]:
        """A model's versions with statistics here."""
        with self._lock:
            return {number for model, number in self._models if model == name}

    def forget(self, name: str, held: Collection[int], stored: Collection[int]) -> None:
        """Of the versions `held` here before the store was read, those it no longer has
        (`stored`) were deleted: their statistics and series go, and with the model's last version
        the model's series, as Triton's go with a model it unloads. A version counted since that
        read is newer than it, and stays."""
        with self._lock:
            gone = set(held) - set(stored)
            self._deleted.update((name, number) for number in gone)
            for number in gone:  # a concurrent forget (DELETE and sweep) may have taken it
                self._models.pop((name, number), None)
            if not stored and all(model != name for model, _ in self._models):
                self._seen.discard(name)
                metrics.forget(name, None)
            elif gone:
                metrics.forget(name, gone)

    def answered(
        self, name: str, version: int, seconds: float, total_s: float, backend: str, target: str
    ) -> None:
        """A request answered in `seconds` from its inputs' check (`total_s` from its arrival) by
        a variant of `backend` for `target`."""
        with self._lock:
            stats = self._of(name, version)
            if stats is not None:
                stats.success.add(seconds)
                stats.last_inference_ms = int(time.time() * 1000)
                metrics.REQUEST_SECONDS.labels(name, str(version), backend, target).observe(total_s)

    def failed(self, name: str, version: int, seconds: float, reason: str) -> None:
        """A request failed for `reason` (failure_reason)."""
        with self._lock:
            stats = self._of(name, version)
            if stats is not None:
                stats.fail.add(seconds)
                stats.last_inference_ms = int(time.time() * 1000)
                metrics.NV_REQUEST_FAILURE.labels(name, str(version), reason).inc()

    def cache_hit(self, name: str, version: int, seconds: float, total_s: float) -> None:
        """A request answered from the response cache: a success that never queued, as Triton
        counts it, and no inference or execution."""
        with self._lock:
            stats = self._of(name, version)
            if stats is not None:
                stats.cache_hit.add(seconds)
                stats.success.add(seconds)
                stats.queue.add(0.0)
                stats.last_inference_ms = int(time.time() * 1000)
                metrics.RESPONSE_CACHE.labels(name, "hit").inc()
                metrics.REQUEST_SECONDS.labels(name, str(version), "cache", "").observe(total_s)

    def cache_miss(self, name: str, version: int, seconds: float) -> None:
        """The lookup and the insertion of a request that then ran."""
        with self._lock:
            stats = self._of(name, version)
            if stats is not None:
                stats.cache_miss.add(seconds)
                metrics.RESPONSE_CACHE.labels(name, "miss").inc()

    def execution(self, name: str, version: int, timing: BatchTiming) -> None:
        with self._lock:
            stats = self._of(name, version)
            if stats is None:
                return
            stats.execution_count.add(1)
            stats.inference_count.add(timing.inferred)
            stats.queue.add_each(timing.queued_s)
            stats.compute.add(timing, len(timing.queued_s))
            stats.batches[timing.batch_size].add(timing, 1)

    def doc(
        self, name: str | None = None, version: int | None = None, ready: Iterable[tuple[str, int]] = ()
    ) -> list[dict[str, Any]]:
        """The statistics of the versions counted here, and of those `ready` at 0, as Triton lists
        every version it has loaded: a client (perf_analyzer) reads them before its first request."""
        with self._lock:
            zero = ModelStats(
                _Count(), _Count(), _Duration(), _Duration(), _Compute(), _Duration(), _Duration()
            )
            counted = {**dict.fromkeys(set(ready) - self._deleted, zero), **self._models}
            return [
                {
                    "name": n,
                    "version": str(v),
                    "last_inference": s.last_inference_ms,
                    "inference_count": s.inference_count.value,
                    "execution_count": s.execution_count.value,
                    "inference_stats": {
                        "success": s.success.doc(),
                        "fail": s.fail.doc(),
                        "queue": s.queue.doc(),
                        **s.compute.doc(),
                        "cache_hit": s.cache_hit.doc(),
                        "cache_miss": s.cache_miss.doc(),
                    },
                    "batch_stats": [{"batch_size": size, **c.doc()} for size, c in sorted(s.batches.items())],
                }
                for (n, v), s in sorted(counted.items())
                if (name is None or n == name) and (version is None or v == version)
            ]
