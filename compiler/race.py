"""The race: a model's verified runners timed side by side, in interleaved rounds.

Each variant is timed when it compiles: minutes apart from the others, after a long tuning run
or beside other work. Timing them together, round by round (A B C, A B C, ...), lets a noisy
neighbour hit all of them alike, so that the fastest on this hardware wins, not the luckiest.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from compiler.artifact import Artifact
from compiler.backends import REFERENCE, get_backend, load_artifact
from compiler.benchmark import at_worst, benchmark_batches, fresh, long_latency, time_runner
from compiler.runner import Runner
from compiler.spec import InputSpec
from compiler.threads import set_threads

# name -> batch size -> median ms
Timings = dict[str, dict[int, float]]
# A worker's race: this many rounds (KILN_RACE_ROUNDS), each up to ROUND_S per runner and batch
# (a few hundred calls of a small model, the minimum of a few of a large one), PAUSE_S after each
# runner. Many short rounds beat a few long ones: a noisy spell spoils fewer of them. Racing the
# encoder 4 times over, each variant's ratio to TorchScript spread 4.5% (8 x 0.2 s) against 10.7%
# (3 x 0.5 s); the MLP's spread 10% either way.
RACE_ROUNDS = 8
ROUND_S = 0.2
PAUSE_S = 0.1
# Close calls: at each batch, the runners within CLOSE of the leader race on, head to head, for
# CLOSE_ROUNDS_PER_ROUND times as many rounds again. The encoder's TVM and ONNX Runtime, 15% apart
# in a long benchmark, swapped places in 3 of 12 races of 8 rounds (two of them by 16%), and in
# 1 of 12 with these close-call rounds; in 297 rounds timed in a row, the median of 8 ranked them
# wrong in 2.8% of windows, of 32 in none.
CLOSE = 0.25
CLOSE_ROUNDS_PER_ROUND = 2
# Before the rounds, each runner runs untimed for WARMUP_S at each batch. A runner freshly loaded
# in the worker's race child runs slower for a while: untuned TVM on the encoder at batch 1 took
# 0.058 ms on average in a child's first race and 0.049 in its second, and lost the first to ONNX
# Runtime in 4 of 8 children; after this warm-up it won the first race in 6 of 6. Sleeping 20 s
# instead still lost 1 of 4: calls warm a runner more than time does.
WARMUP_S = 1.0


def race(
    runners: Mapping[str, Runner],
    spec: InputSpec,
    batches: tuple[int, ...],
    rounds: int,
    round_s: float,
    pause_s: float = PAUSE_S,
    on_round: Callable[[int], None] | None = None,
    warmup_s: float = WARMUP_S,
) -> Timings:
    """Per runner and batch, the median of the rounds' medians. Each round starts one runner
    later in the order (A B C, B C A, C A B), so that none always runs first or after another.
    Before the rounds every runner warms up at every batch; after them, at each batch, the runners
    close to the leader run more such rounds among themselves."""
    if rounds < 1:
        raise ValueError(f"a race needs at least one round; got {rounds}")
    rng = np.random.default_rng(0)
    inputs = {b: spec.random_inputs(b, rng) for b in batches}
    names = list(runners)
    samples: dict[tuple[str, int], list[float]] = {(name, b): [] for name in names for b in batches}

    def run_round(r: int, racing: list[str], sizes: tuple[int, ...]) -> None:
        shift = r % len(racing)
        for name in racing[shift:] + racing[:shift]:
            for b in sizes:
                ms = time_runner(runners[name], inputs[b], warmup=2, iters=200, budget_s=round_s)
                samples[name, b].append(ms)
            # A framework's thread pool keeps spinning for a while after its last call.
            time.sleep(pause_s)

    for name in names:
        for b in batches:
            warm_until = time.monotonic() + warmup_s
            while time.monotonic() < warm_until:
                runners[name].run(fresh(inputs[b]))
    started = time.monotonic()
    for r in range(rounds):
        if on_round is not None:
            on_round(r)
        run_round(r, names, batches)
    # Close calls may take as long again as the rounds did, no more: a worker's race has a timeout.
    deadline = time.monotonic() + (time.monotonic() - started)
    for b in batches:
        if len(close := close_to_leader({name: samples[name, b] for name in names})) > 1:
            for r in range(CLOSE_ROUNDS_PER_ROUND * rounds):
                if time.monotonic() > deadline:
                    break
                run_round(r, close, (b,))
    return {name: {b: statistics.median(samples[name, b]) for b in batches} for name in runners}


def close_to_leader(samples: Mapping[str, list[float]]) -> list[str]:
    """The runners whose median is within CLOSE of the fastest one's, in their given order."""
    medians = {name: statistics.median(ms) for name, ms in samples.items()}
    fastest = min(medians.values())
    return [name for name, ms in medians.items() if ms <= fastest * (1 + CLOSE)]


def race_artifacts(
    model: bytes,
    spec_doc: dict[str, Any],
    target: str,
    artifacts: Mapping[str, bytes],
    threads: int,
    rounds: int,
    progress: Callable[[dict[str, Any]], None],
) -> Timings:
    """Load packed artifacts (id -> bytes) and race them with the TorchScript model where
    `target` runs it (on its GPU for a cuda target), timed under the key `REFERENCE`, at batch 1
    and the largest; for a sandboxed child process (`progress` is its channel to the parent,
    which a race does not need)."""
    set_threads(threads)
    spec = InputSpec.from_dicts(spec_doc["inputs"], spec_doc["max_batch_size"])
    reference = get_backend(REFERENCE)
    runners: dict[str, Runner] = {REFERENCE: reference.load(reference.compile(model, spec, target, {}))}
    for name, packed in artifacts.items():
        artifact = Artifact.unpack(packed)
        runners[name] = load_artifact(artifact)
    batches = tuple(benchmark_batches(spec))
    timings = race(runners, spec, batches, rounds, ROUND_S)
    baseline, baseline_long = timings[REFERENCE], long_latency(runners[REFERENCE], spec)
    return {
        name: ms
        if name == REFERENCE
        else at_worst(ms, long_latency(runners[name], spec), baseline, baseline_long)
        for name, ms in timings.items()
    }
