"""After a variant turns ready, its version's ready variants for that target race side by side.

The worker that finished the job has the target's hardware, so it times every ready compiled
variant and TorchScript together (`compiler.race`) and gives them all the numbers of that one
run: the router then compares variants measured under the same load, not minutes apart.
"""

from __future__ import annotations

import logging
import time

from compiler.backends import REFERENCE
from compiler.errors import CompilerError
from compiler.race import ROUND_S, race_artifacts
from service import metrics
from service.errors import NotFoundError
from service.records import VariantRecord, VariantStatus, VersionRecord, now
from service.registry import ARTIFACT_BLOB, MODEL_BLOB, Registry
from service.sandbox import SandboxError, run_in_child
from service.settings import Settings
from service.store.base import BlobNotFoundError

log = logging.getLogger("kiln.races")


def contestants(variants: list[VariantRecord], target: str) -> list[VariantRecord]:
    """The compiled variants that serve on `target`; TorchScript runs in every race anyway."""
    return [
        v
        for v in variants
        if v.status == VariantStatus.ready
        and v.target == target
        and v.backend != REFERENCE
        and v.artifact_key is not None
    ]


def race_version(registry: Registry, settings: Settings, version: VersionRecord, target: str) -> None:
    """Re-time the version's ready variants for `target` together; a race that cannot run
    leaves each variant's compile-time numbers, which already passed, in place."""
    if settings.race_rounds <= 0:
        return
    raced = contestants(registry.variants_of(version), target)
    if len(raced) < 2:  # one variant was already timed against TorchScript when it compiled
        return
    store = registry.store
    started = time.monotonic()
    try:
        model = store.get_blob(MODEL_BLOB.format(sha256=version.sha256))
        artifacts = {v.id: store.get_blob(ARTIFACT_BLOB.format(key=v.artifact_key)) for v in raced}
        timings = run_in_child(
            race_artifacts,
            (model, version.spec().to_dict(), artifacts, settings.threads, settings.race_rounds, ROUND_S),
            timeout_s=settings.compile_timeout_s,
            memory_mb=settings.compile_memory_mb,
        )
    except (BlobNotFoundError, NotFoundError):
        log.info("%s v%d: deleted during its race", version.name, version.version)
        return
    except (CompilerError, SandboxError) as exc:
        log.warning("%s v%d: the race on %s did not finish: %s", version.name, version.version, target, exc)
        return
    baseline = timings[REFERENCE]
    stamp = now()
    for variant in raced:
        ms = timings[variant.id]
        registry.update_variant(
            variant.id,
            latency_ms=ms.get(1),
            latency_ms_by_batch=ms,
            baseline_latency_ms_by_batch=baseline,
            raced_at=stamp,
        )
    metrics.RACE_SECONDS.observe(time.monotonic() - started)
    log.info(
        "%s v%d: raced on %s: %s",
        version.name,
        version.version,
        target,
        "; ".join(
            f"{name} {shown(ms)}"
            for name, ms in [(REFERENCE, baseline)]
            + [(f"{v.backend}{v.options or ''}", timings[v.id]) for v in raced]
        ),
    )


def shown(ms: dict[int, float]) -> str:
    return ", ".join(f"b{b} {t:.3g} ms" for b, t in sorted(ms.items()))
