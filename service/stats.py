"""Per model-version inference statistics, in the shape of Triton's statistics extension, so
that what reads Triton's (perf_analyzer's server-side report, tritonclient's
get_inference_statistics) reads Kiln's: requests' queue time apart from their compute. The same
numbers feed Triton's Prometheus series (`nv_inference_*`, service.metrics)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Gauge

from service import metrics
from service.batcher import BatchTiming
from service.errors import ClientGoneError, KilnError, QueueFullError, TimeoutExpiredError
from service.store import StoreError

US = 1e6
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
class _Duration:
    count: int = 0
    ns: int = 0

    def add(self, seconds: float, count: int = 1) -> None:
        self.count += count
        self.ns += int(seconds * 1e9) * count

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
    last_inference_ms: int = 0
    inference_count: int = 0  # samples (batch elements) inferred
    execution_count: int = 0  # model runs: fewer than requests when batching merges them
    success: _Duration = field(default_factory=_Duration)
    fail: _Duration = field(default_factory=_Duration)
    queue: _Duration = field(default_factory=_Duration)
    # Per request, as Triton counts them: each request of a batch is charged the batch's times.
    compute: _Compute = field(default_factory=_Compute)
    batches: dict[int, _Compute] = field(default_factory=lambda: defaultdict(_Compute))
    # Response cache: a hit's lookup answers the request; a miss's lookup and insertion.
    cache_hit: _Duration = field(default_factory=_Duration)
    cache_miss: _Duration = field(default_factory=_Duration)


@dataclass
class _Series:
    """A version's Triton series, labelled once: a lookup per request would cost more."""

    success: Gauge
    request_us: Gauge
    inferences: Gauge
    executions: Gauge
    queue_us: Gauge
    input_us: Gauge
    infer_us: Gauge
    output_us: Gauge
    cache_hits: Gauge
    cache_hit_us: Gauge
    cache_misses: Gauge
    cache_miss_us: Gauge

    @classmethod
    def of(cls, name: str, version: int) -> _Series:
        labels = (name, str(version))
        return cls(
            *(
                series.labels(*labels)
                for series in (
                    metrics.NV_REQUEST_SUCCESS,
                    metrics.NV_REQUEST_US,
                    metrics.NV_INFERENCE_COUNT,
                    metrics.NV_EXEC_COUNT,
                    metrics.NV_QUEUE_US,
                    metrics.NV_COMPUTE_INPUT_US,
                    metrics.NV_COMPUTE_INFER_US,
                    metrics.NV_COMPUTE_OUTPUT_US,
                    metrics.NV_CACHE_HITS,
                    metrics.NV_CACHE_HIT_US,
                    metrics.NV_CACHE_MISSES,
                    metrics.NV_CACHE_MISS_US,
                )
            )
        )


class Stats:
    def __init__(self) -> None:
        self._models: dict[tuple[str, int], ModelStats] = defaultdict(ModelStats)
        self._series: dict[tuple[str, int], _Series] = {}
        self._lock = threading.Lock()

    def start(self, name: str, version: int) -> None:
        """A version loads: its series exist from now, at 0, as Triton makes them at a model's
        load, so that rate() and increase() count its first requests and failures."""
        with self._lock:
            self._of(name, version)

    def _of(self, name: str, version: int) -> tuple[ModelStats, _Series]:
        """Under the lock."""
        series = self._series.get((name, version))
        if series is None:
            series = self._series[(name, version)] = _Series.of(name, version)
            for reason in REASONS:
                metrics.NV_REQUEST_FAILURE.labels(name, str(version), reason)
            metrics.NV_PENDING.labels(name, str(version))
        return self._models[(name, version)], series

    def request(self, name: str, version: int, seconds: float, failure: str | None = None) -> None:
        """A request answered, or failed for `failure` (failure_reason)."""
        with self._lock:
            stats, series = self._of(name, version)
            if failure is None:
                stats.success.add(seconds)
                series.success.inc()
                series.request_us.inc(seconds * US)
            else:
                stats.fail.add(seconds)
                metrics.NV_REQUEST_FAILURE.labels(name, str(version), failure).inc()
            stats.last_inference_ms = int(time.time() * 1000)

    def cache_hit(self, name: str, version: int, seconds: float) -> None:
        """A request answered from the response cache: a success that never queued, as Triton
        counts it, and no inference or execution."""
        with self._lock:
            stats, series = self._of(name, version)
            stats.cache_hit.add(seconds)
            stats.success.add(seconds)
            stats.queue.add(0.0)
            stats.last_inference_ms = int(time.time() * 1000)
            for counted, us in (
                (series.cache_hits, series.cache_hit_us),
                (series.success, series.request_us),
            ):
                counted.inc()
                us.inc(seconds * US)

    def cache_miss(self, name: str, version: int, seconds: float) -> None:
        """The lookup and the insertion of a request that then ran."""
        with self._lock:
            stats, series = self._of(name, version)
            stats.cache_miss.add(seconds)
            series.cache_misses.inc()
            series.cache_miss_us.inc(seconds * US)

    def execution(self, name: str, version: int, timing: BatchTiming) -> None:
        requests = len(timing.queued_s)
        with self._lock:
            stats, series = self._of(name, version)
            stats.execution_count += 1
            stats.inference_count += timing.batch_size
            for seconds in timing.queued_s:
                stats.queue.add(seconds)
            stats.compute.add(timing, requests)
            stats.batches[timing.batch_size].add(timing, 1)
            series.executions.inc()
            series.inferences.inc(timing.batch_size)
            series.queue_us.inc(sum(timing.queued_s) * US)
            # Each request of a batch is charged the batch's times, as in the statistics.
            series.input_us.inc(timing.input_s * requests * US)
            series.infer_us.inc(timing.infer_s * requests * US)
            series.output_us.inc(timing.output_s * requests * US)

    def doc(self, name: str | None = None, version: int | None = None) -> list[dict[str, Any]]:
        with self._lock:
            return [
                {
                    "name": n,
                    "version": str(v),
                    "last_inference": s.last_inference_ms,
                    "inference_count": s.inference_count,
                    "execution_count": s.execution_count,
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
                for (n, v), s in sorted(self._models.items())
                if (name is None or n == name) and (version is None or v == version)
            ]
