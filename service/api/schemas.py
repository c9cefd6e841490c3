"""Response bodies of the native /v1 API."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from service.records import (
    JobStatus,
    Options,
    OutputInfo,
    TensorConfig,
    VariantRecord,
    VariantStatus,
    VersionRecord,
)


class VariantRef(BaseModel):
    id: str
    backend: str
    target: str


class VariantOut(VariantRef):
    options: Options = Field(description='Backend options it was built with, e.g. {"precision": "fp16"}.')
    status: VariantStatus
    error: str | None
    job_id: str | None
    cache_hit: bool
    max_abs_error: float | None
    latency_ms: float | None = Field(description="Median latency at batch 1, measured by the worker.")
    latency_ms_by_batch: dict[int, float]
    baseline_latency_ms_by_batch: dict[int, float] = Field(
        description="TorchScript's latency, timed in the same run as this variant."
    )

    @classmethod
    def of(cls, variant: VariantRecord) -> VariantOut:
        return cls.model_validate(variant.model_dump())


class VersionOut(BaseModel):
    version: int
    sha256: str
    created_at: float
    inputs: list[TensorConfig]
    outputs: list[OutputInfo]
    max_batch_size: int
    variants: list[VariantOut]

    @classmethod
    def of(cls, version: VersionRecord, variants: list[VariantRecord]) -> VersionOut:
        return cls(
            version=version.version,
            sha256=version.sha256,
            created_at=version.created_at,
            inputs=version.config.inputs,
            outputs=version.outputs,
            max_batch_size=version.config.max_batch_size or 1,
            variants=[VariantOut.of(v) for v in variants],
        )


class ActiveOut(BaseModel):
    version: int
    variant_id: str
    backend: str
    target: str


class ModelOut(BaseModel):
    name: str
    versions: list[VersionOut]
    active: ActiveOut | None = Field(description="What serves batch-1 requests on this replica now.")


class ModelList(BaseModel):
    models: list[ModelOut]


class UploadOut(BaseModel):
    name: str
    version: int
    sha256: str
    deduplicated: bool = Field(
        description="True when these bytes and config were already uploaded: nothing new is compiled."
    )
    variants: list[VariantOut]


class JobOut(BaseModel):
    id: str
    variant_id: str
    model: str
    version: int
    backend: str
    target: str
    options: Options
    status: JobStatus
    stage: VariantStatus
    attempts: int
    error: str | None
    cache_hit: bool
    worker: str | None = Field(description="The worker (hostname-pid) that last started the job.")
    tuning: dict[str, Any] | None = Field(
        default=None,
        description="Tuned variants only: trials_done, trials_total, best_estimate_ms (the tuned kernels' "
        "summed best time), and when done `tasks`, each kernel's new_trials and whether cached "
        "records were `reused`.",
    )
    created_at: float
    started_at: float | None
    finished_at: float | None


class PredictIn(BaseModel):
    inputs: dict[str, Any] = Field(
        description="Input name -> nested lists.", examples=[{"x": [[0.1, 0.2, 0.3]]}]
    )


class PredictOut(BaseModel):
    outputs: dict[str, Any]
    model_version: int
    variant: VariantRef
