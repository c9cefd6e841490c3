"""Model management: upload, list, describe, delete."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Annotated, Any, BinaryIO

from fastapi import APIRouter, Depends, File, Form, Response, UploadFile
from pydantic import ConfigDict, ValidationError, field_validator

from compiler.backends import family_reason, get_backend, options_reason, reference_target
from compiler.errors import CompilerError, InvalidModelError
from compiler.inspect import inspect_model
from compiler.spec import VARIED_FILL, InputSpec
from service.api.auth import admin_scope, infer_scope
from service.api.deps import Services, services
from service.api.problems import validation_detail
from service.api.schemas import (
    ActiveOut,
    DefaultVersionIn,
    ModelList,
    ModelOut,
    Problem,
    ServingIn,
    UploadOut,
    VariantOut,
    VersionOut,
    error_responses,
    inline_schema,
)
from service.classification import check_labels
from service.deletions import forget_deleted
from service.errors import InvalidConfigError, NotFoundError
from service.records import (
    BackendRequest,
    JobRecord,
    ModelConfig,
    OutputInfo,
    ServingConfig,
    TensorConfig,
    VariantRecord,
    VariantStatus,
    VersionRecord,
    backends_problem,
    name_index,
    new_id,
)
from service.registry import MODEL_BLOB, MODEL_BLOB_PENDING_S, ModelView, NewVersion, job_for
from service.router import ANY_TARGET, REFERENCE, serving_version
from service.sandbox import SandboxError, run_in_child
from service.scratch import scratch_file
from service.store import StoreError

log = logging.getLogger("kiln.api")
router = APIRouter(tags=["models"])
CHUNK = 1024 * 1024
AUTO = "auto"
# A worker counts as live while its last announcement is under this many heartbeats old.
LIVE_BEATS = 3

EXAMPLE_CONFIG = json.dumps(
    {
        "name": "mlp",
        "inputs": [{"name": "x", "dtype": "float32", "shape": [-1, 784]}],
        "max_batch_size": 32,
        "backends": ["tvm"],
    }
)


def check_preferred(sizes: list[int], max_batch_size: int, where: str) -> None:
    too_big = [b for b in sizes if not 1 <= b <= max_batch_size]
    if too_big:
        raise InvalidConfigError(
            f"{where}preferred_batch_sizes: {too_big} must lie in 1..max_batch_size ({max_batch_size})"
        )


def check_priorities(config: ServingConfig, where: str) -> None:
    default, levels = config.default_priority_level, config.priority_levels
    if levels and default is not None and not 1 <= default <= levels:  # as Triton checks it
        raise InvalidConfigError(
            f"{where}default_priority_level: {default} must lie in 1..priority_levels ({levels})"
        )


def check_backends(requests: list[BackendRequest], where: str, largest_batch: int) -> None:
    problem = backends_problem(requests, largest_batch)
    if problem:
        raise InvalidConfigError(f"{where}: {problem}")


def check_targets(svc: Services, targets: list[str] | None, where: str) -> None:
    if svc.settings.embedded and targets is not None:
        foreign = sorted(set(targets) - {AUTO, *svc.runtime.targets})
        if foreign:
            raise InvalidConfigError(
                f"{where}: {foreign} are not this host's; embedded mode compiles only for "
                f'{sorted(svc.runtime.targets)} (use "auto", or run workers with KILN_REDIS_URL)'
            )


class UploadConfig(ModelConfig):
    """An upload's config as sent: a field Kiln does not know is refused, so that a misspelt one
    (`max_queue_delay_ms`) is not silently left at its default. Stored versions are read as
    ModelConfig, which ignores fields that a later Kiln no longer has."""

    model_config = ConfigDict(extra="forbid")

    @field_validator("inputs")
    @classmethod
    def _inputs_by_index(cls, inputs: list[TensorConfig]) -> list[TensorConfig]:
        indices = [name_index(t.name) for t in inputs]
        # As Triton's load reads them; a stored version's are read as they were uploaded.
        if None not in indices and indices != list(range(len(inputs))):
            raise ValueError(
                f"inputs named in Triton's <name>__<index> form must be listed by index from 0; got {indices}"
            )
        return inputs


CONFIG_DOC = (
    "The model config, as JSON (its schema is the contentSchema): name and inputs; optionally "
    "max_batch_size, backends, targets, tolerances, samples, labels and the serving settings."
)
# OpenAPI 3.1's way to type a string's JSON content: the field stays a string to the SDKs.
CONFIG_SCHEMA = {"contentMediaType": "application/json", "contentSchema": inline_schema(UploadConfig)}


def parse_config(text: str, svc: Services) -> ModelConfig:
    try:
        config = ModelConfig.model_validate(UploadConfig.model_validate_json(text).model_dump())
    except ValidationError as exc:
        raise InvalidConfigError(f"config: {validation_detail(exc)}") from None
    if config.max_batch_size is None:
        config.max_batch_size = svc.settings.default_max_batch_size
    if config.backends is None:
        config.backends = list(svc.settings.default_backends)
    check_preferred(config.preferred_batch_sizes, config.max_batch_size, "config.")
    check_priorities(config, "config.")
    check_targets(svc, config.targets, "config.targets")
    try:
        spec = config.spec()
    except CompilerError as exc:
        raise InvalidConfigError(f"config.inputs: {exc}") from None
    for i, sample in enumerate(config.samples):
        try:
            spec.coerce(sample)
        except CompilerError as exc:
            raise InvalidConfigError(f"config.samples[{i}]: {exc}") from None
    check_backends(config.backend_requests(), "config.backends", spec.largest_batch)
    check_input_bytes(spec, svc.settings.compile_memory_mb)
    return config


def check_input_bytes(spec: InputSpec, memory_mb: int) -> None:
    """Inputs that alone pass the memory the upload's check of the model (and each compile)
    may use can never be checked: refused before the check, which would only run out."""
    runs = {
        f"at batch {spec.largest_batch}": spec.nbytes(spec.largest_batch),
        f"at batch 1 with their other dynamic dims at {VARIED_FILL}": spec.nbytes(1, VARIED_FILL),
    }
    where, need = max(runs.items(), key=lambda run: run[1])
    if need > memory_mb << 20:
        raise InvalidConfigError(
            f"config.inputs: {where} they take {need / 2**20:.0f} MB, more than the {memory_mb} MB "
            "(KILN_COMPILE_MEMORY_MB) that checking the model may use; give smaller dims, or a "
            "smaller max_batch_size"
        )


def spool(upload: BinaryIO, into: IO[bytes]) -> str:
    """Copy the upload to a file of our own, returning its sha256."""
    digest = hashlib.sha256()
    while chunk := upload.read(CHUNK):
        digest.update(chunk)
        into.write(chunk)
    into.flush()
    return digest.hexdigest()


def read_chunks(path: Path) -> Iterator[bytes]:
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            yield chunk


def plan_targets(svc: Services, wanted: list[str] | None) -> list[str]:
    """The targets to compile for; "auto" adds every target a live worker announced, and None
    means this host's."""
    host = svc.runtime.targets
    if wanted is None:
        return sorted(host)
    targets = {t for t in wanted if t != AUTO}
    if AUTO in wanted:
        targets |= host
        if not svc.settings.embedded:
            targets |= live_targets(svc)
    return sorted(targets)


