"""The registry: models -> versions -> variants, and compile jobs, on top of a Store."""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from service.errors import ConflictError, NotFoundError
from service.records import (
    ADDED_VARIANT,
    SERVING_FIELD,
    ArtifactRecord,
    Deletion,
    JobRecord,
    ModelConfig,
    Options,
    OutputInfo,
    ServingConfig,
    VariantRecord,
    VariantStatus,
    VersionRecord,
    WorkerRecord,
    new_id,
    now,
    options_key,
)
from service.store import Store, StoreUnavailableError

log = logging.getLogger("kiln.registry")

R = TypeVar("R", bound=BaseModel)

MODEL_BLOB = "models/{sha256}"
# An upload writes its model's bytes pending, and the write that records its version keeps them:
# an upload cut off between the two (a store that fails, an API killed) leaves them this long.
# One that takes longer to record its version puts them back (keep_model_blob).
MODEL_BLOB_PENDING_S = 600.0
ARTIFACT_BLOB = "artifacts/{key}"
# Held by a deletion while it reads which blobs versions and variants reference and deletes the
# others, by an upload while it puts back bytes that one collected, and by a compile while its
# variant takes its artifact: none of them interleave.
MODEL_BLOBS_LOCK = "model-blobs"
MODEL_BLOBS_LOCK_S = 30.0
# Held while a model's version is recorded, while a deletion of its versions is carried out, and
# while a compile marks one of its variants ready: two identical uploads at once record one
# version, a deletion cannot take the model away from under a version being recorded, and it
# sees the artifact of every variant it deletes. Taken before MODEL_BLOBS_LOCK.
MODEL_LOCK = "model:{name}"
MODEL_LOCK_S = 30.0
# A worker doc this long unannounced is a killed worker's, and is dropped.
FORGET_WORKER_S = 86400.0


def version_id(name: str, version: int) -> str:
    # Zero-padded so that a model's versions list in order under the prefix "name/".
    return f"{name}/{version:08d}"


# A claimed job whose request has not finished its writes after this long is taken to be
# abandoned (its process died), and a later request finishes them.
CLAIM_S = 30.0
# A variant compiled again starts afresh: nothing of its earlier job's numbers or error stays.
RETRY: dict[str, Any] = {
    "status": VariantStatus.queued,
    "error": None,
    "artifact_key": None,
    "cache_hit": False,
    "max_abs_error": None,
    "latency_ms": None,
    "latency_ms_by_batch": {},
    "baseline_latency_ms_by_batch": {},
    "raced_at": None,
}


def derived_id(*parts: object) -> str:
    """An id that follows from what it names: two requests that ask for the same thing at once
    derive the same id, and the store's create_doc lets only one of them have it."""
    return hashlib.sha256("\0".join(map(str, parts)).encode()).hexdigest()[:16]


def job_for(variant: VariantRecord, job_id: str) -> JobRecord:
    return JobRecord(
        id=job_id,
        variant_id=variant.id,
        model=variant.model,
        version=variant.version,
        backend=variant.backend,
        target=variant.target,
        options=variant.options,
    )


@dataclass
class NewVersion:
    version: VersionRecord
    variants: list[VariantRecord]
    jobs: list[JobRecord]
    deduplicated: bool


@dataclass
class ModelView:
    name: str
    versions: list[tuple[VersionRecord, list[VariantRecord]]]
    # Unloaded through the repository API: no replica serves it until it is loaded again.
    unloaded: bool = False
    # The version that serves requests naming none; None: the newest ready one.
    default_version: int | None = None
    # The version a model repository's newest version of it last deployed as (KILN_MODEL_REPOSITORY),
    # and whether a deploy under way holds the default version.
    repository_version: int | None = None
    repository_hold: bool = False


