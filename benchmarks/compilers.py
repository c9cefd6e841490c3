"""Compiler benchmark: each backend's latency against eager PyTorch, and the variant Kiln picks.

Every candidate is built through the product path (compiler.pipeline.compile_and_check, which
verifies it against TorchScript), loaded once, and then all of them are timed in interleaved
rounds (A B C ..., A B C ..., ...) so that a noisy neighbour on the machine hits all alike.
Kiln's pick is what service.router.choose_variant chooses from the worker's own race (the
compiled candidates and TorchScript, with the server's default rounds), reported at its latency
in this table's separate, longer rounds; benchmarks/README.md says more.
Run: .venv/bin/python benchmarks/compilers.py [--help]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.models import MLP64, RESNET18, BenchModel
from compiler.backends import REFERENCE, get_backend
from compiler.backends.torchscript import TorchScriptRunner
from compiler.benchmark import benchmark_batches
from compiler.hardware import cpu_target
from compiler.pipeline import CompileOptions, CompileResult, compile_and_check
from compiler.race import RACE_ROUNDS, ROUND_S, Timings, race
from compiler.runner import Runner
from compiler.spec import InputSpec
from compiler.threads import set_threads
from service.races import contender
from service.records import TUNING_TRIALS, VariantRecord, VariantStatus, default_tolerance
from service.router import ANY_TARGET, choose_variant
from tests.models import Encoder, LSTMHead

MODELS: dict[str, BenchModel] = {
    m.name: m
    for m in (
        MLP64,
        RESNET18,
        BenchModel("encoder", Encoder, (8, 32)),  # one TransformerEncoderLayer, d_model 32
        BenchModel("lstm", LSTMHead, (8, 16)),
    )
}
# Each new kernel gets at least one 16-trial round whatever this says, and a tuned artifact tunes
# batch 1 and 8 separately: ResNet-18 has ~38 tasks, so 640 is about one round each.
DEFAULT_TRIALS = {"mlp": 64, "resnet18": 640, "encoder": 128, "lstm": 64}
MAX_BATCH = 8
TOLERANCE = 1.05  # Kiln's pick may be this much slower than the row's best
console = Console(width=200)  # wide tables, also when piped to a file


@dataclass(frozen=True)
class Column:
    key: str
    title: str
    backend: str | None  # None: eager, not compiled
    options: Mapping[str, Any] = field(default_factory=dict)


EAGER = Column("eager", "eager", None)
COMPILED = (
    Column("torchscript", "TorchScript", REFERENCE),
    Column("tvm", "TVM", "tvm"),
    Column("tvm-tuned", "TVM tuned", "tvm"),  # options (the trials) are set per model
    Column("onnxruntime", "ONNX Runtime", "onnxruntime"),
    Column("inductor", "AOTInductor", "inductor"),
    Column("openvino", "OpenVINO", "openvino"),
    Column("openvino-bf16", "OpenVINO bf16", "openvino", {"precision": "bf16"}),
)


@dataclass
class Candidate:
    column: Column
    runner: Runner | None = None
    result: CompileResult | None = None
    error: str | None = None
    ms: dict[int, float] = field(default_factory=dict)  # batch -> median of the rounds' medians


@dataclass
class ModelRun:
    model: BenchModel
    spec: InputSpec
    candidates: dict[str, Candidate]
    pick: dict[int, str] = field(default_factory=dict)  # batch -> the column Kiln serves
    raced: Timings = field(default_factory=dict)  # the worker's race, which Kiln's pick reads
    trials: int = 0

    @property
    def batches(self) -> tuple[int, ...]:
        """What the worker's benchmark and race measure: batch 1 and the largest."""
        return tuple(benchmark_batches(self.spec))


def short(exc: BaseException, limit: int = 70) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = lines[0] if lines else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


# Compile -----------------------------------------------------------------------------------


