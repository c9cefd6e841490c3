"""The compile job: one variant, from the artifact cache or a sandboxed compile, to ready or failed.

Both queues (Dramatiq in Redis mode, the in-process pool in embedded mode) call `run_compile_job`.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from compiler.artifact import Artifact, artifact_key
from compiler.backends import REFERENCE, get_backend, reference_target
from compiler.errors import CompilerError, VerificationError, failure
from compiler.pipeline import CompileOptions, compile_to_bytes
from service import metrics, tuning
from service.errors import KilnError, NotFoundError
from service.races import race_version
from service.records import (
    SETTLED,
    SETTLED_JOBS,
    TUNING_TRIALS,
    ArtifactRecord,
    JobRecord,
    JobStatus,
    VariantRecord,
    VariantStatus,
    VersionRecord,
    now,
)
from service.registry import MODEL_BLOB, Registry
from service.sandbox import ChildCancelledError, SandboxError, run_in_child
from service.settings import Settings
from service.store import StoreError, StoreUnavailableError

log = logging.getLogger("kiln.jobs")

# Deliveries of one job that may start and end without settling its variant: Dramatiq retries a
# raising job 5 times and redelivers a killed worker's job without counting, and a lost message
# is enqueued again (service.redelivery, which counts that as an attempt too). Past this, a job
# that keeps killing its worker, failing or losing its message fails its variant with a reason,
# rather than loop forever.
MAX_ATTEMPTS = 12
# Seconds between the tries at storing a finished compile's results while the store is out: an
# hour of tuning is not thrown away for a blink of Redis.
KEEP_WAITS_S = (1.0, 2.0, 4.0, 8.0)


def this_worker() -> str:
    """What a job record's `worker` names: the process that runs compiles, on which host."""
    return f"{socket.gethostname()}-{os.getpid()}"


def variant_key(version: VersionRecord, variant: VariantRecord, threads: int) -> str:
    """The artifact's content address: what it was built from, and with. `threads` (KILN_THREADS)
    is built into ONNX Runtime's sessions and TVM's library, and its timings were taken with it:
    a host of fewer threads must not take them from the cache."""
    backend = get_backend(variant.backend)
    rtol, atol = version.config.tolerance(variant.options)
    options: dict[str, Any] = {"rtol": rtol, "atol": atol, "threads": threads}
    if variant.options:  # absent when empty, so the keys of plain variants never change
        options["backend"] = variant.options
    if version.config.samples:  # verified on them too: an artifact checked without them is another
        options["samples"] = version.config.samples
    return artifact_key(
        version.sha256,
        variant.backend,
        backend.version(),
        variant.target,
        version.spec(),
        options,
    )


def run_compile_job(
    registry: Registry, settings: Settings, job_id: str, stopping: threading.Event | None = None
) -> None:
    """Run one job to a settled variant, then race it. Store outages before the variant settles
    propagate, so that the queue retries. Once `stopping` is set, a compile under way is stopped
    and the job left unsettled, for a process that starts to take up."""
    try:
        job = registry.get_job(job_id)
        version = registry.get_version(job.model, job.version)
    except NotFoundError:
        log.info("job %s: its model was deleted; dropping it", job_id)
        return
    variant = unsettled_variant(registry, job)
    if variant is None:
        settle_behind(registry, job)
        return
    if give_up(registry, job):
        return
    registry.update_job(
        job.id,
        status=JobStatus.running,
        attempts=job.attempts + 1,
        started_at=now(),
        error=None,
        worker=this_worker(),
    )
    # This host's library and devices decide, before any work: an API cannot know them.
    reason = get_backend(job.backend).unavailable_reason(job.target)
    if reason is not None:
        _settle_failed(registry, job, VariantStatus.failed, reason)
        return
    key = variant_key(version, variant, settings.threads)
    if _take_cached(registry, job, key):
        metrics.CACHE_HITS.labels(job.backend).inc()
    else:
        metrics.CACHE_MISSES.labels(job.backend).inc()
        if not _compile(registry, settings, job, version, key, stopping or threading.Event()):
            return
    if stopping is None or not stopping.is_set():
        # Serving already uses the new variant where its own numbers say so; the race settles it.
        race_version(registry, settings, version, job.target)


def _take_cached(registry: Registry, job: JobRecord, key: str) -> bool:
    """Whether an identical compile's artifact was there for the job's variant to take. Taken
    under the lock a deletion collects artifacts under: the deletion of that compile's model may
    have collected it since it was found, and the variant would point at nothing."""
    if registry.get_artifact(key) is None:
        return False
    with registry.marking_ready(job.model):
        cached = registry.get_artifact(key)
        if cached is not None:
            log.info("job %s: artifact cache hit %s", job.id, key[:12])
            _mark_ready(registry, job, key, cached, cache_hit=True)
    return cached is not None


