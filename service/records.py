"""Metadata records kept in the store: models, versions, variants, jobs and artifacts."""

from __future__ import annotations

import time
import uuid
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field

from compiler.spec import DType


class VariantStatus(StrEnum):
    queued = "queued"
    compiling = "compiling"
    verifying = "verifying"
    benchmarking = "benchmarking"
    ready = "ready"
    failed = "failed"  # conversion failed, crashed or timed out
    rejected = "rejected"  # built, but its outputs were wrong, or the backend cannot run here


SETTLED = {VariantStatus.ready, VariantStatus.failed, VariantStatus.rejected}


class JobStatus(StrEnum):
    queued = "queued"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"


def now() -> float:
    return time.time()


def new_id() -> str:
    return uuid.uuid4().hex[:16]


class TensorConfig(BaseModel):
    name: str = Field(pattern=r"^[A-Za-z_][\w.]*$", max_length=64)
    dtype: DType
    shape: list[int] = Field(min_length=1, max_length=8)


class ModelConfig(BaseModel):
    """The `config` field of an upload. Only `name` and `inputs` are required."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=64)
    inputs: list[TensorConfig] = Field(min_length=1)
    max_batch_size: int | None = Field(default=None, ge=1, le=4096)
    backends: list[str] | None = None
    # Dynamic batching, as in Triton: how long a batch may wait to fill, and sizes that close it.
    max_queue_delay_us: int | None = Field(default=None, ge=0, le=10_000_000)
    preferred_batch_sizes: list[int] = Field(default_factory=list, max_length=16)
    rtol: float = Field(default=1e-4, ge=0)
    atol: float = Field(default=1e-5, ge=0)
    # Extra verification inputs: each a mapping of input name to nested lists.
    samples: list[dict[str, Any]] = Field(default_factory=list, max_length=16)


class OutputInfo(BaseModel):
    name: str
    dtype: str
    shape: list[int]


class VersionRecord(BaseModel):
    name: str
    version: int
    sha256: str
    config: ModelConfig
    outputs: list[OutputInfo]
    variant_ids: list[str]
    created_at: float = Field(default_factory=now)


class VariantRecord(BaseModel):
    id: str
    model: str
    version: int
    backend: str
    target: str
    status: VariantStatus
    error: str | None = None
    artifact_key: str | None = None
    job_id: str | None = None
    cache_hit: bool = False
    max_abs_error: float | None = None
    # Median latency at batch 1, and per measured batch size; the TorchScript baseline was
    # timed in the same process, so the two compare fairly.
    latency_ms: float | None = None
    latency_ms_by_batch: dict[int, float] = Field(default_factory=dict)
    baseline_latency_ms_by_batch: dict[int, float] = Field(default_factory=dict)
    updated_at: float = Field(default_factory=now)


class JobRecord(BaseModel):
    id: str
    variant_id: str
    model: str
    version: int
    backend: str
    target: str
    status: JobStatus = JobStatus.queued
    stage: VariantStatus = VariantStatus.queued
    attempts: int = 0
    error: str | None = None
    cache_hit: bool = False
    created_at: float = Field(default_factory=now)
    started_at: float | None = None
    finished_at: float | None = None


class ArtifactRecord(BaseModel):
    """What a finished compile measured; a cache hit copies it onto the new variant."""

    key: str
    backend: str
    target: str
    size: int
    compile_s: float
    max_abs_error: float
    latency_ms_by_batch: dict[int, float]
    baseline_latency_ms_by_batch: dict[int, float]
    created_at: float = Field(default_factory=now)
