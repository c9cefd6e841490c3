"""Metadata records kept in the store: models, versions, variants, jobs and artifacts."""

from __future__ import annotations

import json
import re
import time
import uuid
from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from compiler.backends import MAX_TUNING_TRIALS, REFERENCE, REGISTRY, option_problems
from compiler.runner import output_names
from compiler.spec import DType, InputSpec
from service.errors import InvalidConfigError

# The largest max_batch_size a model's config, or the server's default, may set.
MAX_BATCH_SIZE = 4096


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


SETTLED_JOBS = {JobStatus.succeeded, JobStatus.failed}


def now() -> float:
    return time.time()


def new_id() -> str:
    return uuid.uuid4().hex[:16]


# What follows the first `__` of a name, in Triton's PyTorch form <name>__<index>.
INDEX = re.compile(r"[0-9]{1,9}")


def name_index(name: str) -> int | None:
    """The index of the model's input or output that a name of Triton's PyTorch backend gives
    (OUTPUT__1: 1), if it has one."""
    _, sep, tail = name.partition("__")
    return int(tail) if sep and INDEX.fullmatch(tail) else None


def own_names(names: list[str]) -> list[str]:
    """Output names less the trailing ones that Kiln gives anyway (output<i> at i)."""
    end = len(names)
    while end and names[end - 1] == output_names(end)[-1]:
        end -= 1
    return names[:end]


TensorName = Annotated[str, Field(pattern=r"^[A-Za-z_][\w.]*$", max_length=64)]
# The most outputs that can be named: a Triton configuration's OUTPUT__<index> names up to it.
MAX_OUTPUT_NAMES = 256


class TensorConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt field is refused, not dropped

    name: TensorName
    dtype: DType
    shape: list[int] = Field(min_length=1, max_length=8)


# A hardware target (`cpu-x86_64-znver3-avx2`, `cuda-sm90`); it also names a queue.
Target = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=64)]
# Option values are plain JSON scalars: they are hashed into the artifact key.
Options = dict[str, str | int | float | bool]


# The option that makes a `tvm` variant a tuned one.
TUNING_TRIALS = "tuning_trials"


def variant_label(backend: str, options: Options) -> str:
    """`tensorrt[precision=fp16]`: two variants of one backend differ by their options."""
    text = ",".join(f"{k}={v}" for k, v in sorted(options.items()))
    return f"{backend}[{text}]" if text else backend


class BackendRequest(BaseModel):
    """A backend with options, e.g. {"name": "tensorrt", "options": {"precision": "fp16"}}."""

    model_config = ConfigDict(extra="forbid")

    name: str
    options: Options = Field(default_factory=dict, max_length=16)

    @field_validator("options")
    @classmethod
    def _whole_numbers_as_int(cls, options: Options) -> Options:
        # JSON's 64.0 and 64 name one variant and one artifact.
        return {k: int(v) if isinstance(v, float) and v.is_integer() else v for k, v in options.items()}


def options_key(options: Options) -> str:
    """Options as one string, equal for equal options whatever their order."""
    return json.dumps(options, sort_keys=True)


def as_requests(backends: list[str | BackendRequest] | None) -> list[BackendRequest]:
    return [BackendRequest(name=b) if isinstance(b, str) else b for b in backends or []]


def backends_problem(requests: list[BackendRequest], largest_batch: int) -> str | None:
    """What is wrong with backends to compile, as an upload's config.backends or
    KILN_DEFAULT_BACKENDS names them, for a model whose largest batch is `largest_batch`."""
    unknown = [r.name for r in requests if r.name not in REGISTRY or r.name == REFERENCE]
    if unknown:
        return f"unknown backend(s) {unknown}; use {sorted(set(REGISTRY) - {REFERENCE})}"
    if len({(r.name, options_key(r.options)) for r in requests}) < len(requests):
        return "an entry is repeated (same backend and options)"
    return "; ".join(p for r in requests for p in option_problems(r.name, r.options, largest_batch)) or None