def live_targets(svc: Services) -> set[str]:
    return svc.registry.live_targets(LIVE_BEATS * svc.settings.worker_heartbeat_s)


def unserved_targets(svc: Services, variants: Iterable[VariantRecord]) -> list[str]:
    """Targets of queued variants that no live worker announced: their jobs wait in their
    target's queue until a `kiln worker` there starts. Embedded mode compiles here whatever
    it plans."""
    waiting = {v.target for v in variants if v.status == VariantStatus.queued}
    if svc.settings.embedded or not waiting:
        return []
    return sorted(waiting - live_targets(svc))


def unavailable(svc: Services, request: BackendRequest, target: str) -> str | None:
    """Embedded mode compiles here, so this host's answer is the answer. Otherwise a worker
    decides what its libraries and devices allow; only a target family no host can build
    for, or options no host can build it with, are known up front."""
    if svc.settings.embedded:
        reason = get_backend(request.name).unavailable_reason(target)
    else:
        reason = family_reason(request.name, target)
    return reason or options_reason(request.name, request.options, target)


def planned(requests: list[BackendRequest], targets: list[str]) -> list[tuple[BackendRequest, str]]:
    """Each requested backend on each target, after TorchScript on each GPU target: the upload on
    that GPU, which its variants are timed against and which serves there until one beats it."""
    on_gpus = [(BackendRequest(name=REFERENCE), t) for t in targets if reference_target(t) != ANY_TARGET]
    return on_gpus + [(request, target) for request in requests for target in targets]