def compile_column(column: Column, model: bytes, spec: InputSpec, target: str, threads: int) -> Candidate:
    """Build, verify and load one column; a failure is reported in its cell, never raised."""
    assert column.backend is not None
    last_log = [time.monotonic()]

    def progress(event: dict[str, Any]) -> None:
        tuning = event.get("tuning")
        if tuning and time.monotonic() - last_log[0] > 60:  # a long tuning run still shows life
            last_log[0] = time.monotonic()
            console.log(
                f"  {column.title}: {tuning['trials_done']}/{tuning['trials_total']} trials", style="dim"
            )

    rtol, atol = default_tolerance(column.options)  # as a worker verifies an upload's variant
    options = CompileOptions(rtol, atol, threads, backend_options=dict(column.options))
    try:
        # No tuning records are passed: a tuned build tunes from scratch, so its wall time is honest.
        result = compile_and_check(model, spec, column.backend, target, options, progress=progress)
        runner = get_backend(column.backend).load(result.artifact)
    except Exception as exc:  # ConversionError, VerificationError, ... : one cell, not the whole run
        console.log(f"  {column.title}: [red]failed[/red]: {exc}")
        return Candidate(column, error=short(exc))
    console.log(f"  {column.title}: built and verified in {result.compile_s:.1f} s")
    return Candidate(column, runner, result)


def build(m: BenchModel, target: str, threads: int, trials: int | None, max_batch: int) -> ModelRun:
    console.log(f"{m.name}: compiling (max_batch_size {max_batch}, target {target})")
    model = m.torchscript()
    spec = InputSpec.from_dicts(m.inputs(), max_batch)
    torch.manual_seed(0)  # the weights BenchModel.torchscript scripted
    # Eager: the nn.Module itself, through the runner that serves TorchScript.
    eager = Candidate(EAGER, TorchScriptRunner(m.factory().eval(), spec))
    candidates = {EAGER.key: eager}
    for column in COMPILED:
        if column.key == "tvm-tuned":
            if trials is None:
                continue
            column = Column(column.key, column.title, column.backend, {TUNING_TRIALS: trials})
        candidates[column.key] = compile_column(column, model, spec, target, threads)
    check_eager(eager, candidates[REFERENCE], spec)
    return ModelRun(m, spec, candidates, trials=trials or 0)


def check_eager(eager: Candidate, reference: Candidate, spec: InputSpec) -> None:
    """Eager must compute what the scripted file computes, or the baseline is not comparable."""
    if eager.runner is None or reference.runner is None:
        return
    x = spec.random_inputs(2, np.random.default_rng(1))
    got, want = eager.runner.run(x), reference.runner.run(x)
    for name, expected in want.items():
        if not np.allclose(got[name], expected, rtol=1e-4, atol=1e-4):
            raise RuntimeError(f"eager and TorchScript outputs differ ({name}): the weights do not match")


# Time --------------------------------------------------------------------------------------


def time_all(run: ModelRun, rounds: int, round_s: float, pause_s: float) -> None:
    """The table's own interleaved rounds; per column and batch, the median of the rounds' medians."""
    runners = {key: c.runner for key, c in run.candidates.items() if c.runner is not None}

    def on_round(r: int) -> None:
        console.log(f"{run.model.name}: timing round {r + 1}/{rounds}", style="dim")

    for key, ms in race(runners, run.spec, run.batches, rounds, round_s, pause_s, on_round).items():
        run.candidates[key].ms = ms


