"""Benchmark: median latency of a runner at batch 1 and at the model's largest batch."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import numpy as np

from compiler.runner import Runner
from compiler.spec import TRACE_FILL, InputSpec

# Where a spec has dynamic dims other than the batch (a sequence's length), runners are timed with
# them at this size too, beside TRACE_FILL: timed at 8 alone, a TVM build of an attention 7x
# faster than TorchScript there served 64 tokens 2x and 2048 tokens 2.3x slower.
LONG_FILL = 8 * TRACE_FILL
# Unless the inputs would take more than this at the largest batch.
LONG_FILL_MAX_BYTES = 256 << 20


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


def long_latency(runner: Runner, spec: InputSpec, budget_s: float = 1.0) -> dict[int, float]:
    """Median ms at each benchmark batch with the dynamic dims other than the batch at LONG_FILL;
    none where the spec has no such dims, or the runner does not take or run that size (a
    request of it goes to TorchScript; a model may take 16 positions at most)."""
    if not spec.free_dims or spec.nbytes(spec.largest_batch, LONG_FILL) > LONG_FILL_MAX_BYTES:
        return {}
    rng = np.random.default_rng(1)
    try:
        return {
            b: time_runner(runner, spec.random_inputs(b, rng, LONG_FILL), 1, 10, budget_s)
            for b in benchmark_batches(spec)
        }
    except Exception:  # OutsideDimsError, or the model's own limit
        return {}


def at_worst(
    latency: dict[int, float],
    long: dict[int, float],
    baseline: dict[int, float],
    baseline_long: dict[int, float],
) -> dict[int, float]:
    """A variant's latency at each batch as the router is to weigh it: TorchScript's (`baseline`)
    times the variant's worst ratio to it, at TRACE_FILL or at LONG_FILL. The router compares
    at the batch alone, and a variant that wins short inputs must not serve long ones slower."""
    worst = {}
    for b, ms in latency.items():
        ratios = [ms / baseline[b]]
        if b in long and b in baseline_long:
            ratios.append(long[b] / baseline_long[b])
        worst[b] = baseline[b] * max(ratios)
    return worst