def plan_variants(
    svc: Services, config: ModelConfig, name: str, number: int
) -> tuple[list[VariantRecord], list[JobRecord]]:
    """TorchScript serves at once (on the CPU); each requested backend gets a variant per planned
    target, and TorchScript one per GPU target."""
    variants = [
        VariantRecord(
            id=new_id(),
            model=name,
            version=number,
            backend=REFERENCE,
            target=ANY_TARGET,
            status=VariantStatus.ready,
        )
    ]
    jobs = []
    for request, target in planned(config.backend_requests(), plan_targets(svc, config.targets)):
        variant = VariantRecord(
            id=new_id(),
            model=name,
            version=number,
            backend=request.name,
            target=target,
            options=request.options,
            status=VariantStatus.queued,
        )
        reason = unavailable(svc, request, target)
        if reason is not None:
            variant.status, variant.error = VariantStatus.failed, reason
        else:
            job = job_for(variant, new_id())
            variant.job_id = job.id
            jobs.append(job)
        variants.append(variant)
    return variants, jobs


@router.post(
    "/v1/models",
    operation_id="upload_model",
    summary="Upload a TorchScript model; it serves at once and compiles in the background.",
    status_code=202,
    response_model=UploadOut,
    responses={
        200: {"model": UploadOut, "description": "Identical bytes and config: nothing new."},
        **error_responses(Problem, 400, 401, 403, 413, 422, 503),
    },
    dependencies=admin_scope,
)
def upload_model(
    file: Annotated[UploadFile, File(description="A TorchScript archive (torch.jit.save).")],
    config: Annotated[
        str, Form(description=CONFIG_DOC, examples=[EXAMPLE_CONFIG], json_schema_extra=CONFIG_SCHEMA)
    ],
    svc: Annotated[Services, Depends(services)],
    response: Response,
) -> UploadOut:
    cfg = parse_config(config, svc)
    created, sha256 = store_version(svc, cfg, file.file)
    if created.deduplicated:
        response.status_code = 200
    return UploadOut(
        name=created.version.name,
        version=created.version.version,
        sha256=sha256,
        deduplicated=created.deduplicated,
        variants=[VariantOut.of(v) for v in created.variants],
        unserved_targets=unserved_targets(svc, created.variants),
    )