def tuned_tvm(trials: int) -> BackendRequest:
    return BackendRequest(name="tvm", options={TUNING_TRIALS: trials})


QueueDelayUs = Annotated[int, Field(ge=0, le=10_000_000)]
PreferredSizes = Annotated[list[int], Field(max_length=16)]
QueueSize = Annotated[int, Field(ge=0, le=1_000_000)]
TimeoutUs = Annotated[int, Field(ge=1, le=3_600_000_000)]
PriorityLevels = Annotated[int, Field(ge=0, le=1000)]
PriorityLevel = Annotated[int, Field(ge=1, le=1000)]
Instances = Annotated[int, Field(ge=1, le=64)]
# An output's class labels, by class index (Triton's label file, one label a line); the
# version's labels together are bounded by service.classification.MAX_LABEL_BYTES.
Labels = Annotated[
    dict[
        Annotated[str, Field(max_length=64)],
        Annotated[list[Annotated[str, Field(max_length=256)]], Field(max_length=100_000)],
    ],
    Field(max_length=16),
]


# The prefix of a changed serving setting's field in a version's document.
SERVING_FIELD = "serving."
# The prefix of a variant added to a version after its upload (POST .../variants): the field
# `variant.<id>` holds when it was added.
ADDED_VARIANT = "variant."


class ServingConfig(BaseModel):
    """The settings of a version that change how it is served, not what was compiled: set at
    upload, and changed later without a recompile (PATCH /v1/models/{name}/versions/{v}/serving)."""

    # Dynamic batching, as in Triton. False: each request runs alone as it comes, with its own
    # rows (up to max_batch_size), never merged with another's: for a model whose first
    # dimension varies but is not a batch (Triton's max_batch_size 0 with dims [-1, ...]).
    dynamic_batching: bool = True
    # How long a batch may wait to fill, and sizes that close it.
    max_queue_delay_us: QueueDelayUs | None = None
    preferred_batch_sizes: PreferredSizes = Field(default_factory=list)
    # Requests of one version that may wait or run at once in one server process; past it, a
    # 503 with Retry-After. None: the server default; 0: no limit.
    max_queue_size: QueueSize | None = None
    # How long a request may wait before it is answered with a 503 instead of run, in
    # microseconds; a request's own, shorter `timeout` parameter counts instead (Triton's queue
    # policy). None: no limit.
    default_timeout_us: TimeoutUs | None = None
    # Triton's response cache: a request whose inputs this version answered before is answered
    # from memory (KILN_RESPONSE_CACHE_MB per process) without running. For deterministic models.
    response_cache: bool = False
    # A batch stops waiting for more requests once it holds as many as were recently waiting or
    # running at once (service.batcher): from a few clients no more are coming, and the delay
    # would only be added to each request. False: wait out the delay, as Triton does.
    adaptive_queue_delay: bool = True
    # Triton's priority levels: a batching model's requests queue by their `priority` parameter,
    # 1 the highest, those without one (or out of range) at default_priority_level, the lowest
    # when None. 0: one queue, in arrival order.
    priority_levels: PriorityLevels = 0
    default_priority_level: PriorityLevel | None = None
    # Triton's instance_group count: batches of a batching model that may run at once, each on a
    # lane of its own (at most KILN_INFERENCE_WORKERS). Models that cannot batch run their
    # requests side by side on KILN_INFERENCE_WORKERS threads whatever it says.
    instances: Instances = 1
    # Output name -> its labels, which the classification extension adds to each class it
    # returns ("<value>:<index>:<label>").
    labels: Labels = Field(default_factory=dict)