class Registry:
    def __init__(self, store: Store) -> None:
        self.store = store

    def _get(self, kind: str, doc_id: str, cls: type[R]) -> R | None:
        doc = self.store.get_doc(kind, doc_id)
        return None if doc is None else cls.model_validate(doc)

    def _put(self, kind: str, doc_id: str, record: BaseModel) -> None:
        self.store.put_doc(kind, doc_id, record.model_dump(mode="json"))

    # Versions ----------------------------------------------------------------------------

    def create_version(
        self,
        config: ModelConfig,
        sha256: str,
        outputs: list[OutputInfo],
        plan: Callable[[str, int], tuple[list[VariantRecord], list[JobRecord]]],
    ) -> NewVersion:
        """Record a new version, or return the existing one for identical bytes and config.

        `plan(name, version)` builds the variants and jobs of a new version.
        """
        with self._model_lock(config.name):
            # First: an identical upload would otherwise find a version that a deletion cut short
            # still names, answer with it, and see the deletion's finish take it afterwards.
            self._finish_deletions_of(config.name, keep=sha256)
            version = self.uploaded(config, sha256)
            if version is not None:
                wanted = config.serving().model_dump()
                changes = {k: v for k, v in wanted.items() if getattr(version.config, k) != v}
                if changes:
                    version = self.update_serving(version.name, version.version, changes)
                return NewVersion(version, self.variants_of(version), [], deduplicated=True)
            doc = {"name": config.name, "created_at": now()}
            if self.store.list_docs("version", prefix=f"{config.name}/"):
                self.store.create_doc("model", config.name, doc)
            else:  # a new name, or one deleted: nothing a call racing its deletion left applies
                self.store.put_doc("model", config.name, doc)
            number = self.store.next_id(f"version:{config.name}")
            variants, jobs = plan(config.name, number)
            version = VersionRecord(
                name=config.name,
                version=number,
                sha256=sha256,
                config=config,
                outputs=outputs,
                variant_ids=[v.id for v in variants],
            )
            # In one write: readers never see a version whose variants are missing, and a failure
            # midway can leave neither jobs of no version, queued for ever, nor a version without
            # its upload record, which an identical retry would then record again, nor a version
            # whose model bytes still expire, nor bytes kept for no version.
            self.store.put_docs(
                [
                    *(("variant", v.id, v.model_dump(mode="json")) for v in variants),
                    *(("job", j.id, j.model_dump(mode="json")) for j in jobs),
                    ("version", version_id(config.name, number), version.model_dump(mode="json")),
                    _upload_doc(config, sha256, number),
                ],
                keep_blobs=[MODEL_BLOB.format(sha256=sha256)],
            )
            return NewVersion(version, variants, jobs, deduplicated=False)

    def _model_lock(self, name: str) -> AbstractContextManager[None]:
        return self.store.lock(MODEL_LOCK.format(name=name), MODEL_LOCK_S)

    def record_upload(self, config: ModelConfig, sha256: str, number: int) -> None:
        """An upload of these bytes with this config is the version `number`: found again by
        `uploaded`."""
        self.store.put_doc(*_upload_doc(config, sha256, number))

    def uploaded(self, config: ModelConfig, sha256: str) -> VersionRecord | None:
        """The version an upload of these bytes with this config made, if one did: the same
        file and compiled settings (serving settings aside)."""
        existing = self.store.get_doc("upload", _upload_key(config, sha256))
        if existing is None:
            return None
        return self._get("version", version_id(config.name, existing["version"]), VersionRecord)

    def add_variants(
        self, version: VersionRecord, wanted: list[tuple[str, Options, str]], retried: list[VariantRecord]
    ) -> list[tuple[VariantRecord, JobRecord]]:
        """Compile more of an existing version: a new queued variant for each (backend, options,
        target) wanted, and a new job for each failed or rejected variant retried. Returns the
        variants and jobs to enqueue, less those another request holds.

        Each job is claimed first: its id follows from what it compiles, so of two requests that
        ask at once the store's create_doc gives it to one. The claimant then writes the variant
        and links it to the version, or marks the failed one queued under the new job. Those
        writes are idempotent, so a request that died midway is finished by a later one.
        NotFoundError when the version was deleted meanwhile."""
        vid = version_id(version.name, version.version)
        queued: list[tuple[VariantRecord, JobRecord]] = []
        for backend, options, target in wanted:
            variant = VariantRecord(
                id=derived_id(vid, version.created_at, backend, options_key(options), target),
                model=version.name,
                version=version.version,
                backend=backend,
                target=target,
                options=options,
                status=VariantStatus.queued,
            )
            job = job_for(variant, derived_id(variant.id, None))
            variant.job_id = job.id
            if not self._claim(job) and not (self._abandoned(job) and not self._lists(vid, variant.id)):
                continue
            self.store.create_doc("variant", variant.id, variant.model_dump(mode="json"))
            # Last, as at upload: readers never see a version whose variants are missing.
            self.store.update_doc("version", vid, {ADDED_VARIANT + variant.id: now()})
            queued.append((variant, job))
        for failed in retried:
            job = job_for(failed, derived_id(failed.id, failed.job_id))
            if not self._claim(job) and not (
                self._abandoned(job) and self._points_elsewhere(failed.id, job.id)
            ):
                continue
            # What it measured, or why it failed, was the earlier job's (which keeps its record).
            retry = {**RETRY, "job_id": job.id}
            self.update_variant(failed.id, **retry)
            queued.append((failed.model_copy(update=retry), job))
        if self.store.get_doc("version", vid) is None:  # deleted meanwhile: undo what belongs to nothing
            for variant, job in queued:
                self.store.delete_doc("job", job.id)
                self.store.delete_doc("variant", variant.id)
            raise NotFoundError(f"model {version.name!r} has no version {version.version}")
        return queued

    def _claim(self, job: JobRecord) -> bool:
        return self.store.create_doc("job", job.id, job.model_dump(mode="json"))

    def _abandoned(self, job: JobRecord) -> bool:
        """Whether the job is claimed, never started, and older than a request takes: its
        claimant may have died before its writes, which the caller then checks."""
        held = self._get("job", job.id, JobRecord)
        return held is not None and held.attempts == 0 and now() - held.created_at > CLAIM_S

    def lists_variant(self, job: JobRecord) -> bool:
        """Whether the job's version exists and lists its variant. Until then, the request that
        claimed the job may still be writing, and a later request takes the job over."""
        return self._lists(version_id(job.model, job.version), job.variant_id)

    def _lists(self, vid: str, variant_id: str) -> bool:
        doc = self.store.get_doc("version", vid)
        return doc is not None and variant_id in VersionRecord.model_validate(doc).variant_ids

    def _points_elsewhere(self, variant_id: str, job_id: str) -> bool:
        current = self.get_variant(variant_id)
        return current is not None and current.job_id != job_id

    def variants_of(self, version: VersionRecord) -> list[VariantRecord]:
        found = (self._get("variant", vid, VariantRecord) for vid in version.variant_ids)
        return [v for v in found if v is not None]

    def get_version(self, name: str, version: int) -> VersionRecord:
        record = self._get("version", version_id(name, version), VersionRecord)
        if record is None:
            self._versions(name)  # a 404 that names the model when it is the model that's missing
            raise NotFoundError(f"model {name!r} has no version {version}")
        return record

    def get_model(self, name: str) -> ModelView:
        return self._view(name, self.store.get_doc("model", name))

    def _view(self, name: str, doc: dict[str, Any] | None) -> ModelView:
        """A model's versions with the settings of its document, which may be missing."""
        versions = [(v, self.variants_of(v)) for v in self._versions(name)]
        doc = doc or {}
        default = doc.get("default_version")
        if default not in {v.version for v, _ in versions}:
            default = None  # set while its version was being deleted: the newest serves
        return ModelView(
            name,
            versions,
            bool(doc.get("unloaded")),
            default,
            doc.get("repository_version"),
            bool(doc.get("repository_hold")),
        )

    def _versions(self, name: str) -> list[VersionRecord]:
        docs = self.store.list_docs("version", prefix=f"{name}/")
        if not docs:
            raise NotFoundError(f"no model named {name!r}")
        return sorted((VersionRecord.model_validate(d) for d in docs), key=lambda v: v.version)

    def version_numbers(self, name: str) -> set[int]:
        """The numbers of a model's versions; none for an unknown name."""
        return {int(doc["version"]) for doc in self.store.list_docs("version", prefix=f"{name}/")}

    def check_model(self, name: str) -> None:
        """NotFoundError (a 404) for an unknown name; its versions are not read."""
        if not self.version_numbers(name):
            raise NotFoundError(f"no model named {name!r}")

    def set_unloaded(self, name: str, unloaded: bool) -> None:
        """Take a model out of service on every replica, or put it back. In the store, not in a
        process: under several workers or replicas, an unload must reach those that did not
        receive it, and it outlives their restarts as it would a deploy."""
        self._versions(name)  # a 404 for unknown names
        fields: dict[str, Any] = {"unloaded": unloaded}
        if unloaded:  # which unload it was: a load that began before it does not undo it
            fields["unload_id"] = uuid.uuid4().hex
        self._update_model(name, fields)

    def last_unload(self, name: str) -> str | None:
        """The model's last unload (None if none), as a load sees it when it begins."""
        doc = self.store.get_doc("model", name)
        return None if doc is None else doc.get("unload_id")

    def serve_again(self, name: str, since: str | None) -> bool:
        """Put the model back in service, unless an unload came after `since` (last_unload as
        the load began): it comes last, and wins, as in Triton, which runs a model's load and
        unload requests in turn."""
        if self.last_unload(name) != since:
            return False
        self.set_unloaded(name, False)
        return True

    def update_serving(self, name: str, number: int, changes: dict[str, Any]) -> VersionRecord:
        """Change some of a version's serving settings (ServingConfig fields, validated), each
        a field of its own (SERVING_FIELD), and return the version as the store now has it."""
        self.get_version(name, number)  # a 404 that names what is missing
        fields = {SERVING_FIELD + k: v for k, v in changes.items()}
        self.store.update_doc("version", version_id(name, number), fields)  # a deleted one stays deleted
        return self.get_version(name, number)

    def set_default_version(self, name: str, version: int | None) -> None:
        """Serve `version` to requests that name none, on every replica, until it is set again;
        None: the newest ready version, as before. A rollback that keeps the newer version."""
        if version is None:
            self._versions(name)
        else:
            self.get_version(name, version)  # a 404 that names what is missing
        self._update_model(name, {"default_version": version, "repository_hold": False})

    def set_repository_state(
        self, name: str, default_version: int | None, held: bool, repository_version: int | None = None
    ) -> None:
        """A model repository's deploy: the default version, whether the deploy holds it, and the
        version the repository's newest deployed as, written at once."""
        self._versions(name)  # a 404 for a model deleted meanwhile
        fields: dict[str, Any] = {"default_version": default_version, "repository_hold": held}
        if repository_version is not None:
            fields["repository_version"] = repository_version
        self._update_model(name, fields)

    def deployed_from_repository(self, name: str) -> bool:
        """Whether a model repository's deploy recorded the model (set_repository_state)."""
        doc = self.store.get_doc("model", name) or {}
        return doc.get("repository_version") is not None or bool(doc.get("repository_hold"))

    def _update_model(self, name: str, fields: dict[str, Any]) -> None:
        # Created if missing (an upload racing a deletion can leave versions without it): an
        # update alone would then do nothing, and the request would answer 200 for nothing.
        self.store.create_doc("model", name, {"name": name, "created_at": now()})
        self.store.update_doc("model", name, fields)

    def is_unloaded(self, name: str) -> bool:
        doc = self.store.get_doc("model", name)
        return bool(doc and doc.get("unloaded"))

    def list_models(self) -> list[ModelView]:
        views = []
        for doc in self.store.list_docs("model"):  # in name order
            try:
                views.append(self._view(doc["name"], doc))
            except NotFoundError:  # deleted between the two reads
                continue
        return views

    # Variants and jobs -------------------------------------------------------------------

    def get_variant(self, variant_id: str) -> VariantRecord | None:
        return self._get("variant", variant_id, VariantRecord)

    def update_variant(self, variant_id: str, **fields: Any) -> None:
        fields["updated_at"] = now()
        self.store.update_doc("variant", variant_id, _jsonable(VariantRecord, fields))

    def get_job(self, job_id: str) -> JobRecord:
        job = self._get("job", job_id, JobRecord)
        if job is None:
            raise NotFoundError(f"no job with id {job_id!r}")
        return job

    def update_job(self, job_id: str, **fields: Any) -> None:
        self.store.update_doc("job", job_id, _jsonable(JobRecord, fields))

    def set_stage(self, job: JobRecord, stage: VariantStatus) -> None:
        self.update_job(job.id, stage=stage)
        self.update_variant(job.variant_id, status=stage)

    # Artifacts ---------------------------------------------------------------------------

    def get_artifact(self, key: str) -> ArtifactRecord | None:
        record = self._get("artifact", key, ArtifactRecord)
        if record is None or not self.store.has_blob(ARTIFACT_BLOB.format(key=key)):
            return None
        return record

    def put_artifact(self, record: ArtifactRecord, data: bytes) -> None:
        self.store.put_blob(ARTIFACT_BLOB.format(key=record.key), [data])
        self._put("artifact", record.key, record)

    # Workers -----------------------------------------------------------------------------

    def announce_worker(self, record: WorkerRecord) -> None:
        self._put("worker", record.id, record)

    def remove_worker(self, worker_id: str) -> None:
        self.store.delete_doc("worker", worker_id)

    def live_workers(self, max_age_s: float) -> list[WorkerRecord]:
        """Workers heard from in the last `max_age_s`. A killed worker's doc goes stale, and is
        dropped once FORGET_WORKER_S old: every pod a rollout replaced would stay, read by each
        upload. One that comes back announces itself again."""
        live = []
        for doc in self.store.list_docs("worker"):
            worker = WorkerRecord.model_validate(doc)
            age = now() - worker.last_seen
            if age > FORGET_WORKER_S:
                self.remove_worker(worker.id)
            elif age <= max_age_s:
                live.append(worker)
        return live

    def live_targets(self, max_age_s: float) -> set[str]:
        return {t for w in self.live_workers(max_age_s) for t in w.targets}

    # Deletion ----------------------------------------------------------------------------

    def delete_model(self, name: str) -> ModelView:
        """Remove a model's metadata, then those of its blobs that nothing else references."""
        view = self.get_model(name)
        self._delete(view)
        return view

    def delete_version(self, name: str, number: int) -> ModelView:
        """Remove one version (the model too, if it was the last), then those of its blobs
        that nothing else references. Returns what went."""
        version = self.get_version(name, number)
        doc = self.store.get_doc("model", name) or {}
        if doc.get("default_version") == number and len(self._versions(name)) > 1:
            raise ConflictError(
                f"version {number} is the default version of {name!r}: set another, or null for "
                f"the newest, with PUT /v1/models/{name}/default-version first"
            )
        deleted = ModelView(name, [(version, self.variants_of(version))])
        self._delete(deleted)
        return deleted

    def _delete(self, deleted: ModelView) -> None:
        """Recorded first, then done: a deletion that the store's outage or the process's death
        cuts short is finished by `finish_deletions`, as the retry of its request, finding no
        versions left, would answer 404 and finish nothing."""
        pending = Deletion(
            id=new_id(),
            name=deleted.name,
            versions=sorted(version.version for version, _ in deleted.versions),
            model_blobs=sorted({version.sha256 for version, _ in deleted.versions}),
            artifacts=sorted({v.artifact_key for _, vs in deleted.versions for v in vs if v.artifact_key}),
        )
        self._put("deletion", pending.id, pending)
        self._finish(pending)

    def finish_deletions(self, older_than_s: float) -> list[str]:
        """Finish the deletions recorded at least `older_than_s` ago and not done (a deletion
        still under way is left to its request); the names of their models. Each step of one
        may be done twice: version numbers are never given again, so its documents are only
        ever its own."""
        finished = []
        for doc in self.store.list_docs("deletion"):
            try:
                pending = Deletion.model_validate(doc)
                if now() - pending.at >= older_than_s:
                    self._finish(pending)
                    finished.append(pending.name)
            except StoreUnavailableError:
                raise
            except Exception:  # one that cannot be finished must not keep the others from it
                log.exception("the deletion %s could not be finished", doc.get("id"))
        return finished

    def _finish(self, deletion: Deletion) -> None:
        with self._model_lock(deletion.name):
            self._finish_held(deletion)

    def _finish_deletions_of(self, name: str, keep: str) -> None:
        """Finish the deletions of the model `name` not done, whatever their age; under its lock.
        The model blob `keep` stays: the upload that called wrote it, and no version names it yet."""
        for doc in self.store.list_docs("deletion"):
            try:
                pending = Deletion.model_validate(doc)
            except ValidationError:  # not this Kiln's to finish (finish_deletions logs it)
                continue
            if pending.name == name:
                self._finish_held(pending, keep)

    def _finish_held(self, deletion: Deletion, keep: str | None = None) -> None:
        """The steps of a deletion, with its model's lock held; the model blob `keep` stays."""
        name, numbers = deletion.name, set(deletion.versions)
        for number in deletion.versions:
            self.store.delete_doc("version", version_id(name, number))
        # By their model and version, not the versions' lists: the earlier jobs of variants
        # compiled again, and whatever a request racing this one added, go too.
        for doc in self._docs_of("job", name, numbers):
            self.store.delete_doc("job", doc["id"])
        variants = self._docs_of("variant", name, numbers)
        deletion = self._with_artifacts(deletion, variants)
        for doc in variants:
            self.store.delete_doc("variant", doc["id"])
        for doc in self.store.list_docs("upload"):
            if doc["name"] == name and doc["version"] in numbers:
                self.store.delete_doc("upload", doc["id"])
        model = self.store.get_doc("model", name)
        # Not that of the name's next upload, which a late finish may meet before its version.
        ours = model is not None and model.get("created_at", 0) <= deletion.at
        if ours and not self.store.list_docs("version", prefix=f"{name}/"):
            self.store.delete_doc("model", name)
        self._collect_garbage(deletion, keep)
        self.store.delete_doc("deletion", deletion.id)

    def _docs_of(self, kind: str, name: str, numbers: set[int]) -> list[dict[str, Any]]:
        return [
            d for d in self.store.list_docs(kind) if d.get("model") == name and d.get("version") in numbers
        ]

    def _with_artifacts(self, deletion: Deletion, variants: list[dict[str, Any]]) -> Deletion:
        """The deletion, with the artifacts of its variants as read under the model's lock: a
        compile marks its variant ready under it, perhaps since the deletion read the model.
        Recorded before the variants go, for a finish cut short."""
        artifacts = set(deletion.artifacts) | {d["artifact_key"] for d in variants if d.get("artifact_key")}
        if artifacts == set(deletion.artifacts):
            return deletion
        self.store.update_doc("deletion", deletion.id, {"artifacts": sorted(artifacts)})
        return deletion.model_copy(update={"artifacts": sorted(artifacts)})

    @contextmanager
    def marking_ready(self, model: str) -> Iterator[None]:
        """Held while a compile's variant of `model` takes its artifact. The model's lock: a
        deletion of the model reads its variants' artifacts and deletes the variants wholly before
        (it collects the artifact) or after (the compile finds its variant gone). Then the blobs'
        lock: a deletion of another model, whose identical compile shares the artifact's key,
        does not collect it meanwhile."""
        with self._model_lock(model), self.store.lock(MODEL_BLOBS_LOCK, MODEL_BLOBS_LOCK_S):
            yield

    def collect_artifacts(self, keys: Iterable[str]) -> None:
        """Delete those of the artifacts `keys` that no variant references (an identical compile
        shares one's key). Under the blobs' lock, which a variant takes its artifact under."""
        live = {d["artifact_key"] for d in self.store.list_docs("variant") if d.get("artifact_key")}
        for key in set(keys) - live:
            self.store.delete_blob(ARTIFACT_BLOB.format(key=key))
            self.store.delete_doc("artifact", key)

    def keep_model_blob(self, sha256: str, chunks: Callable[[], Iterable[bytes]]) -> None:
        """Keep the model bytes of a version just recorded or found again (an identical upload,
        which recorded nothing, may have written them pending), or put them back if they went
        before the version referenced them: collected by a deletion of another model of the same
        bytes, or expired. Under the lock that the collection holds: one that comes later sees the
        version and spares them."""
        key = MODEL_BLOB.format(sha256=sha256)
        with self.store.lock(MODEL_BLOBS_LOCK, MODEL_BLOBS_LOCK_S):
            if not self.store.keep_blob(key):
                self.store.put_blob(key, chunks())

    def _collect_garbage(self, deletion: Deletion, keep: str | None = None) -> None:
        """Only the deleted versions' own blobs are candidates: any other unreferenced blob may
        belong to work in flight (an upload between its blob and its version record, a compile
        between its artifact and its variant's update), and deleting it would break that work.
        (Such a compile puts back its artifact if one of these shared its key and went; an upload
        that never records its version leaves its pending blob to expire.)"""
        with self.store.lock(MODEL_BLOBS_LOCK, MODEL_BLOBS_LOCK_S):
            live_models = {VersionRecord.model_validate(d).sha256 for d in self.store.list_docs("version")}
            for sha256 in set(deletion.model_blobs) - live_models - {keep}:
                self.store.delete_blob(MODEL_BLOB.format(sha256=sha256))
            self.collect_artifacts(deletion.artifacts)


def _jsonable(cls: type[BaseModel], fields: dict[str, Any]) -> dict[str, Any]:
    """Dump only `fields`, through the record's own field types (enums, int-keyed dicts)."""
    partial = cls.model_construct(**fields)
    return partial.model_dump(mode="json", include=set(fields))


def _upload_doc(config: ModelConfig, sha256: str, number: int) -> tuple[str, str, dict[str, Any]]:
    """The kind, id and document that record an upload as the version `number`."""
    key = _upload_key(config, sha256)
    return "upload", key, {"id": key, "name": config.name, "version": number}


def _upload_key(config: ModelConfig, sha256: str) -> str:
    """Serving settings are left out: an upload that differs only in them is the same version,
    which takes them (as a PATCH of its serving settings), rather than a new one to compile."""
    compiled = config.model_dump(mode="json", exclude=set(ServingConfig.model_fields))
    if compiled["output_names"] is None:  # as keys written before the field was added
        del compiled["output_names"]
    canonical = json.dumps(compiled, sort_keys=True)
    return hashlib.sha256(f"{sha256}\0{canonical}".encode()).hexdigest()