def kiln_pick(run: ModelRun, target: str) -> None:
    """The server's choice: the race a worker runs once the last compiled variant is ready
    (TorchScript and the candidates whose compile-time numbers left them a chance, the default
    rounds), then choose_variant. The
    worker's race runs in a child process, on the runners loaded from their packed artifacts."""
    compiled = {
        key: c.runner
        for key, c in run.candidates.items()
        if c.runner is not None
        and c.result is not None
        and (key == REFERENCE or contender(c.result.latency_ms, c.result.baseline_latency_ms))
    }
    if REFERENCE not in compiled:
        return
    console.log(f"{run.model.name}: racing {len(compiled)} variants as a worker does", style="dim")
    run.raced = race(compiled, run.spec, run.batches, RACE_ROUNDS, ROUND_S)
    variants = [record(REFERENCE, REFERENCE, ANY_TARGET, {}, run.raced)]
    for key in run.raced:
        column = run.candidates[key].column
        if column.backend is not None and column.backend != REFERENCE:
            variants.append(record(key, column.backend, target, dict(column.options), run.raced))
    for b in run.batches:
        run.pick[b] = choose_variant(variants, {target}, b).id


def record(key: str, backend: str, target: str, options: dict[str, Any], raced: Timings) -> VariantRecord:
    return VariantRecord(
        id=key,  # the column: the two tvm variants differ only in their options
        model="bench",
        version=1,
        backend=backend,
        target=target,
        options=options,
        status=VariantStatus.ready,
        latency_ms=raced[key].get(1),
        latency_ms_by_batch=raced[key],
        baseline_latency_ms_by_batch=raced[REFERENCE],
    )


# Report ------------------------------------------------------------------------------------


def cell(c: Candidate | None, batch: int, eager_ms: float) -> str:
    if c is None:
        return "skipped"
    if c.error is not None:
        return f"[red]failed: {c.error}[/red]"
    ms = c.ms[batch]
    return f"{ms:.3g} ({ms / eager_ms:.2f}x)"


def tuning_cell(c: Candidate | None) -> str:
    if c is None or c.result is None:
        return "" if c is None or c.error is None else "failed"
    done = (c.result.tuning or {}).get("trials_done", "?")
    return f"{c.result.compile_s:.0f} s, {done} trials"


def print_report(runs: list[ModelRun], args: argparse.Namespace, target: str) -> None:
    titles = [c.title for c in COMPILED if c.key != "tvm-tuned" or not args.no_tuning]
    headers = ["model", "batch", "eager ms", *[f"{t} ms" for t in titles]]
    if not args.no_tuning:
        headers.insert(headers.index("TVM tuned ms") + 1, "tuning")
    title = (
        f"Compilers on {target}: median ms (ratio to eager), {args.threads} threads, "
        f"{args.rounds} interleaved rounds"
    )
    table = Table(*headers, "Kiln pick ms", title=title)
    verdicts, failures = [], []
    for run in runs:
        cands = run.candidates
        eager = cands[EAGER.key]
        for b in run.batches:
            row = [run.model.name, str(b), f"{eager.ms[b]:.3g}"]
            for col in COMPILED:
                if col.key == "tvm-tuned" and args.no_tuning:
                    continue
                row.append(cell(cands.get(col.key), b, eager.ms[b]))
                if col.key == "tvm-tuned":
                    row.append(tuning_cell(cands.get(col.key)))
            timed = {k: c.ms[b] for k, c in cands.items() if c.ms}
            pick = cands.get(run.pick.get(b, ""))
            if pick is None or not pick.ms:
                row.append("[red]none[/red]")
                verdicts.append(f"{run.model.name} b{b}: no variant picked")
            else:
                ms = pick.ms[b]
                row.append(f"{ms:.3g} ({ms / eager.ms[b]:.2f}x) {pick.column.title}")
                best = min(timed, key=timed.__getitem__)
                ok = ms <= TOLERANCE * timed[best]
                # Every raced time: when the pick and the table disagree, these say how.
                raced = ", ".join(f"{cands[k].column.title} {t[b]:.3g}" for k, t in run.raced.items())
                verdicts.append(
                    f"{run.model.name} b{b}: best {cands[best].column.title} {timed[best]:.3g} ms; "
                    f"Kiln pick {pick.column.title} (raced ms: {raced}) = {ms / timed[best]:.2f}x best, "
                    f"<= {TOLERANCE}x: {verdict(ok)}"
                )
            table.add_row(*row)
        for c in cands.values():
            if c.error is not None:
                failures.append(f"{run.model.name} / {c.column.title}: {c.error}")
        if run.model.name == "resnet18" and not args.no_tuning:
            verdicts += resnet_verdicts(cands, run.batches)
    console.print(table)
    for line in verdicts:
        console.print(line)
    for line in failures:
        console.print(f"[red]failed: {line}[/red]")