def store_version(
    svc: Services,
    cfg: ModelConfig,
    source: BinaryIO,
    vet: Callable[[list[OutputInfo]], None] = lambda outputs: None,
) -> tuple[NewVersion, str]:
    """Check the TorchScript in `source` against `cfg` by running it (unless a version holds the
    same bytes and compiled settings: its outputs are known), keep its bytes, and record
    the version with its compile jobs queued, or find the identical one; and its sha256.
    `vet` checks the outputs the model turned out to have, before anything is recorded."""
    store = svc.registry.store
    store.ping()  # a 503 before copying, hashing and checking what may be a large file
    with scratch_file() as tmp:
        sha256 = spool(source, tmp)
        # The same file and compiled settings again (a repository deployed at each start, say)
        # were checked when they were first uploaded.
        asked, known = cfg, svc.registry.uploaded(cfg, sha256)
        if known is not None:  # its inputs perhaps put in forward()'s order
            cfg, output_infos = cfg.model_copy(update={"inputs": known.config.inputs}), known.outputs
        else:
            cfg, found = inspect(svc, tmp.name, cfg)
            output_infos = cfg.named(found)
        vet(output_infos)
        check_labels(cfg.labels, output_infos, cfg.inputs, "config.labels")
        key = MODEL_BLOB.format(sha256=sha256)
        # Pending until the version's record keeps them: see MODEL_BLOB_PENDING_S.
        ours = not store.has_blob(key)
        if ours:
            store.put_blob(key, read_chunks(Path(tmp.name)), expire_s=MODEL_BLOB_PENDING_S)
        try:
            created = svc.registry.create_version(
                cfg,
                sha256,
                output_infos,
                lambda name, number: plan_variants(svc, cfg, name, number),
            )
        except Exception:
            if ours:  # not left to expire: refused at maxmemory, they would refuse what fits
                store.discard_blob(key)
            raise
        svc.registry.keep_model_blob(sha256, lambda: read_chunks(Path(tmp.name)))
    if cfg.inputs != asked.inputs:  # in forward()'s order: the same config is found again as sent
        svc.registry.record_upload(asked, sha256, created.version.version)
    for job in created.jobs:
        svc.queue.enqueue(job)
    if created.deduplicated:  # it may have taken the upload's serving settings
        svc.runtime.reconfigure(created.version.name, created.version)
    return created, sha256


def inspect(svc: Services, path: str, cfg: ModelConfig) -> tuple[ModelConfig, list[OutputInfo]]:
    """The config with its inputs in the order the model takes them (by forward()'s argument
    names, where they are all named so), and the model's outputs: found by running it in a
    sandboxed child process."""
    try:
        with svc.checks:
            found = run_in_child(
                inspect_model,
                (path, cfg.spec().to_dict(), cfg.samples),
                timeout_s=svc.settings.validate_timeout_s,
                memory_mb=svc.settings.compile_memory_mb,
            )
    except SandboxError as exc:
        raise InvalidModelError(f"the model could not be validated: {exc}") from None
    by_name = {t.name: t for t in cfg.inputs}
    ordered = cfg.model_copy(update={"inputs": [by_name[n] for n in found["inputs"]]})
    return ordered, [OutputInfo.model_validate(o) for o in found["outputs"]]


def active_of(view: ModelView, svc: Services) -> ActiveOut | None:
    if view.unloaded:
        return None
    try:
        version, variants = serving_version(view, svc.runtime.targets)
        chosen = svc.runtime.choose(variants, batch=1)
    except NotFoundError:
        return None  # nothing ready on this host yet
    return ActiveOut(
        version=version.version, variant_id=chosen.id, backend=chosen.backend, target=chosen.target
    )


def model_out(view: ModelView, svc: Services) -> ModelOut:
    active = active_of(view, svc)
    return ModelOut(
        name=view.name,
        versions=[VersionOut.of(v, variants) for v, variants in view.versions],
        active=active,
        ready=active is not None,
        unloaded=view.unloaded,
        default_version=view.default_version,
    )


@router.get(
    "/v1/models",
    operation_id="list_models",
    summary="Every model, its versions and variants.",
    dependencies=infer_scope,
    responses=error_responses(Problem, 401, 403, 503),
)
def list_models(svc: Annotated[Services, Depends(services)]) -> ModelList:
    return ModelList(models=[model_out(view, svc) for view in svc.registry.list_models()])


@router.get(
    "/v1/models/{name}",
    operation_id="get_model",
    summary="One model: versions, variants with status and latency, and what serves now.",
    dependencies=infer_scope,
    responses=error_responses(Problem, 401, 403, 404, 422, 503),
)
def get_model(name: str, svc: Annotated[Services, Depends(services)]) -> ModelOut:
    return model_out(svc.registry.get_model(name), svc)


