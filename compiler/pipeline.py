"""The whole offline compile: build for one (backend, target), verify against TorchScript, time both."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from compiler.artifact import Artifact
from compiler.backends import ANY_TARGET, REFERENCE, get_backend, load_artifact, reference_target
from compiler.benchmark import at_worst, benchmark, long_latency
from compiler.dims import OutsideDimsError
from compiler.errors import BackendUnavailableError, ConversionError, VerificationError, raised_as
from compiler.spec import InputSpec
from compiler.threads import set_threads
from compiler.verify import verify

Progress = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class CompileOptions:
    rtol: float = 1e-4
    atol: float = 1e-5
    threads: int = 1
    backend_options: Mapping[str, Any] | None = None
    # Earlier MetaSchedule records for this target (WorkloadRecords dicts), for tuned builds.
    tuning_records: Sequence[Mapping[str, Any]] = ()


@dataclass
class CompileResult:
    artifact: Artifact
    compile_s: float
    max_abs_error: float
    max_rel_error: float
    # batch size -> median ms, for the candidate and for TorchScript timed in the same process
    latency_ms: dict[int, float]
    baseline_latency_ms: dict[int, float]
    # Tuned builds: what was tuned, and the new records to add to the shared cache.
    tuning: dict[str, Any] | None = None
    new_tuning_records: list[dict[str, Any]] | None = None

    def report(self) -> dict[str, Any]:
        doc = asdict(self)
        del doc["artifact"]
        return doc


def compile_and_check(
    model: bytes,
    spec: InputSpec,
    backend_name: str,
    target: str,
    options: CompileOptions,
    samples: Sequence[Mapping[str, np.ndarray]] = (),
    progress: Progress | None = None,
) -> CompileResult:
    """Raises ConversionError, VerificationError or BackendUnavailableError with a reason."""
    report = progress or (lambda event: None)
    set_threads(options.threads)
    backend = get_backend(backend_name)
    reason = backend.unavailable_reason(target)
    if reason is not None:
        raise BackendUnavailableError(reason)
    # Verified against TorchScript on the CPU (exact fp32), timed against TorchScript where the
    # target runs: for a cuda target, the upload on that GPU is the speed to beat.
    reference_backend = get_backend(REFERENCE)
    reference = reference_backend.load(reference_backend.compile(model, spec, ANY_TARGET, {}))
    on_target = reference
    if reference_target(target) != ANY_TARGET:
        on_target = reference_backend.load(reference_backend.compile(model, spec, target, {}))

    report({"stage": "compiling"})
    started = time.perf_counter()
    backend_options: dict[str, Any] = {"threads": options.threads, **(options.backend_options or {})}
    if backend_options.get("tuning_trials"):  # tvm's tuned build; other backends reject the option
        backend_options["tuning_records"] = options.tuning_records
        backend_options["progress"] = lambda event: report({"tuning": event})
    artifact = backend.compile(model, spec, target, backend_options)
    compile_s = time.perf_counter() - started
    # Records go to the shared cache, not into the artifact.
    new_records = artifact.meta.pop("new_tuning_records", None)
    # Verify what will be served: the packed bytes, loaded back.
    candidate = load_artifact(Artifact.unpack(artifact.pack()))

    report({"stage": "verifying"})
    with raised_as(VerificationError, "verification failed: a run raised"):  # the variant's, or the upload's
        checked = verify(candidate, reference, spec, options.rtol, options.atol, samples)
    if not checked.passed:
        raise VerificationError(f"verification failed: {checked.reason}")

    report({"stage": "benchmarking"})
    with raised_as(ConversionError, "benchmarking failed: a run raised"):
        try:
            latency = benchmark(candidate, spec).latency_ms
        except OutsideDimsError as exc:  # at batch 1 or the largest, sizes it does not take
            raise VerificationError(f"it cannot be timed: {exc}") from None
        baseline = benchmark(on_target, spec).latency_ms
        latency = at_worst(latency, long_latency(candidate, spec), baseline, long_latency(on_target, spec))
    artifact.meta["report"] = {
        "max_abs_error": checked.max_abs_error,
        "latency_ms": latency,
        "baseline_latency_ms": baseline,
    }
    return CompileResult(
        artifact,
        compile_s,
        checked.max_abs_error,
        checked.max_rel_error,
        latency,
        baseline,
        artifact.meta.get("tuning"),
        new_records,
    )


def compile_to_bytes(
    model: bytes,
    spec_doc: dict[str, Any],
    backend_name: str,
    target: str,
    options: CompileOptions,
    samples: Sequence[Mapping[str, Any]],
    progress: Progress,
) -> tuple[bytes, dict[str, Any]]:
    """`compile_and_check` with plain inputs and outputs, for a sandboxed child process."""
    spec = InputSpec.from_dicts(spec_doc["inputs"], spec_doc["max_batch_size"])
    arrays = [spec.coerce(sample) for sample in samples]
    result = compile_and_check(model, spec, backend_name, target, options, arrays, progress)
    return result.artifact.pack(), result.report()
