"""Response bodies of the native /v1 API."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import models_json_schema

from compiler.backends import MAX_TUNING_TRIALS
from service.records import (
    BackendRequest,
    Instances,
    JobStatus,
    Labels,
    ModelConfig,
    Options,
    OutputInfo,
    PreferredSizes,
    PriorityLevel,
    PriorityLevels,
    QueueDelayUs,
    QueueSize,
    ServingConfig,
    Target,
    TensorConfig,
    TimeoutUs,
    VariantRecord,
    VariantStatus,
    VersionRecord,
    as_requests,
    tuned_tvm,
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
    raced_at: float | None = Field(
        description="When these latencies were measured in a race, side by side with the version's "
        "other ready variants for this target; null: only when it compiled.",
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
    serving: ServingConfig
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
            serving=version.config.serving(),
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
    ready: bool = Field(
        description="Whether requests naming no version are served on this replica now (active is "
        "set): KServe V1's model readiness."
    )
    unloaded: bool = Field(
        default=False,
        description="Unloaded through /v2/repository: it serves nothing until it is loaded again.",
    )
    default_version: int | None = Field(
        default=None,
        description="The version that serves requests naming none; null: the newest ready one.",
    )


class ServingIn(BaseModel):
    """The serving settings to change. Those left out keep their value; null restores what an
    upload that leaves a setting out gets (the server's default, no limit, [], false for
    response_cache, true for dynamic_batching and adaptive_queue_delay, 0 for priority_levels, 1
    for instances, {} for labels)."""

    model_config = ConfigDict(extra="allow")  # refused by the route, with a message that says why

    dynamic_batching: bool | None = None
    max_queue_delay_us: QueueDelayUs | None = None
    preferred_batch_sizes: PreferredSizes | None = None
    max_queue_size: QueueSize | None = None
    default_timeout_us: TimeoutUs | None = None
    response_cache: bool | None = None
    adaptive_queue_delay: bool | None = None
    priority_levels: PriorityLevels | None = None
    default_priority_level: PriorityLevel | None = None
    instances: Instances | None = None
    labels: Labels | None = None

    def changes(self) -> dict[str, Any]:
        """The settings given, null ones at their default."""
        defaults = ServingConfig().model_dump()
        given = self.model_fields_set & set(ServingConfig.model_fields)
        return {k: defaults[k] if getattr(self, k) is None else getattr(self, k) for k in given}


class DefaultVersionIn(BaseModel):
    version: int | None = Field(
        ge=1,
        description="The version to serve to requests that name none, on every replica; null: "
        "the newest ready one again.",
    )


class ModelList(BaseModel):
    models: list[ModelOut]


UNSERVED = Field(
    description="Targets of queued variants that no live `kiln worker` has announced (Redis mode): "
    "their jobs wait in the target's queue until a worker there starts.",
)


class UploadOut(BaseModel):
    name: str
    version: int
    sha256: str
    deduplicated: bool = Field(
        description="True when these bytes and config were already uploaded: nothing new is compiled."
    )
    variants: list[VariantOut]
    unserved_targets: list[str] = UNSERVED


class CompileIn(BaseModel):
    """What to compile of an existing version. An empty body compiles what its upload asked
    for on the targets that exist now."""

    model_config = ConfigDict(extra="forbid")

    backends: list[str | BackendRequest] | None = Field(
        default=None,
        description="Backends to compile, each a name or {name, options}; null: the version's own, "
        "from its upload (its tuned tvm variant included).",
        examples=[["onnxruntime", {"name": "tensorrt", "options": {"precision": "fp16"}}]],
    )
    targets: list[Target] | None = Field(
        default=None,
        min_length=1,
        max_length=16,
        description='Targets to compile for; "auto": every target a live worker announces now, and '
        "this host's; null: the version's own, with \"auto\" read again now.",
    )
    tuning_trials: int = Field(
        default=0,
        ge=0,
        le=MAX_TUNING_TRIALS,
        description="Also compile a tvm variant tuned with this many MetaSchedule trials (0: none).",
    )
    retry_failed: bool = Field(
        default=False,
        description="Also compile again, under new jobs, the variants asked for that failed or were "
        "rejected; false: they are skipped, as most failures recur.",
    )

    def requests(self, config: ModelConfig) -> list[BackendRequest]:
        requests = config.backend_requests() if self.backends is None else as_requests(self.backends)
        tuned = tuned_tvm(self.tuning_trials)
        if self.tuning_trials and tuned not in requests:
            requests.append(tuned)
        return requests


class SkippedOut(BaseModel):
    backend: str
    options: Options
    target: str
    reason: str = Field(
        description='Why nothing was queued for it: "already ready", or why it cannot be built.'
    )


class CompileOut(BaseModel):
    name: str
    version: int
    queued: list[VariantOut] = Field(
        description="Variants queued to compile, new or retried, with their jobs."
    )
    skipped: list[SkippedOut]
    unserved_targets: list[str] = UNSERVED


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
        "summed best time), and when done `tasks`, each kernel's new_trials, the earlier_trials of "
        "its cached records, whether those were `reused` as they were, and how many of its fastest "
        "schedules were left out as `wrong_schedules` (they computed something else than the "
        "untuned kernel).",
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


class Problem(BaseModel):
    """Every /v1 error, as RFC 9457 problem details (application/problem+json)."""

    type: str = "about:blank"
    title: str
    status: int
    detail: str = Field(description="What went wrong, and what to fix.")


class ProtocolError(BaseModel):
    """Every error of the inference protocols (/v2, and KServe V1's :predict), as they have it."""

    error: str


ERROR_DESCRIPTIONS = {
    400: "Bad input (a file that is not TorchScript, inputs of the wrong name, shape or dtype).",
    401: "No or unknown API key, when KILN_API_KEYS is set.",
    403: "The API key lacks the scope this needs.",
    404: "No such model, version or job.",
    409: "The model is unloaded (POST /v2/repository/models/{name}/load serves it again).",
    413: "The request body (an upload, or an inference request) is larger than KILN_MAX_UPLOAD_MB.",
    422: "An invalid config or request field, named in the message.",
    503: "The store (Redis) is unavailable, or the model's queue is full (max_queue_size): retry "
    "after the Retry-After header's seconds.",
}


def error_responses(model: type[BaseModel], *statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for the errors a route may answer, so that SDKs type them. `default`
    covers the rest (a 500) and keeps FastAPI from listing its own 422 body, which Kiln never
    sends: its validation errors have this same shape."""
    documented: dict[int | str, dict[str, Any]] = {
        status: {"model": model, "description": ERROR_DESCRIPTIONS[status]} for status in statuses
    }
    documented["default"] = {"model": model, "description": "An unexpected error; the server log has more."}
    return documented


COMPONENTS = "#/components/schemas/"
# Models that a route's `openapi_extra` references, which cannot add components itself: the app's
# openapi() adds them (shared_components), so a generated SDK makes one class of each.
SHARED: dict[str, type[BaseModel]] = {}


def shared_schema(model: type[BaseModel]) -> dict[str, str]:
    """A reference to `model`, added to the document's components."""
    SHARED[model.__name__] = model
    return {"$ref": COMPONENTS + model.__name__}


def shared_components() -> dict[str, Any]:
    """The schemas of the SHARED models and of the models they nest."""
    _, schema = models_json_schema(
        [(model, "validation") for model in SHARED.values()], ref_template=COMPONENTS + "{model}"
    )
    defs: dict[str, Any] = schema.get("$defs", {})
    return defs


def inline_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON schema with its nested models written in place, for `openapi_extra`,
    which cannot add components: a `#/$defs/...` reference would not resolve in the document."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def resolved(node: Any) -> Any:
        if isinstance(node, list):
            return [resolved(item) for item in node]
        if not isinstance(node, dict):
            return node
        if "$ref" in node:
            return resolved(defs[node["$ref"].removeprefix("#/$defs/")])
        return {key: resolved(value) for key, value in node.items()}

    return resolved(schema)
