"""After a variant turns ready, its version's ready variants for that target race side by side.

The worker that finished the job has the target's hardware, so it times every ready compiled
variant and TorchScript together (`compiler.race`) and gives them all the numbers of that one
run: the router then compares variants measured under the same load, not minutes apart.
"""

from __future__ import annotations

import logging
import time

from compiler.backends import REFERENCE, get_backend, reference_target
from compiler.race import race_artifacts
from service import metrics
from service.records import VariantRecord, VariantStatus, VersionRecord, now, variant_label
from service.registry import ARTIFACT_BLOB, MODEL_BLOB, Registry
from service.sandbox import run_in_child
from service.settings import Settings

log = logging.getLogger("kiln.races")

# The race's child process may run this long; the job's queue message allows for it.
RACE_TIMEOUT_S = 300.0


# A variant this many times slower than TorchScript at every batch when it compiled cannot win
# a race, and timing it would take longest (untuned TVM: 15 s a call on ResNet-18 at batch 8).
HOPELESS = 2.0


def contender(ms: dict[int, float], baseline: dict[int, float]) -> bool:
    """Whether compile-time numbers leave a variant a chance to beat TorchScript at some batch."""
    return any(base and ms[b] < HOPELESS * base for b, base in baseline.items() if b in ms)


def contestants(variants: list[VariantRecord], target: str) -> list[VariantRecord]:
    """The compiled variants that serve on `target`, that this host can load and that can still
    win; TorchScript runs in every race anyway."""
    return [
        v
        for v in variants
        if v.status == VariantStatus.ready
        and v.target == target
        and v.backend != REFERENCE
        and v.artifact_key is not None
        and contender(v.latency_ms_by_batch, v.baseline_latency_ms_by_batch)
        and get_backend(v.backend).unavailable_reason(target) is None
    ]


def race_version(registry: Registry, settings: Settings, version: VersionRecord, target: str) -> None:
    """Re-time the version's ready variants for `target` together.

    Best effort, and never raises: the job it follows has already succeeded, and a redelivery
    would find its variant settled and do nothing. A race that cannot run or finish leaves each
    variant's compile-time numbers, which were good enough to serve, in place."""
    if settings.race_rounds <= 0:
        return
    serves = reference_target(target)
    started, stamp = time.monotonic(), now()
    try:
        raced = contestants(registry.variants_of(version), target)
        if len(raced) < 2:  # one variant was already timed against TorchScript when it compiled
            return
        store = registry.store
        model = store.get_blob(MODEL_BLOB.format(sha256=version.sha256))
        artifacts = {v.id: store.get_blob(ARTIFACT_BLOB.format(key=v.artifact_key)) for v in raced}
        timings = run_in_child(
            race_artifacts,
            (model, version.spec().to_dict(), target, artifacts, settings.threads, settings.race_rounds),
            timeout_s=RACE_TIMEOUT_S,
            memory_mb=settings.compile_memory_mb,
        )
        # Races of one version may overlap (two jobs settling together): the one that started
        # last saw the most variants, and an earlier one finishing after it must not win.
        current = {v.id: v for v in registry.variants_of(version)}
        if any((current[v.id].raced_at or 0) > stamp for v in raced if v.id in current):
            log.info("%s v%d: a later race on %s wrote first", version.name, version.version, target)
            return
        baseline = timings[REFERENCE]
        for variant in raced:
            ms = timings[variant.id]
            registry.update_variant(
                variant.id,
                latency_ms=ms.get(1),
                latency_ms_by_batch=ms,
                baseline_latency_ms_by_batch=baseline,
                raced_at=stamp,
            )
        # TorchScript's own row on this target's device shows the numbers its rivals were just
        # compared against.
        for reference in (v for v in current.values() if v.backend == REFERENCE and v.target == serves):
            registry.update_variant(reference.id, latency_ms=baseline.get(1), latency_ms_by_batch=baseline)
    except Exception as exc:  # store outage, deleted model, a runner that fails or hangs
        metrics.RACE_SECONDS.labels("failed").observe(time.monotonic() - started)
        log.warning("%s v%d: the race on %s did not finish: %s", version.name, version.version, target, exc)
        return
    metrics.RACE_SECONDS.labels("raced").observe(time.monotonic() - started)
    rows = [(REFERENCE, baseline), *((variant_label(v.backend, v.options), timings[v.id]) for v in raced)]
    log.info(
        "%s v%d: raced on %s: %s",
        version.name,
        version.version,
        target,
        "; ".join(f"{label} {shown(ms)}" for label, ms in rows),
    )


def shown(ms: dict[int, float]) -> str:
    return ", ".join(f"b{b} {t:.3g} ms" for b, t in sorted(ms.items()))
