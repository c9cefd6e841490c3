"""Per model-version inference statistics, in the shape of Triton's statistics extension, so
that what reads Triton's (perf_analyzer's server-side report, tritonclient's
get_inference_statistics) reads Kiln's: requests' queue time apart from their compute."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from service.batcher import BatchTiming


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


class Stats:
    def __init__(self) -> None:
        self._models: dict[tuple[str, int], ModelStats] = defaultdict(ModelStats)
        self._lock = threading.Lock()

    def request(self, name: str, version: int, seconds: float, ok: bool) -> None:
        with self._lock:
            stats = self._models[(name, version)]
            (stats.success if ok else stats.fail).add(seconds)
            stats.last_inference_ms = int(time.time() * 1000)

    def cache_hit(self, name: str, version: int, seconds: float) -> None:
        """A request answered from the response cache: a success that never queued, as Triton
        counts it, and no inference or execution."""
        with self._lock:
            stats = self._models[(name, version)]
            stats.cache_hit.add(seconds)
            stats.success.add(seconds)
            stats.queue.add(0.0)
            stats.last_inference_ms = int(time.time() * 1000)

    def cache_miss(self, name: str, version: int, seconds: float) -> None:
        """The lookup and the insertion of a request that then ran."""
        with self._lock:
            self._models[(name, version)].cache_miss.add(seconds)

    def execution(self, name: str, version: int, timing: BatchTiming) -> None:
        with self._lock:
            stats = self._models[(name, version)]
            stats.execution_count += 1
            stats.inference_count += timing.batch_size
            for seconds in timing.queued_s:
                stats.queue.add(seconds)
            stats.compute.add(timing, len(timing.queued_s))
            stats.batches[timing.batch_size].add(timing, 1)

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
