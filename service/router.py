"""Routing: which variant serves a request. The fastest verified one, never a slower one."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from compiler.backends import ANY_TARGET, REFERENCE, REGISTRY, pads_batches, reference_target
from service.errors import BadRequestError, NotFoundError
from service.records import VariantRecord, VariantStatus, VersionRecord
from service.registry import ModelView


def latency_at(table: Mapping[int, float], batch: int, padded: bool = False) -> float | None:
    """Latency at `batch`, from those measured (at batch 1 and the largest): between two, on the
    line joining them, as a batch costs more with each row; a `padded` variant's, that of the
    larger, which it runs (compiler.backends.pads_batches). Past the largest, the largest's."""
    if not table:
        return None
    above = [b for b in table if b >= batch]
    below = [b for b in table if b <= batch]
    if not above:
        return table[max(table)]
    high = min(above)
    if padded or not below or high == batch:
        return table[high]
    low = max(below)
    return table[low] + (table[high] - table[low]) * (batch - low) / (high - low)


def servable(variants: Iterable[VariantRecord], targets: set[str]) -> list[VariantRecord]:
    return [
        v
        for v in variants
        if v.status == VariantStatus.ready and (v.target == ANY_TARGET or v.target in targets)
    ]


def serving_group(ready: list[VariantRecord]) -> list[VariantRecord]:
    """The ready variants a host serves from, all timed against one TorchScript: those of its
    first GPU target whose TorchScript is ready there, since a host with a GPU serves from it;
    else the CPU's (`any` and cpu targets). Speedups against different baselines do not compare."""
    gpus = sorted({v.target for v in ready if v.backend == REFERENCE and v.target != ANY_TARGET})
    group = gpus[0] if gpus else ANY_TARGET
    return [v for v in ready if reference_target(v.target) == group]


def choose_variant(
    variants: Iterable[VariantRecord], targets: set[str], batch: int, backend: str | None = None
) -> VariantRecord:
    """A compiled variant replaces TorchScript only when it was measured faster at this batch
    size than TorchScript timed in the same run; among those the largest speedup wins.

    Variants are timed when they compile: minutes apart, after a long tuning run or beside other
    work, on any worker of the target. Their ratio to TorchScript timed in the same run cancels
    how loaded that machine was; their absolute times do not (a tuned TVM variant 13% faster in
    an interleaved benchmark lost to ONNX Runtime on absolute compile-time numbers). Once the
    version's variants have raced (service.races) they share one TorchScript timing, and the
    ratio orders them as their times in that race do.
    """
    if backend is not None and backend not in REGISTRY:  # a typo is not a compile still to come
        raise BadRequestError(f"unknown backend {backend!r}; use one of {sorted(REGISTRY)}")
    ready = servable(variants, targets)
    if backend is not None:
        pinned = [v for v in ready if v.backend == backend]
        if not pinned:
            raise NotFoundError(f"no ready {backend!r} variant for this host's targets")
        return min(pinned, key=lambda v: variant_latency(v, batch) or 0.0)
    group = serving_group(ready)
    reference = [v for v in group if v.backend == REFERENCE]
    if not reference:
        raise NotFoundError("no ready variant for this host")
    best, best_ratio = reference[0], 1.0
    for variant in group:
        ratio = cost_ratio(variant, batch)
        if variant.backend != REFERENCE and ratio is not None and ratio < best_ratio:
            best, best_ratio = variant, ratio
    return best


def cost_ratio(variant: VariantRecord, batch: int) -> float | None:
    """Latency at this batch size over TorchScript's timed in the same run: 1.0 for TorchScript
    itself, None when not measured."""
    if variant.backend == REFERENCE:
        return 1.0
    ms = variant_latency(variant, batch)
    base = latency_at(variant.baseline_latency_ms_by_batch, batch)
    return None if ms is None or not base else ms / base


def variant_latency(variant: VariantRecord, batch: int) -> float | None:
    return latency_at(variant.latency_ms_by_batch, batch, pads_batches(variant.backend, variant.options))


def serving_version(view: ModelView, targets: set[str]) -> tuple[VersionRecord, list[VariantRecord]]:
    """The model's default version, if it has one, else the newest version, that has a ready
    variant for this host. A default that has none is an error, not a reason to serve the
    version it rolled back from."""
    for version, variants in sorted(view.versions, key=lambda pair: -pair[0].version):
        if view.default_version in (None, version.version) and servable(variants, targets):
            return version, variants
    if view.default_version is not None:
        raise NotFoundError(f"default version {view.default_version} has no variant ready on this host")
    raise NotFoundError("no version of this model is ready to serve on this host")