class ModelConfig(ServingConfig):
    """The `config` field of an upload. Only `name` and `inputs` are required."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=64)
    inputs: list[TensorConfig] = Field(min_length=1)
    # The names the model's outputs are served under, in the order it returns them (Triton's
    # OUTPUT__0, say); outputs past the list keep theirs. None: output0, output1, ...
    output_names: list[TensorName] | None = Field(default=None, min_length=1, max_length=MAX_OUTPUT_NAMES)
    max_batch_size: int | None = Field(default=None, ge=1, le=MAX_BATCH_SIZE)
    # Each a backend name, or a BackendRequest; one variant per entry and target.
    backends: list[str | BackendRequest] | None = None
    # Targets to compile for: "auto" is every target a live worker announced plus this API
    # host's own; other strings are taken as is. None: this API host's targets.
    targets: list[Target] | None = Field(default=None, min_length=1, max_length=16)
    # MetaSchedule trials for an extra, tuned `tvm` variant per target, compiled after the
    # others (0: none). Each compiled batch size is tuned; kernels tuned before cost no trials.
    tuning_trials: int = Field(default=0, ge=0, le=MAX_TUNING_TRIALS)
    rtol: float = Field(default=1e-4, ge=0)
    atol: float = Field(default=1e-5, ge=0)
    # Verification tolerance for variants whose options ask for precision "fp16", and "bf16":
    # three fewer mantissa bits, so looser (a ResNet-18 in bf16 is about 0.02 off).
    fp16_rtol: float = Field(default=1e-2, ge=0)
    fp16_atol: float = Field(default=1e-2, ge=0)
    bf16_rtol: float = Field(default=5e-2, ge=0)
    bf16_atol: float = Field(default=5e-2, ge=0)
    # Extra verification inputs: each a mapping of input name to nested lists.
    samples: list[dict[str, Any]] = Field(default_factory=list, max_length=16)

    @field_validator("output_names")
    @classmethod
    def _output_names(cls, names: list[str] | None) -> list[str] | None:
        if names is None:
            return None
        if len(set(names)) != len(names):
            raise ValueError(f"output names must be unique; got {names}")
        for i, name in enumerate(names):
            index = name_index(name)
            if index is not None and index != i:  # its configuration would be read otherwise
                raise ValueError(
                    f"{name!r} names output {index} in Triton's <name>__<index> form, but is output {i}"
                )
        return own_names(names) or None  # Kiln's own names: the same upload as without them

    def serving(self) -> ServingConfig:
        return ServingConfig.model_validate(self.model_dump(include=set(ServingConfig.model_fields)))

    def spec(self) -> InputSpec:
        return InputSpec.from_dicts([t.model_dump() for t in self.inputs], self.max_batch_size or 1)

    def named(self, outputs: list[OutputInfo]) -> list[OutputInfo]:
        """The model's outputs (output0, output1, ...) under the names they are served by."""
        names = self.output_names or []
        if len(names) > len(outputs):
            raise InvalidConfigError(
                f"output_names: {names} name {len(names)} outputs; the model returns {len(outputs)}"
            )
        served = [o.model_copy(update={"name": n}) for o, n in zip(outputs, names, strict=False)]
        served += outputs[len(names) :]
        taken = [o.name for o in served]
        if len(set(taken)) != len(taken):
            raise InvalidConfigError(
                f"output_names: the outputs would be named {taken}; give each a name of its own"
            )
        return served

    def backend_requests(self) -> list[BackendRequest]:
        requests = as_requests(self.backends)
        tuned = tuned_tvm(self.tuning_trials)
        # Whatever backends lists, as POST .../variants does: tuning_trials asks for it.
        if self.tuning_trials and tuned not in requests:
            requests.append(tuned)  # last, so it queues behind the quick variants
        return requests

    def tolerance(self, options: Options) -> tuple[float, float]:
        """(rtol, atol) for a variant with these options."""
        precision = options.get("precision")
        if precision == "fp16":
            return self.fp16_rtol, self.fp16_atol
        if precision == "bf16":
            return self.bf16_rtol, self.bf16_atol
        return self.rtol, self.atol


def default_tolerance(options: Options) -> tuple[float, float]:
    """(rtol, atol) for a variant with these options, when the upload config sets none."""
    return ModelConfig.model_construct().tolerance(options)