@router.put(
    "/v1/models/{name}/default-version",
    operation_id="set_default_version",
    summary="Choose the version that serves requests naming none (a rollback that keeps the "
    "newer versions), or null for the newest ready one; every replica follows within KILN_ROUTE_TTL_S.",
    dependencies=admin_scope,
    responses=error_responses(Problem, 401, 403, 404, 422, 503),
)
def set_default_version(
    name: str, body: DefaultVersionIn, svc: Annotated[Services, Depends(services)]
) -> ModelOut:
    svc.registry.set_default_version(name, body.version)
    svc.runtime.reroute(name)
    return model_out(svc.registry.get_model(name), svc)


@router.get(
    "/v1/models/{name}/versions/{version}",
    operation_id="get_model_version",
    summary="One version of a model.",
    dependencies=infer_scope,
    responses=error_responses(Problem, 401, 403, 404, 422, 503),
)
def get_model_version(name: str, version: int, svc: Annotated[Services, Depends(services)]) -> VersionOut:
    record = svc.registry.get_version(name, version)
    return VersionOut.of(record, svc.registry.variants_of(record))


@router.patch(
    "/v1/models/{name}/versions/{version}/serving",
    operation_id="update_serving",
    summary="Change a version's batching, queue, timeout, response-cache or label settings without a "
    "recompile; every replica follows within KILN_ROUTE_TTL_S.",
    dependencies=admin_scope,
    responses=error_responses(Problem, 401, 403, 404, 422, 503),
)
def update_serving(
    name: str, version: int, body: ServingIn, svc: Annotated[Services, Depends(services)]
) -> VersionOut:
    unknown = sorted(body.model_extra or {})
    if unknown:
        fixed = [f for f in unknown if f in ModelConfig.model_fields]
        raise InvalidConfigError(
            f"{', '.join(fixed)}: fixed at upload, where the variants were compiled and verified "
            "with it; upload a new version to change it"
            if fixed
            else f"unknown setting(s) {unknown}; the serving settings are {list(ServingIn.model_fields)}"
        )
    record = apply_serving(svc, svc.registry.get_version(name, version), body.changes())
    return VersionOut.of(record, svc.registry.variants_of(record))


def apply_serving(svc: Services, current: VersionRecord, changes: dict[str, Any]) -> VersionRecord:
    """Check the serving settings to change against the version, record them and apply them here."""
    check_preferred(changes.get("preferred_batch_sizes", []), current.config.max_batch_size or 1, "")
    check_priorities(current.config.serving().model_copy(update=changes), "")
    check_labels(changes.get("labels", {}), current.outputs, current.config.inputs, "labels")
    record = svc.registry.update_serving(current.name, current.version, changes)
    svc.runtime.reconfigure(current.name, record)
    return record


def forget(svc: Services, name: str) -> None:
    """Drop the deleted versions' statistics and series here at once; others' sweeps do there."""
    try:
        forget_deleted(svc.runtime, name)
    except StoreError as exc:  # what was asked is done: the next sweep does this
        log.warning("statistics of %s's deleted versions kept until the next sweep: %s", name, exc)


@router.delete(
    "/v1/models/{name}",
    operation_id="delete_model",
    summary="Delete a model's metadata and every artifact nothing else references.",
    dependencies=admin_scope,
    responses=error_responses(Problem, 401, 403, 404, 422, 503),
)
def delete_model(name: str, svc: Annotated[Services, Depends(services)]) -> ModelOut:
    view = svc.registry.delete_model(name)
    svc.runtime.unload(name)
    forget(svc, name)
    return ModelOut(
        name=name, versions=[VersionOut.of(v, vs) for v, vs in view.versions], active=None, ready=False
    )


@router.delete(
    "/v1/models/{name}/versions/{version}",
    operation_id="delete_model_version",
    summary="Delete one version, and its artifacts nothing else references: the newest other "
    "ready version serves (a rollback). The default version goes only with the model's last (409).",
    dependencies=admin_scope,
    responses=error_responses(Problem, 401, 403, 404, 409, 422, 503),
)
def delete_model_version(name: str, version: int, svc: Annotated[Services, Depends(services)]) -> VersionOut:
    [(record, variants)] = svc.registry.delete_version(name, version).versions
    svc.runtime.unload(name, version)
    forget(svc, name)
    return VersionOut.of(record, variants)
