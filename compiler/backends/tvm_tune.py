"""MetaSchedule tuning for the TVM backend, with tuning records that outlive one compile.

The recipe is the one measured in shared/notes/tvm-tuning.md for PyPI apache-tvm 0.27:
- Tuning only works on static shapes (a symbolic loop makes MetaSchedule abort), so a tuned
  artifact holds one Relax function per batch size, `b1`, `b8`, ...; requests pad up to the next.
- LocalBuilder's default build function imports tvm.s_tir.tensor_intrin (~30 s per builder
  process here), so builds timed out: `build_candidate` does the same without that import.
- Records are exchanged as plain JSON, one `WorkloadRecords` per tuned kernel, so the service can
  cache them in its store and a later compile, of any model, skips kernels tuned at least as long
  as it asks; a kernel tuned for fewer trials is tuned again, its search seeded with the cached
  schedule (EvolutionarySearch draws part of its first population from the database's best).
- A compile runs at most the trials it asks for: its time limit is counted from them.
- MetaSchedule times schedules but never checks what they compute, and on 0.27 it can pick a
  wrong one: its RewriteLayout packs a weight that several blocks read by one block's reads alone
  (an LSTM's bias, added before the split into gates: that kernel came out 1.54 off). Each
  kernel's schedule is checked against its untuned build before it is applied or cached
  (`_checked_database`).
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

log = logging.getLogger("kiln.tvm.tune")
# MetaSchedule's per-task messages: warnings and errors only (see `tune_contexts`).
TASK_LOG = logging.getLogger("kiln.tvm.tune.tasks")
TASK_LOG.setLevel(logging.WARNING)

TuningProgress = Callable[[dict[str, Any]], None]

# MetaSchedule proposes candidates in rounds of up to this many per task; with fewer trials than
# that per task to tune, rounds shrink so that each still gets one.
TRIALS_PER_ROUND = 16
# Kept per kernel: only the best schedule is ever applied, and each record is ~50 KB of JSON.
RECORDS_KEPT = 1
# Kernels below this many FLOPs are also searched without parallel loops (`design_space`). At
# tens of GFLOP/s per core, waking the pool (~10 µs here) costs about what parallel loops save
# on 1 MFLOP; the margin lets measurement decide around there.
SERIAL_MAX_FLOPS = 1e7
# Per kernel, the fastest schedules checked in turn until one computes what the untuned kernel
# does, to within KERNEL_TOLERANCE of its largest output value. The correct schedules measured
# here agreed to 1.5e-7; the end-to-end tolerance is ~1e4 times looser than this.
SCHEDULES_CHECKED = 4
KERNEL_TOLERANCE = 1e-4


@dataclass
class WorkloadRecords:
    """A tuned kernel: its workload (the PrimFunc), its best measured schedules, as JSON, and the
    trials that every compile which tuned it spent on it."""

    workload_hash: str
    workload: Any
    records: list[Any]
    # Records cached before their trials were counted had one round at least.
    trials: int = TRIALS_PER_ROUND

    def to_dict(self) -> dict[str, Any]:
        return {
            "workload_hash": self.workload_hash,
            "workload": self.workload,
            "records": self.records,
            "trials": self.trials,
        }

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> WorkloadRecords:
        return cls(
            doc["workload_hash"], doc["workload"], list(doc["records"]), doc.get("trials", TRIALS_PER_ROUND)
        )


@dataclass
class TaskReport:
    name: str
    workload_hash: str
    weight: int
    # Trials this compile spent on it.
    new_trials: int = 0
    # The trials behind the cached records it started from (0: none were cached).
    earlier_trials: int = 0
    # Its cached schedule was applied as it was: the kernel had as many trials as asked for.
    reused: bool = False
    best_ms: float | None = None
    # Schedules left out because they computed something else than the untuned kernel.
    wrong_schedules: int = 0


@dataclass
class TuningResult:
    trials: int
    budget: int
    failed: int
    tasks: list[TaskReport]
    # Records for kernels tuned in this run, to replace or add to the shared cache.
    new_records: list[WorkloadRecords] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "trials_done": self.trials,
            "trials_total": self.budget,
            "failed_trials": self.failed,
            "tasks": [vars(task) for task in self.tasks],
            "reused_tasks": sum(task.reused for task in self.tasks),
        }


def tune_and_apply(
    mod: Any,
    target: Any,
    trials: int,
    known: Sequence[WorkloadRecords],
    progress: TuningProgress,
) -> tuple[Any, TuningResult]:
    """Tune the kernels of a static-shape, already-lowered module (see `lower_for_tuning`) with
    at most `trials` trials; return it with the best schedules applied, and what was tuned.

    That asks for `trials // kernels` per kernel, at least one: a kernel in `known` with at least
    that many is reused as it is, and the others share the trials."""
    import tvm
    from tvm import relax
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.measure_callback import MeasureCallback

    _import_tensor_intrinsics()
    with tempfile.TemporaryDirectory(prefix="kiln-tune-") as work_dir:
        database = ms.database.JSONDatabase(work_dir=work_dir)
        # A record that does not load is not in the database either, so its kernel is tuned anew.
        earlier = {item.workload_hash: item.trials for item in known if _commit(database, item)}
        extracted = ms.relax_integration.extract_tasks(mod, target)
        reports = [
            TaskReport(task.task_name, _hash(task.dispatched[0]), int(task.weight)) for task in extracted
        ]
        asked = max(1, trials // max(1, len(reports)))  # a model of no kernels (x -> x) has none
        for report in reports:
            report.earlier_trials = earlier.get(report.workload_hash, 0)
            report.reused = report.earlier_trials >= asked
        todo = [i for i, report in enumerate(reports) if not report.reused]
        tracker = _Tracker([reports[i] for i in todo], trials, progress)
        if todo:
            # Candidates build while nothing is measured: each core compiles one.
            cores = int(target.attrs["num-cores"])
            contexts, weights = tune_contexts([extracted[i] for i in todo], target)
            per_round = max(1, min(TRIALS_PER_ROUND, trials // len(todo)))
            ms.tune.tune_tasks(
                tasks=contexts,
                task_weights=weights,
                work_dir=work_dir,
                # The scheduler starts a round while fewer than this many trials ran, and a
                # round runs up to `per_round`: so never more than `trials` in all.
                max_trials_global=trials - per_round + 1,
                num_trials_per_iter=per_round,
                builder=ms.builder.LocalBuilder(f_build=build_candidate, timeout_sec=60, max_workers=cores),
                runner=ms.runner.LocalRunner(timeout_sec=30),
                database=database,
                measure_callbacks=[*MeasureCallback.create("default"), tracker.callback()],
            )
        if tracker.trials and tracker.failed == tracker.trials:
            raise RuntimeError(f"every tuning trial failed; the last: {tracker.last_error}")
        checked = _checked_database(database, extracted, reports, target)
        # The database held the cached schedules too, so a kernel's best is never slower than
        # its cached one: the cache only improves.
        exported = [
            _export(checked, extracted[i].dispatched[0], reports[i]) for i in todo if reports[i].new_trials
        ]
        # The pass takes the database in context when given no work_dir.
        with target, tvm.transform.PassContext(opt_level=3), checked:
            tuned = relax.transform.MetaScheduleApplyDatabase(enable_warning=False)(mod)
            tuned = _prepack_weights(tuned)
    new_records = [r for r in exported if r.records]
    return tuned, TuningResult(tracker.trials, trials, tracker.failed, reports, new_records)


def tune_contexts(tasks: Sequence[Any], target: Any) -> tuple[list[Any], list[float]]:
    """One TuneContext per task, in order, with its weight. A small kernel is searched with and
    without parallel loops (`design_space`); a larger one, where the serial schedules would only
    spend trials, in the default space.

    Each logs to TASK_LOG, not to the loggers of MetaSchedule's `get_loggers_from_work_dir`:
    that reconfigures logging (dictConfig) on every call and fails once its logger holds a
    handler without a name, as under pytest; and its per-task lines (design spaces,
    postprocessor counts) are noise in a worker's log. The job's tuning record keeps the counts.
    """
    from tvm.s_tir import meta_schedule as ms

    both = design_space(tasks[0].dispatched[0], target)
    contexts = [
        ms.TuneContext(
            mod=task.dispatched[0],
            target=task.target,
            space_generator=both if _flops(task.dispatched[0]) < SERIAL_MAX_FLOPS else "post-order-apply",
            search_strategy="evolutionary",
            task_name=task.task_name,
            logger=TASK_LOG,
        ).clone()
        for task in tasks
    ]
    return contexts, [float(task.weight) for task in tasks]


def _flops(workload: Any) -> float:
    from tvm.s_tir.analysis import estimate_tir_flops

    try:
        return float(estimate_tir_flops(workload))
    except Exception:  # an op it cannot count: taken as large
        return float("inf")


def design_space(mod: Any, target: Any) -> Any:
    """The target's default design space together with the same space without parallel loops.

    MetaSchedule's CPU rules parallelise every kernel, and each parallel kernel wakes TVM's pool
    threads, which Kiln sends to sleep at once (compiler.threads). A kernel of a few µs then
    costs more to wake the threads for than to run: a tuned transformer encoder ran 6x slower
    than its untuned, serial build. Searching both spaces lets measurement choose per kernel.
    """
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.schedule_rule import ParallelizeVectorizeUnroll

    _import_tensor_intrinsics()  # what TuneContext imports first, made fast
    default = ms.space_generator.PostOrderApply()
    ms.TuneContext(mod=mod, target=target, space_generator=default)  # fills in the target's rules
    serial_rules = [
        ParallelizeVectorizeUnroll(
            max_jobs_per_core=-1,
            max_vectorize_extent=rule.max_vectorize_extent,
            unroll_max_steps=list(rule.unroll_max_steps),
            unroll_explicit=rule.unroll_explicit,
        )
        if isinstance(rule, ParallelizeVectorizeUnroll)
        else rule
        for rule in default.sch_rules
    ]
    postprocs, mutators = list(default.postprocs), dict(default.mutator_probs)
    serial = ms.space_generator.PostOrderApply(
        sch_rules=serial_rules, postprocs=postprocs, mutator_probs=mutators
    )
    return ms.space_generator.SpaceGeneratorUnion(
        [default, serial], sch_rules=list(default.sch_rules), postprocs=postprocs, mutator_probs=mutators
    )


def lower_for_tuning(mod: Any, target: Any) -> Any:
    """Relax ops -> fused PrimFunc kernels: the form MetaSchedule extracts tasks from.

    3x3 convolutions become Winograd kernels where that pays (`tvm_winograd`); FoldConstant
    first makes their weights constants in their final layout. Weights are marked layout-free, so
    a schedule may read them in whatever layout suits its tiling (MetaSchedule's RewriteLayout);
    `_prepack_weights` then converts them once.
    """
    import tvm
    from tvm import relax

    from compiler.backends.tvm_winograd import legalize_conv2d

    with target:
        mod = relax.transform.DecomposeOpsForInference()(mod)
        mod = relax.transform.CanonicalizeBindings()(mod)
        mod = relax.transform.FoldConstant()(mod)
        mod = relax.transform.LegalizeOps({"relax.nn.conv2d": legalize_conv2d})(mod)
        mod = tvm.transform.Sequential([relax.get_pipeline("zero")])(mod)
        return relax.transform.AttachAttrLayoutFreeBuffers()(mod)


def _prepack_weights(mod: Any) -> Any:
    """Move the tuned kernels' weight-layout rewrites out of the kernels, into bindings that
    depend on constants only, and fold them: weights are packed at compile time, not per call."""
    from tvm import relax

    for apply in (
        relax.transform.SplitLayoutRewritePreproc(),
        relax.transform.LiftTransformParams(),
        relax.transform.FoldConstant(),
    ):
        mod = apply(mod)
    return mod


def _import_tensor_intrinsics() -> None:
    """What TuneContext imports first, made fast: tvm.s_tir.tensor_intrin parses ~250 TVMScript
    functions, each calling inspect.stack(), which looks up every frame's source file and scans
    sys.modules for it. With torch loaded that import took 1-2.5 minutes here. The parser only
    reads the frames themselves, so it gets them without the lookups."""
    import inspect
    import sys

    if "tvm.s_tir.tensor_intrin" in sys.modules:
        return

    def frames(context: int = 1) -> list[inspect.FrameInfo]:
        found: list[inspect.FrameInfo] = []
        frame: FrameType | None = sys._getframe(1)
        while frame is not None:
            code = frame.f_code
            found.append(inspect.FrameInfo(frame, code.co_filename, frame.f_lineno, code.co_name, None, None))
            frame = frame.f_back
        return found

    stack = inspect.stack
    inspect.stack = frames
    try:
        import tvm.s_tir.tensor_intrin  # noqa: F401
    finally:
        inspect.stack = stack


def build_candidate(mod: Any, target: Any, _params: Any) -> Any:
    """LocalBuilder's default build without `import tvm.s_tir.tensor_intrin` (see the docstring)."""
    from tvm.driver import build
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    return build(mod, target=target)


class _Tracker:
    """Counts trials and keeps each task's best time, for the job's progress."""

    def __init__(self, tasks: list[TaskReport], total: int, progress: TuningProgress) -> None:
        self.tasks = tasks
        self.total = total
        self.trials = 0
        self.failed = 0
        self.last_error = ""
        self.progress = progress

    def callback(self) -> Any:
        from tvm.ir.utils import derived_object
        from tvm.s_tir import meta_schedule as ms

        tracker = self

        @derived_object
        class Callback(ms.measure_callback.PyMeasureCallback):
            def apply(self, scheduler: Any, task_id: int, candidates: Any, builds: Any, runs: Any) -> None:
                tracker.record(task_id, builds, runs)

        return Callback()

    def record(self, task_id: int, builds: Any, runs: Any) -> None:
        task = self.tasks[task_id]
        times = [_mean_ms(run.run_secs) for run in runs if run.error_msg is None and run.run_secs]
        for build, run in zip(builds, runs, strict=True):
            if build.error_msg or run.error_msg:  # a bad candidate is normal; all bad is not
                self.failed += 1
                self.last_error = _last_line(str(build.error_msg or run.error_msg))
        task.new_trials += len(runs)
        self.trials += len(runs)
        if times and (task.best_ms is None or min(times) < task.best_ms):
            task.best_ms = min(times)
        timed = [t for t in self.tasks if t.best_ms is not None]
        estimate = sum(t.best_ms * t.weight for t in timed if t.best_ms is not None)
        self.progress(
            {
                "trials_done": self.trials,
                "trials_total": self.total,
                "failed_trials": self.failed,
                "best_estimate_ms": round(estimate, 4) if len(timed) == len(self.tasks) else None,
            }
        )


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else text


def _mean_ms(run_secs: Any) -> float:
    values = [float(s) for s in run_secs]
    return 1000 * sum(values) / len(values)


def _hash(workload_mod: Any) -> str:
    import tvm_ffi

    return f"{tvm_ffi.structural_hash(workload_mod) & 0xFFFFFFFFFFFFFFFF:016x}"


def _commit(database: Any, item: WorkloadRecords) -> bool:
    """Add cached records to the database; one that no longer loads (an older format, another
    TVM) is skipped with a warning: a stale cache entry costs trials, never the compile. Whether
    they were added."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    try:
        workload = ms.database.Workload.from_json(tvm.ir.load_json(item.workload))
        records = [ms.database.TuningRecord.from_json(json.loads(r), workload) for r in item.records]
    except Exception as exc:  # TVM raises many types, with C++ traces
        log.warning("skipping the cached tuning record %s: %s", item.workload_hash, _last_line(str(exc)))
        return False
    database.commit_workload(workload.mod)
    for record in records:
        database.commit_tuning_record(record)
    return True


def _checked_database(database: Any, tasks: Sequence[Any], reports: Sequence[TaskReport], target: Any) -> Any:
    """A database with, per kernel, the fastest of its SCHEDULES_CHECKED best schedules that
    computes what its untuned build does on random inputs; none for a kernel without one, which
    then stays untuned while the rest of the model is tuned."""
    from tvm.s_tir import meta_schedule as ms

    checked = ms.database.MemoryDatabase()
    for task, report in zip(tasks, reports, strict=True):
        kernel = task.dispatched[0]
        if not database.has_workload(kernel):
            continue
        records = database.get_top_k(database.commit_workload(kernel), SCHEDULES_CHECKED)
        if not records:
            continue
        args = _random_args(kernel)
        want = _run(kernel, target, args)
        for record in records:
            problem = _schedule_problem(kernel, record, target, args, want)
            if problem is None:
                workload = checked.commit_workload(kernel)
                checked.commit_tuning_record(
                    ms.database.TuningRecord(
                        record.trace, workload, record.run_secs, record.target, record.args_info
                    )
                )
                break
            report.wrong_schedules += 1
            log.warning("kernel %s: a tuned schedule %s; left out", report.name, problem)
        else:
            log.warning("kernel %s: no tuned schedule computes it correctly; it stays untuned", report.name)
    return checked


def _schedule_problem(
    kernel: Any, record: Any, target: Any, args: Sequence[Any], want: Sequence[Any]
) -> str | None:
    """What is wrong with the record's schedule of the kernel, if anything. One that no longer
    applies or builds (a cached record of another TVM, say) is left out like a wrong one."""
    try:
        error = _relative_error(_run(_scheduled(kernel, record), target, args), want)
    except Exception as exc:  # TVM raises many types, with C++ traces
        return f"fails to apply, build or run ({_last_line(str(exc))})"
    return None if error <= KERNEL_TOLERANCE else f"is {error:.3g} off"


def _random_args(kernel: Any) -> list[Any]:
    """Normal floats; integers (and booleans) zero, so that indices into a gather stay in range."""
    import numpy as np
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    rng = np.random.default_rng(0)
    args = []
    (function,) = kernel.functions.values()
    for info in ArgInfo.from_prim_func(function):
        shape, dtype = [int(d) for d in info.shape], str(info.dtype)
        if dtype.startswith(("float", "bfloat")):
            args.append(rng.standard_normal(shape).astype(dtype))
        else:
            args.append(np.zeros(shape, dtype))
    return args


def _scheduled(kernel: Any, record: Any) -> Any:
    """The kernel with the record's schedule applied, as MetaScheduleApplyDatabase applies it."""
    from tvm.s_tir import Schedule

    schedule = Schedule(kernel)
    record.trace.apply_to_schedule(schedule, remove_postproc=False)
    return schedule.mod


def _run(kernel: Any, target: Any, args: Sequence[Any]) -> list[Any]:
    """Every argument after one call, on copies: a kernel writes its outputs into its last ones."""
    import tvm

    (name,) = [gv.name_hint for gv in kernel.functions]
    tensors = [tvm.runtime.tensor(arg) for arg in args]
    tvm.tirx.build(kernel, target=target)[name](*tensors)
    return [tensor.numpy() for tensor in tensors]


def _relative_error(got: Sequence[Any], want: Sequence[Any]) -> float:
    """The largest difference over the largest value, per argument; NaN or inf where the untuned
    kernel has it too counts as equal."""
    import numpy as np

    worst = 0.0
    for g, w in zip(got, want, strict=True):
        g, w = g.astype(np.float64), w.astype(np.float64)
        same = (g == w) | (np.isnan(g) & np.isnan(w))
        diff = np.where(same, 0.0, np.abs(g - w))
        if np.isnan(diff).any():
            return float("inf")
        finite = np.abs(w[np.isfinite(w)])
        scale = max(float(finite.max()) if finite.size else 0.0, np.finfo(np.float64).tiny)
        worst = max(worst, float(diff.max(initial=0.0)) / scale)
    return worst


def _export(database: Any, workload_mod: Any, report: TaskReport) -> WorkloadRecords:
    import tvm

    workload = database.commit_workload(workload_mod)
    best = database.get_top_k(workload, RECORDS_KEPT)
    record_json = tvm.get_global_func("s_tir.meta_schedule.TuningRecordAsJSON")
    return WorkloadRecords(
        report.workload_hash,
        tvm.ir.save_json(workload.as_json()),
        [json.dumps(_plain(record_json(record))) for record in best],
        report.earlier_trials + report.new_trials,
    )


def _plain(value: Any) -> Any:
    """A record's JSON object as plain JSON, written as MetaSchedule's JSONDatabase writes its
    file: any other object (a layout rewrite's IndexMap) becomes its TVM JSON string, which
    TuningRecord.from_json parses back. TuningRecord.as_json() rejects such objects."""
    import tvm

    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, tvm.tirx.IntImm | tvm.tirx.FloatImm):
        return value.value
    if isinstance(value, tvm.ir.Array):
        return [_plain(item) for item in value]
    if isinstance(value, tvm.ir.Map):
        return {str(key): _plain(item) for key, item in value.items()}
    return tvm.ir.save_json(value)
