"""Per model-version inference statistics, in the shape of Triton's statistics extension."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any


@dataclass
class _Counter:
    count: int = 0
    ns: int = 0

    def add(self, seconds: float) -> None:
        self.count += 1
        self.ns += int(seconds * 1e9)

    def doc(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass
class ModelStats:
    last_inference_ms: int = 0
    inference_count: int = 0  # samples (batch elements) inferred
    execution_count: int = 0  # model runs: fewer than requests when batching merges them
    success: _Counter = field(default_factory=_Counter)
    compute: dict[int, _Counter] = field(default_factory=lambda: defaultdict(_Counter))


class Stats:
    def __init__(self) -> None:
        self._models: dict[tuple[str, int], ModelStats] = defaultdict(ModelStats)
        self._lock = threading.Lock()

    def request(self, name: str, version: int, seconds: float) -> None:
        with self._lock:
            stats = self._models[(name, version)]
            stats.success.add(seconds)
            stats.last_inference_ms = int(time.time() * 1000)

    def execution(self, name: str, version: int, batch_size: int, seconds: float) -> None:
        with self._lock:
            stats = self._models[(name, version)]
            stats.execution_count += 1
            stats.inference_count += batch_size
            stats.compute[batch_size].add(seconds)

    def doc(self, name: str | None = None, version: int | None = None) -> list[dict[str, Any]]:
        with self._lock:
            return [
                {
                    "name": n,
                    "version": str(v),
                    "last_inference": s.last_inference_ms,
                    "inference_count": s.inference_count,
                    "execution_count": s.execution_count,
                    "inference_stats": {"success": s.success.doc()},
                    "batch_stats": [
                        {"batch_size": size, "compute_infer": c.doc()}
                        for size, c in sorted(s.compute.items())
                    ],
                }
                for (n, v), s in sorted(self._models.items())
                if (name is None or n == name) and (version is None or v == version)
            ]