def unsettled_variant(registry: Registry, job: JobRecord) -> VariantRecord | None:
    """The variant the job is still to settle; None when it was deleted, settled already (a
    redelivery of a job that finished) or handed to another job (a retry replaced this one)."""
    variant = registry.get_variant(job.variant_id)
    if variant is None or variant.status in SETTLED or variant.job_id != job.id:
        return None
    return variant


def settle_behind(registry: Registry, job: JobRecord) -> bool:
    """A job whose variant settled while the job did not (the store failed between the two
    writes, and the retry found its variant settled) takes the variant's outcome, or its events
    stream, and `kiln upload` following it, would never end; whether it did."""
    if job.status in SETTLED_JOBS:
        return False
    variant = registry.get_variant(job.variant_id)
    if variant is None or variant.job_id != job.id or variant.status not in SETTLED:
        return False
    log.warning("job %s: its variant %s settled %s before the job did", job.id, variant.id, variant.status)
    if variant.status == VariantStatus.ready:
        fields: dict[str, object] = {"status": JobStatus.succeeded, "cache_hit": variant.cache_hit}
    else:
        fields = {"status": JobStatus.failed, "error": variant.error}
    registry.update_job(job.id, stage=variant.status, finished_at=now(), **fields)
    return True


def give_up(registry: Registry, job: JobRecord) -> bool:
    """Fails the job's variant once the job has had MAX_ATTEMPTS deliveries; whether it did."""
    if job.attempts < MAX_ATTEMPTS:
        return False
    reason = (
        f"gave up after {job.attempts} attempts that ended before the variant settled (a worker "
        "killed, the store unreachable, or its message lost); add it again with retry_failed to "
        "compile it anew"
    )
    _settle_failed(registry, job, VariantStatus.failed, reason)
    return True


def compile_limit_s(settings: Settings, job: JobRecord) -> float:
    """How long the job's compile child may run: a tuned build gets more time per trial it asks
    for, which is the most it runs (compiler.backends.tvm_tune)."""
    return settings.compile_timeout_s + _tuning_trials(job) * settings.tuning_s_per_trial


def _tuning_trials(job: JobRecord) -> int:
    return int(job.options.get(TUNING_TRIALS, 0))


def _compile(
    registry: Registry,
    settings: Settings,
    job: JobRecord,
    version: VersionRecord,
    key: str,
    stopping: threading.Event,
) -> bool:
    """True when the variant turned ready."""
    model = registry.store.get_blob(MODEL_BLOB.format(sha256=version.sha256))
    rtol, atol = version.config.tolerance(job.options)
    records = tuning.records_for(registry.store, job.target, settings.threads) if _tuning_trials(job) else []
    options = CompileOptions(
        rtol=rtol,
        atol=atol,
        threads=settings.threads,
        backend_options=job.options,
        tuning_records=records,
    )

    def on_progress(event: dict[str, Any]) -> None:
        try:
            if "stage" in event:
                registry.set_stage(job, VariantStatus(event["stage"]))
            if "tuning" in event:
                registry.update_job(job.id, tuning=event["tuning"])
        except StoreUnavailableError as exc:  # shown late: no reason to lose an hour of tuning
            log.warning("job %s: progress not recorded: %s", job.id, exc)

    def deleted() -> bool:
        # A deleted model's compile would hold a worker for nothing, up to its whole time limit.
        try:
            return registry.get_variant(job.variant_id) is None
        except StoreUnavailableError:  # an outage is no reason to lose the work done so far
            return False

    started = time.monotonic()

    def observe(outcome: VariantStatus) -> None:
        metrics.COMPILE_SECONDS.labels(job.backend, outcome.value).observe(time.monotonic() - started)

    try:
        packed, report = run_in_child(
            compile_to_bytes,
            (
                model,
                version.spec().to_dict(),
                job.backend,
                job.target,
                options,
                version.config.samples,
            ),
            timeout_s=compile_limit_s(settings, job),
            memory_mb=settings.compile_memory_mb,
            on_progress=on_progress,
            cancelled=lambda: stopping.is_set() or deleted(),
        )
    except ChildCancelledError:
        if stopping.is_set():
            # A restart is no failed attempt: twelve rollouts would otherwise fail a long tuning.
            registry.update_job(job.id, attempts=job.attempts)
            log.info("job %s: stopped the compile, as this process stops; it is taken up again", job.id)
        else:
            log.info("job %s: its model was deleted while it compiled; stopped the compile", job.id)
        return False
    except VerificationError as exc:
        observe(VariantStatus.rejected)
        _settle_failed(registry, job, VariantStatus.rejected, str(exc))
        return False
    except (CompilerError, SandboxError) as exc:
        observe(VariantStatus.failed)
        _settle_failed(registry, job, VariantStatus.failed, f"{job.backend}: {exc}")
        return False
    except (StoreError, KilnError):  # here, by the progress callbacks: the store's, for the queue to retry
        raise
    except Exception as exc:  # raised in the child, by a backend or a model run: fails this variant alone
        log.exception("job %s: the compile raised", job.id)
        observe(VariantStatus.failed)
        _settle_failed(registry, job, VariantStatus.failed, f"{job.backend}: {failure(exc)}")
        return False
    observe(VariantStatus.ready)
    record = ArtifactRecord(
        key=key,
        backend=job.backend,
        target=job.target,
        size=len(packed),
        compile_s=report["compile_s"],
        max_abs_error=report["max_abs_error"],
        latency_ms_by_batch=report["latency_ms"],
        baseline_latency_ms_by_batch=report["baseline_latency_ms"],
    )
    Artifact.unpack(packed)  # never store bytes that would not load back

    def keep() -> bool:  # each write may be done twice
        if report["new_tuning_records"]:
            tuning.save_records(registry.store, job.target, settings.threads, report["new_tuning_records"])
        if report["tuning"]:
            registry.update_job(job.id, tuning=report["tuning"])
        if registry.get_variant(job.variant_id) is None:
            # Its model was deleted while it compiled: stored now, the artifact would belong to
            # nothing. (Tuning records are kept: any model may reuse them.)
            log.info("job %s: its model was deleted while it compiled; dropping the artifact", job.id)
            return False
        registry.put_artifact(record, packed)  # outside the locks: it may take seconds
        with registry.marking_ready(job.model):
            if registry.get_variant(job.variant_id) is None:
                # Deleted since: its deletion may have read the variant before it had the
                # artifact, and would never collect it.
                log.info(
                    "job %s: its model was deleted as it stored the artifact; dropping the artifact", job.id
                )
                registry.collect_artifacts([key])
                return False
            if registry.get_artifact(key) is None:  # collected with the model of an identical compile
                registry.put_artifact(record, packed)
            _mark_ready(registry, job, key, record, cache_hit=False)
        return True

    return _through_outage(job, keep)


