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
from compiler.backends import REFERENCE, get_backend
from compiler.benchmark import benchmark_batches, time_runner
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


def race(
    runners: Mapping[str, Runner],
    spec: InputSpec,
    batches: tuple[int, ...],
    rounds: int,
    round_s: float,
    pause_s: float = PAUSE_S,
    on_round: Callable[[int], None] | None = None,
) -> Timings:
    """Per runner and batch, the median of the rounds' medians. Each round starts one runner
    later in the order (A B C, B C A, C A B), so that none always runs first or after another."""
    if rounds < 1:
        raise ValueError(f"a race needs at least one round; got {rounds}")
    rng = np.random.default_rng(0)
    inputs = {b: spec.random_inputs(b, rng) for b in batches}
    names = list(runners)
    samples: dict[tuple[str, int], list[float]] = {(name, b): [] for name in names for b in batches}
    for r in range(rounds):
        if on_round is not None:
            on_round(r)
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            for b in batches:
                ms = time_runner(runners[name], inputs[b], warmup=2, iters=200, budget_s=round_s)
                samples[name, b].append(ms)
            # A framework's thread pool keeps spinning for a while after its last call.
            time.sleep(pause_s)
    return {name: {b: statistics.median(samples[name, b]) for b in batches} for name in runners}


def race_artifacts(
    model: bytes,
    spec_doc: dict[str, Any],
    artifacts: Mapping[str, bytes],
    threads: int,
    rounds: int,
    progress: Callable[[dict[str, Any]], None],
) -> Timings:
    """Load packed artifacts (id -> bytes) and race them with the TorchScript model, timed
    under the key `REFERENCE`, at batch 1 and the largest; for a sandboxed child process
    (`progress` is its channel to the parent, which a race does not need)."""
    set_threads(threads)
    spec = InputSpec.from_dicts(spec_doc["inputs"], spec_doc["max_batch_size"])
    reference = get_backend(REFERENCE)
    runners: dict[str, Runner] = {REFERENCE: reference.load(reference.compile(model, spec, "any", {}))}
    for name, packed in artifacts.items():
        artifact = Artifact.unpack(packed)
        runners[name] = get_backend(artifact.backend).load(artifact)
    batches = tuple(benchmark_batches(spec))
    return race(runners, spec, batches, rounds, ROUND_S)