class OutputInfo(BaseModel):
    name: str
    dtype: str
    shape: list[int]
    # Optional in the schema, so that a client of this API reads a server from before it; a
    # record without it is read as those servers' -1 first meant (_recorded_before_batched).
    batched: bool = Field(
        default=True,
        description="Its first dimension is the batch's, along which a batch's outputs are split "
        "back into their requests'. False where that -1 follows an input's other dynamic "
        "dimension instead (`x.t()` of a `[-1, -1]` input, say).",
    )
    rows_apart: bool = Field(
        default=True,
        description="Each row depends on the request's own rows alone (checked at upload: the "
        "largest batch's first row stays the same whatever rows follow it). False: requests are "
        "never merged into one batch, which would give clients each other's data.",
    )

    @model_validator(mode="before")
    @classmethod
    def _recorded_before_batched(cls, doc: Any) -> Any:
        # An output recorded before `batched` led with -1 only where that was the batch.
        if isinstance(doc, dict) and "batched" not in doc:
            return {**doc, "batched": list(doc.get("shape", []))[:1] == [-1]}
        return doc


class VersionRecord(BaseModel):
    name: str
    version: int
    sha256: str
    config: ModelConfig
    outputs: list[OutputInfo]
    variant_ids: list[str]
    created_at: float = Field(default_factory=now)

    @model_validator(mode="before")
    @classmethod
    def _changed_after_upload(cls, doc: Any) -> Any:
        """Serving settings changed and variants added after the upload are top-level fields of
        the document, one per setting (SERVING_FIELD) and per variant (ADDED_VARIANT), so that
        changes sent at once from any replicas never overwrite each other (Store.update_doc)."""
        prefixes = (SERVING_FIELD, ADDED_VARIANT)
        if not isinstance(doc, dict) or not any(str(k).startswith(prefixes) for k in doc):
            return doc
        doc = dict(doc)
        config = dict(doc["config"])
        for key in [k for k in doc if k.startswith(SERVING_FIELD)]:
            config[key.removeprefix(SERVING_FIELD)] = doc.pop(key)
        added = {k.removeprefix(ADDED_VARIANT): doc.pop(k) for k in list(doc) if k.startswith(ADDED_VARIANT)}
        variant_ids = [*doc["variant_ids"], *sorted(added, key=lambda vid: (added[vid], vid))]
        return {**doc, "config": config, "variant_ids": variant_ids}

    def spec(self) -> InputSpec:
        return self.config.spec()


class VariantRecord(BaseModel):
    id: str
    model: str
    version: int
    backend: str
    target: str
    options: Options = Field(default_factory=dict)
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
    # When those were last measured in a race beside the version's other ready variants for
    # this target (service.races); None: only when it compiled.
    raced_at: float | None = None
    updated_at: float = Field(default_factory=now)


class JobRecord(BaseModel):
    id: str
    variant_id: str
    model: str
    version: int
    backend: str
    target: str
    options: Options = Field(default_factory=dict)
    status: JobStatus = JobStatus.queued
    stage: VariantStatus = VariantStatus.queued
    attempts: int = 0
    error: str | None = None
    cache_hit: bool = False
    # The worker (hostname-pid) that last started it.
    worker: str | None = None
    # Tuned variants: trials_done / trials_total and best_estimate_ms while tuning; when done,
    # also `tasks`, one per kernel, each with its new_trials, the earlier_trials of its cached
    # records, whether those were `reused` as they were, and how many of its fastest schedules were
    # left out as `wrong_schedules`.
    tuning: dict[str, Any] | None = None
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


class WorkerRecord(BaseModel):
    """What a `kiln worker` announces every few seconds: the targets whose queues it consumes."""

    id: str
    targets: list[str]
    # target -> backend -> None when available there, else why not
    backends: dict[str, dict[str, str | None]]
    last_seen: float = Field(default_factory=now)


class Deletion(BaseModel):
    """A deletion of versions, recorded before any of its steps, until all of them are done."""

    id: str
    name: str
    versions: list[int]
    # The blobs that the versions referenced: collected unless something else does.
    model_blobs: list[str]
    artifacts: list[str]
    at: float = Field(default_factory=now)