def resnet_verdicts(cands: dict[str, Candidate], batches: tuple[int, ...]) -> list[str]:
    tuned, eager, ort = cands.get("tvm-tuned"), cands[EAGER.key], cands.get("onnxruntime")
    if tuned is None or not tuned.ms:
        return ["resnet18 b1: TVM tuned <= 0.8x eager: n/a (no tuned build)"]
    ratio = tuned.ms[1] / eager.ms[1]
    lines = [f"resnet18 b1: TVM tuned {ratio:.2f}x eager, <= 0.8x: {verdict(ratio <= 0.8)}"]
    if ort is not None and ort.ms:
        lines += [f"resnet18 b{b}: TVM tuned {tuned.ms[b] / ort.ms[b]:.2f}x ONNX Runtime" for b in batches]
    return lines


def verdict(ok: bool) -> str:
    return "[green]PASS[/green]" if ok else "[red]FAIL[/red]"


# Main --------------------------------------------------------------------------------------


def parse_trials(text: str) -> dict[str, int]:
    trials = dict(DEFAULT_TRIALS)
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, count = item.partition("=")
        if name not in MODELS or not count.isdigit():
            raise argparse.ArgumentTypeError(f"expected MODEL=N with MODEL in {sorted(MODELS)}; got {item!r}")
        trials[name] = int(count)
    return trials


def parse_models(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in MODELS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown model(s) {unknown}; known: {', '.join(MODELS)}")
    return names


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", type=parse_models, default=list(MODELS), help="comma-separated")
    trials = ",".join(f"{k}={v}" for k, v in DEFAULT_TRIALS.items())
    p.add_argument("--trials", type=parse_trials, default=dict(DEFAULT_TRIALS), help=f"default {trials}")
    p.add_argument("--no-tuning", action="store_true", help="skip the TVM tuned column")
    p.add_argument(
        "--max-batch", type=int, default=MAX_BATCH, help="max_batch_size; tuned builds tune 1 and this"
    )
    p.add_argument("--threads", type=int, default=2, help="intra-op threads of every runtime")
    p.add_argument("--rounds", type=int, default=8, help="interleaved timing rounds")
    p.add_argument("--round-seconds", type=float, default=0.5, help="time budget per column, batch, round")
    p.add_argument("--pause", type=float, default=0.25, help="seconds between columns, for thread pools")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    started = time.monotonic()
    load_before = os.getloadavg()[0]
    set_threads(args.threads)  # before TVM starts its pool: it reads TVM_NUM_THREADS once
    # The registry imports backends lazily: import all now, so that a run of an hour cannot mix
    # module versions when the source tree changes under it.
    for column in COMPILED:
        assert column.backend is not None
        get_backend(column.backend)
    target = cpu_target()
    runs = []
    for name in args.models:
        trials = None if args.no_tuning else args.trials[name]
        run = build(MODELS[name], target, args.threads, trials, args.max_batch)
        kiln_pick(run, target)
        time_all(run, args.rounds, args.round_seconds, args.pause)
        runs.append(run)
        if len(args.models) > 1:  # each model's rows as it ends, so that a stopped run keeps them
            print_report([run], args, target)
    print_report(runs, args, target)
    # Other work on the machine skews every number: the load average says how much there was.
    load = f"load average {load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at the end"
    console.print(f"total wall time {time.monotonic() - started:.0f} s, {os.cpu_count()} CPUs, {load}")


if __name__ == "__main__":
    main()
