"""A registry holding one version of a test model whose variants are ready with latencies set by
hand, so that a test knows which variant each measurement should favour."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from service.records import JobRecord, ModelConfig, OutputInfo, VariantRecord, VariantStatus, VersionRecord
from service.registry import ARTIFACT_BLOB, MODEL_BLOB, Registry
from service.router import ANY_TARGET
from tests.models import TestModel

# backend -> (target, packed artifact, latency ms by batch); TorchScript needs no artifact.
Ready = Mapping[str, tuple[str, bytes | None, dict[int, float]]]


def ready_version(
    registry: Registry, model: TestModel, variants: Ready, baseline: dict[int, float], **config: object
) -> None:
    """Version 1 of `model`, a ready variant per entry (its id and artifact key are its backend),
    each measured against TorchScript's `baseline`."""
    payload = model.torchscript()
    sha = hashlib.sha256(payload).hexdigest()
    registry.store.put_blob(MODEL_BLOB.format(sha256=sha), [payload])
    for backend, (_, packed, _) in variants.items():
        if packed is not None:
            registry.store.put_blob(ARTIFACT_BLOB.format(key=backend), [packed])

    def plan(name: str, number: int) -> tuple[list[VariantRecord], list[JobRecord]]:
        records = [
            VariantRecord(
                id=backend,
                model=name,
                version=number,
                backend=backend,
                target=target,
                status=VariantStatus.ready,
                artifact_key=backend if packed is not None else None,
                latency_ms_by_batch=ms,
                baseline_latency_ms_by_batch=baseline,
            )
            for backend, (target, packed, ms) in variants.items()
        ]
        return records, []

    outputs = [OutputInfo(name="output0", dtype="float32", shape=[-1, 10])]
    registry.create_version(ModelConfig.model_validate(model.config(**config)), sha, outputs, plan)


def reference(ms: dict[int, float]) -> tuple[str, None, dict[int, float]]:
    return ANY_TARGET, None, ms


def rejected_tvm(
    registry: Registry, model: TestModel, target: str, baseline: dict[int, float], job_id: str
) -> tuple[VersionRecord, VariantRecord]:
    """Version 1 of `model` with TorchScript ready and its `tvm` variant on `target` rejected by
    job `job_id`: the version, and that variant, to retry."""
    ready_version(
        registry, model, {"torchscript": reference(baseline), "tvm": (target, b"packed", baseline)}, baseline
    )
    registry.update_variant("tvm", status=VariantStatus.rejected, error="max abs error 3.2", job_id=job_id)
    version = registry.get_version(model.name, 1)
    [tvm] = [v for v in registry.variants_of(version) if v.id == "tvm"]
    return version, tvm
