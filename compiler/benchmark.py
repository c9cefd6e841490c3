"""Benchmark: median latency of a runner at batch 1 and at the model's largest batch."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import numpy as np

from compiler.runner import Runner
from compiler.spec import InputSpec


@dataclass(frozen=True)
class BenchmarkReport:
    # batch size -> median latency in milliseconds
    latency_ms: dict[int, float]


def benchmark_batches(spec: InputSpec) -> list[int]:
    return sorted({1, spec.largest_batch})


def time_runner(
    runner: Runner, inputs: dict[str, np.ndarray], warmup: int, iters: int, budget_s: float
) -> float:
    """Median wall time of `runner.run` in ms; stops early once `budget_s` is spent."""
    for _ in range(warmup):
        runner.run(fresh(inputs))
    samples: list[float] = []
    deadline = time.perf_counter() + budget_s
    while len(samples) < iters and (len(samples) < 3 or time.perf_counter() < deadline):
        call = fresh(inputs)
        start = time.perf_counter()
        runner.run(call)
        samples.append((time.perf_counter() - start) * 1000.0)
    return statistics.median(samples)


def fresh(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A copy for one call, as each request brings its own: TorchScript runs on views of its
    inputs, and a model that writes to them (x.mul_(3)) would otherwise change every later call's,
    until they overflow and the other runners time, or refuse, infinities."""
    return {name: array.copy() for name, array in inputs.items()}


def benchmark(
    runner: Runner,
    spec: InputSpec,
    warmup: int = 3,
    iters: int = 30,
    budget_s: float = 2.0,
    seed: int = 0,
) -> BenchmarkReport:
    rng = np.random.default_rng(seed)
    latency = {
        b: time_runner(runner, spec.random_inputs(b, rng), warmup, iters, budget_s)
        for b in benchmark_batches(spec)
    }
    return BenchmarkReport(latency)