def _through_outage(job: JobRecord, write: Callable[[], bool]) -> bool:
    """A finished compile's results, written again through a store outage of up to about
    KEEP_WAITS_S's sum: only then does the queue's retry throw the compile away and start anew."""
    for wait in KEEP_WAITS_S:
        try:
            return write()
        except StoreUnavailableError as exc:
            log.warning("job %s: its results are not stored yet (%s); again in %g s", job.id, exc, wait)
            time.sleep(wait)
    return write()


def _mark_ready(
    registry: Registry, job: JobRecord, key: str, record: ArtifactRecord, cache_hit: bool
) -> None:
    latency = record.latency_ms_by_batch
    registry.update_variant(
        job.variant_id,
        status=VariantStatus.ready,
        error=None,
        artifact_key=key,
        cache_hit=cache_hit,
        max_abs_error=record.max_abs_error,
        latency_ms=latency.get(1),
        latency_ms_by_batch=latency,
        baseline_latency_ms_by_batch=record.baseline_latency_ms_by_batch,
    )
    registry.update_job(
        job.id,
        status=JobStatus.succeeded,
        stage=VariantStatus.ready,
        cache_hit=cache_hit,
        finished_at=now(),
    )
    _record_baseline(registry, job, record)
    log.info(
        "job %s: %s variant %s ready (%s)",
        job.id,
        job.backend,
        job.variant_id,
        "cache hit" if cache_hit else f"compiled in {record.compile_s:.1f} s",
    )


def _record_baseline(registry: Registry, job: JobRecord, record: ArtifactRecord) -> None:
    """Give the version's TorchScript variant that the job was timed against (on the CPU, or on
    the job's GPU) the latency its worker measured, for display."""
    try:
        version = registry.get_version(job.model, job.version)
    except NotFoundError:
        return  # deleted since the job began
    timed_against = reference_target(job.target)
    for variant in registry.variants_of(version):
        shows = variant.backend == REFERENCE and variant.target == timed_against
        if shows and not variant.latency_ms_by_batch:
            baseline = record.baseline_latency_ms_by_batch
            registry.update_variant(
                variant.id,
                latency_ms=baseline.get(1),
                latency_ms_by_batch=baseline,
                max_abs_error=0.0,
            )


def _settle_failed(registry: Registry, job: JobRecord, status: VariantStatus, reason: str) -> None:
    log.warning("job %s: %s variant %s %s: %s", job.id, job.backend, job.variant_id, status, reason)
    registry.update_variant(job.variant_id, status=status, error=reason)
    registry.update_job(job.id, status=JobStatus.failed, stage=status, error=reason, finished_at=now())
