"""The registry: deletion (a model's blobs go with it, and no one else's, even mid-flight), serving
changes and variants added to a version by requests on several replicas at once."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from service.errors import NotFoundError
from service.jobs import _record_baseline, run_compile_job
from service.records import (
    ArtifactRecord,
    Deletion,
    JobRecord,
    ModelConfig,
    OutputInfo,
    VariantRecord,
    VariantStatus,
    now,
)
from service.registry import (
    ARTIFACT_BLOB,
    CLAIM_S,
    MODEL_BLOB,
    MODEL_BLOBS_LOCK,
    MODEL_BLOBS_LOCK_S,
    NewVersion,
    Registry,
    job_for,
    version_id,
)
from service.settings import Settings
from service.store import RedisStore, Store, StoreUnavailableError
from service.store.local import LocalStore
from tests.models import MODELS
from tests.registries import ready_version, reference, rejected_tvm

HOST = "cpu-x86_64-test-avx2"
BASELINE = {1: 1.0, 8: 8.0}


def test_deleting_a_model_removes_its_blobs_and_spares_work_in_flight(tmp_path: Path) -> None:
    registry = Registry(LocalStore(tmp_path / "store"))
    store = registry.store
    mlp = MODELS["mlp"]
    ready_version(
        registry, mlp, {"torchscript": reference(BASELINE), "tvm": (HOST, b"packed", BASELINE)}, BASELINE
    )
    own_model = MODEL_BLOB.format(sha256=hashlib.sha256(mlp.torchscript()).hexdigest())
    own_artifact = ARTIFACT_BLOB.format(key="tvm")
    # Another upload has stored its bytes and not yet its version record; a compile has stored
    # its artifact and not yet marked its variant ready. Nothing references either yet.
    uploading = MODEL_BLOB.format(sha256=hashlib.sha256(b"another model").hexdigest())
    compiled = ARTIFACT_BLOB.format(key="fresh-artifact")
    store.put_blob(uploading, [b"another model"])
    store.put_blob(compiled, [b"fresh artifact"])

    registry.delete_model(mlp.name)

    assert not store.has_blob(own_model) and not store.has_blob(own_artifact)
    assert store.has_blob(uploading) and store.has_blob(compiled)


def test_a_deletion_spares_the_bytes_of_a_version_recorded_while_it_collects(tmp_path: Path) -> None:
    """An upload of the same bytes under another name records its version while the deletion
    waits for the lock that an upload putting its bytes back holds: the deletion reads what
    versions reference once it holds the lock, and spares them."""
    registry = Registry(LocalStore(tmp_path / "store"))
    mlp = MODELS["mlp"]
    ready_version(registry, mlp, {"torchscript": reference(BASELINE)}, BASELINE)
    blob = MODEL_BLOB.format(sha256=hashlib.sha256(mlp.torchscript()).hexdigest())
    with registry.store.lock(MODEL_BLOBS_LOCK, MODEL_BLOBS_LOCK_S):
        deleting = threading.Thread(target=registry.delete_model, args=(mlp.name,))
        deleting.start()
        deleting.join(0.5)
        assert deleting.is_alive(), "the deletion collected without the lock"
        ready_version(registry, mlp, {"torchscript": reference(BASELINE)}, BASELINE, name="copy")
    deleting.join(10)
    assert not deleting.is_alive()
    assert registry.store.has_blob(blob)
    assert [v.sha256 for v, _ in registry.get_model("copy").versions] == [blob.split("/")[1]]
    registry.delete_model("copy")
    assert not registry.store.has_blob(blob)


def test_a_deletion_cut_short_is_finished_later(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The store went away after the first of a deletion's steps: the retry finds no versions
    (404), and what the deletion had still to remove is removed by the next sweep."""
    registry = Registry(LocalStore(tmp_path / "store"))
    store = registry.store
    mlp = MODELS["mlp"]
    ready_version(
        registry, mlp, {"torchscript": reference(BASELINE), "tvm": (HOST, b"packed", BASELINE)}, BASELINE
    )
    registry.add_variants(registry.get_version(mlp.name, 1), [("onnxruntime", {}, HOST)], [])
    own_model = MODEL_BLOB.format(sha256=hashlib.sha256(mlp.torchscript()).hexdigest())
    own_artifact = ARTIFACT_BLOB.format(key="tvm")
    delete_doc, deleted = store.delete_doc, []

    def outage_after_one(kind: str, doc_id: str) -> None:
        if deleted:
            raise StoreUnavailableError("redis at 127.0.0.1:6379 is unreachable (simulated)")
        delete_doc(kind, doc_id)
        deleted.append(kind)

    monkeypatch.setattr(store, "delete_doc", outage_after_one)
    with pytest.raises(StoreUnavailableError):
        registry.delete_model(mlp.name)
    monkeypatch.undo()
    assert deleted == ["version"]
    with pytest.raises(NotFoundError):
        registry.delete_model(mlp.name)
    assert store.list_docs("variant") and store.list_docs("job") and store.has_blob(own_model)

    assert registry.finish_deletions(older_than_s=60) == []  # its request may still be at it
    store.put_doc("deletion", "0-unreadable", {"id": "0-unreadable", "from": "a newer Kiln"})
    assert registry.finish_deletions(older_than_s=0) == [mlp.name]  # that one did not stop it
    for kind in ("version", "variant", "job", "upload", "model"):
        assert store.list_docs(kind) == [], kind
    assert [d["id"] for d in store.list_docs("deletion")] == ["0-unreadable"]
    assert not store.has_blob(own_model) and not store.has_blob(own_artifact)
    assert registry.finish_deletions(older_than_s=0) == []


def test_an_upload_identical_to_a_version_whose_deletion_was_cut_short_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DELETE recorded its deletion and was cut short before any step; the same bytes and config
    are uploaded again. The upload answered with the version being deleted (200, deduplicated),
    and the sweep then deleted it under the acknowledged upload: now it is a new version, kept."""
    registry = Registry(LocalStore(tmp_path / "store"))
    mlp = MODELS["mlp"]
    ready_version(registry, mlp, {"torchscript": reference(BASELINE)}, BASELINE)

    def outage(name: str, expire_s: float) -> None:
        raise StoreUnavailableError("redis at 127.0.0.1:6379 is unreachable (simulated)")

    monkeypatch.setattr(registry.store, "lock", outage)
    with pytest.raises(StoreUnavailableError):
        registry.delete_model(mlp.name)
    monkeypatch.undo()
    assert [d["versions"] for d in registry.store.list_docs("deletion")] == [[1]]

    version = registry.get_version(mlp.name, 1)
    made = registry.create_version(version.config, version.sha256, version.outputs, lambda n, v: ([], []))
    assert (made.version.version, made.deduplicated) == (2, False)
    # Its bytes, written before the version is recorded, outlive the deletion it finished: the
    # version was served a BlobNotFoundError until the upload put them back.
    assert registry.store.has_blob(MODEL_BLOB.format(sha256=version.sha256))
    assert registry.store.list_docs("deletion") == []
    assert registry.finish_deletions(older_than_s=0) == []
    assert [v.version for v, _ in registry.get_model(mlp.name).versions] == [2]
    assert registry.uploaded(version.config, version.sha256) == made.version


def test_a_late_deletion_spares_the_model_of_the_names_next_upload(tmp_path: Path) -> None:
    """The sweep finishes a deletion of the whole model just as a new upload of its name has
    recorded the model and not yet its version: the new model stays."""
    registry = Registry(LocalStore(tmp_path / "store"))
    mlp = MODELS["mlp"]
    ready_version(registry, mlp, {"torchscript": reference(BASELINE)}, BASELINE)
    registry.delete_model(mlp.name)
    late = Deletion(id="late", name=mlp.name, versions=[1], model_blobs=[], artifacts=[], at=now() - 60)
    registry.store.put_doc("deletion", late.id, late.model_dump(mode="json"))
    registry.store.put_doc("model", mlp.name, {"name": mlp.name, "created_at": now()})
    assert registry.finish_deletions(older_than_s=30) == [mlp.name]
    assert registry.store.get_doc("model", mlp.name) is not None


@pytest.fixture(params=["local", "redis"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if request.param == "local":
        return LocalStore(tmp_path / "store")
    return RedisStore(request.getfixturevalue("redis_url"))


def test_identical_uploads_at_once_record_one_version(any_store: Store) -> None:
    """The same bytes and config sent by several requests at once (a deploy script's retries,
    say) make one version, and every request answers with it."""
    registry = Registry(any_store)
    config = ModelConfig.model_validate(MODELS["mlp"].config())
    outputs = [OutputInfo(name="output0", dtype="float32", shape=[-1, 10])]

    def plan(name: str, number: int) -> tuple[list[VariantRecord], list[JobRecord]]:
        time.sleep(0.2)  # the window in which another request checked for the same upload
        return [], []

    answers: list[tuple[int, bool]] = []

    def upload() -> None:
        made = registry.create_version(config, "a" * 64, outputs, plan)
        answers.append((made.version.version, made.deduplicated))

    uploads = [threading.Thread(target=upload) for _ in range(4)]
    for thread in uploads:
        thread.start()
    for thread in uploads:
        thread.join(30)
    assert sorted(answers) == [(1, False), (1, True), (1, True), (1, True)]
    assert [version.version for version, _ in registry.get_model(config.name).versions] == [1]


@pytest.mark.parametrize("failing", ["version", "upload"])
def test_a_version_is_recorded_whole_or_not_at_all(
    any_store: Store, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    """The store failed (disk full, a kill) as an upload recorded its version: its variant and
    job were left with no version (queued for ever, and no DELETE could reach them), or its
    version without its upload record (the retry made a second, identical version)."""
    registry = Registry(any_store)
    config = ModelConfig.model_validate(MODELS["mlp"].config())
    outputs = [OutputInfo(name="output0", dtype="float32", shape=[-1, 10])]

    def plan(name: str, number: int) -> tuple[list[VariantRecord], list[JobRecord]]:
        variant = VariantRecord(
            id=f"tvm-{number}",
            model=name,
            version=number,
            backend="tvm",
            target=HOST,
            status=VariantStatus.queued,
            job_id=f"job-{number}",
        )
        return [variant], [job_for(variant, f"job-{number}")]

    def failing_with(write: Callable[..., None]) -> Callable[..., None]:
        def fail(*args: Any, **kwargs: Any) -> None:
            docs = [args] if isinstance(args[0], str) else list(args[0])
            if any(kind == failing for kind, _, _ in docs):
                raise StoreUnavailableError("the store in /data cannot write: disk full (simulated)")
            write(*args, **kwargs)

        return fail

    monkeypatch.setattr(any_store, "put_doc", failing_with(any_store.put_doc))
    monkeypatch.setattr(any_store, "put_docs", failing_with(any_store.put_docs))
    with pytest.raises(StoreUnavailableError):
        registry.create_version(config, "c" * 64, outputs, plan)
    monkeypatch.undo()
    for kind in ("version", "variant", "job", "upload"):
        assert any_store.list_docs(kind) == [], kind

    made = registry.create_version(config, "c" * 64, outputs, plan)
    again = registry.create_version(config, "c" * 64, outputs, plan)
    assert (again.version, again.deduplicated) == (made.version, True)
    assert [d["id"] for d in any_store.list_docs("job")] == [made.jobs[0].id]


def test_an_upload_s_model_bytes_are_kept_by_its_version_s_record_and_no_sooner(
    any_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An upload writes its model's bytes pending, and the write that records its version keeps
    them. One cut off between the two (a store that failed, an API killed) left them for ever:
    no version references them, and only deleted versions' bytes are collected."""
    registry = Registry(any_store)
    config = ModelConfig.model_validate(MODELS["mlp"].config())
    outputs = [OutputInfo(name="output0", dtype="float32", shape=[-1, 10])]
    recorded, cut_off, found_again = "d" * 64, "e" * 64, "f" * 64

    def upload(name: str, sha256: str) -> NewVersion:
        any_store.put_blob(MODEL_BLOB.format(sha256=sha256), [b"weights"], expire_s=0.5)
        named = config.model_copy(update={"name": name})
        return registry.create_version(named, sha256, outputs, lambda name, number: ([], []))

    def outage(*args: Any, **kwargs: Any) -> None:
        raise StoreUnavailableError("redis at 127.0.0.1:6379 cannot take writes now (simulated)")

    upload("recorded", recorded)
    upload("again", found_again)
    monkeypatch.setattr(any_store, "put_docs", outage)
    with pytest.raises(StoreUnavailableError):
        upload("cut-off", cut_off)
    monkeypatch.undo()
    # An identical upload finds its version, whose bytes went meanwhile: it writes them pending
    # and records nothing, and keep_model_blob keeps them.
    any_store.delete_blob(MODEL_BLOB.format(sha256=found_again))
    assert upload("again", found_again).deduplicated
    registry.keep_model_blob(found_again, lambda: [b"weights"])
    time.sleep(0.7)
    any_store.put_blob("other", [b"x"])  # the local store removes expired blobs as it writes one
    assert any_store.has_blob(MODEL_BLOB.format(sha256=recorded))
    assert any_store.has_blob(MODEL_BLOB.format(sha256=found_again))
    assert not any_store.has_blob(MODEL_BLOB.format(sha256=cut_off))


def test_a_deletion_cannot_take_the_model_from_under_a_version_being_recorded(any_store: Store) -> None:
    """DELETE /v1/models/{name} lands while an upload of that name records its version: the
    deletion takes the versions it saw, and the new version's model stays listed."""
    registry = Registry(any_store)
    mlp = MODELS["mlp"]
    ready_version(registry, mlp, {"torchscript": reference(BASELINE)}, BASELINE)
    config = ModelConfig.model_validate(mlp.config(max_batch_size=4))
    outputs = [OutputInfo(name="output0", dtype="float32", shape=[-1, 10])]
    deleting = threading.Thread(target=registry.delete_model, args=(mlp.name,))

    def plan(name: str, number: int) -> tuple[list[VariantRecord], list[JobRecord]]:
        deleting.start()
        deleting.join(0.5)  # done by now, unless it waits for this upload
        return [], []

    registry.create_version(config, "b" * 64, outputs, plan)
    deleting.join(30)
    assert not deleting.is_alive()
    assert [view.name for view in registry.list_models()] == [mlp.name]
    assert [version.version for version, _ in registry.get_model(mlp.name).versions] == [2]


def test_a_default_version_that_outlived_its_version_or_model_does_not_apply(tmp_path: Path) -> None:
    registry = Registry(LocalStore(tmp_path / "store"))
    mlp = MODELS["mlp"]
    ready_version(registry, mlp, {"torchscript": reference(BASELINE)}, BASELINE)
    registry.set_default_version(mlp.name, 1)
    assert registry.get_model(mlp.name).default_version == 1
    # A call that raced the version's deletion left the document naming it.
    registry.store.update_doc("model", mlp.name, {"default_version": 7})
    assert registry.get_model(mlp.name).default_version is None
    # One that raced the model's deletion left the document alone: the name's next upload
    # starts afresh, neither unloaded nor pinned.
    registry.delete_model(mlp.name)
    registry.store.put_doc("model", mlp.name, {"name": mlp.name, "unloaded": True, "default_version": 3})
    ready_version(registry, mlp, {"torchscript": reference(BASELINE)}, BASELINE)
    view = registry.get_model(mlp.name)
    assert (view.unloaded, view.default_version, [v.version for v, _ in view.versions]) == (False, None, [2])


def test_an_unload_during_a_load_is_not_undone_by_it(tmp_path: Path) -> None:
    """As Triton, which runs a model's load and unload in turn: the unload came last, and wins."""
    registry = Registry(LocalStore(tmp_path / "store"))
    mlp = MODELS["mlp"]
    ready_version(registry, mlp, {"torchscript": reference(BASELINE)}, BASELINE)
    registry.set_unloaded(mlp.name, True)
    since = registry.last_unload(mlp.name)  # a load begins
    assert registry.serve_again(mlp.name, since) and not registry.is_unloaded(mlp.name)

    since = registry.last_unload(mlp.name)
    registry.set_unloaded(mlp.name, True)  # while it loads
    assert not registry.serve_again(mlp.name, since) and registry.is_unloaded(mlp.name)
    assert registry.serve_again(mlp.name, registry.last_unload(mlp.name))  # a load after it


def test_serving_changes_of_different_settings_never_overwrite_each_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two replicas change different settings of one version at once: each writes its own
    fields, so neither loses the other's, whatever order the store sees them in; a version
    deleted meanwhile stays deleted."""
    registry = Registry(LocalStore(tmp_path / "store"))
    mlp = MODELS["mlp"]
    ready_version(registry, mlp, {"torchscript": reference(BASELINE)}, BASELINE, max_queue_delay_us=100)
    # Both read the version before either writes: a read-modify-write of the whole config
    # would have the second undo the first.
    before = registry.get_version(mlp.name, 1)
    registry.update_serving(mlp.name, 1, {"max_queue_size": 4})
    real, stale = registry.get_version, [before]  # the second one's first read is the old one
    monkeypatch.setattr(registry, "get_version", lambda n, v: stale.pop() if stale else real(n, v))
    after = registry.update_serving(mlp.name, 1, {"response_cache": True})
    monkeypatch.undo()
    assert before.config.max_queue_size is None
    assert (after.config.max_queue_size, after.config.response_cache) == (4, True)
    assert after.config.max_queue_delay_us == 100 and after.config.inputs == before.config.inputs
    assert registry.get_version(mlp.name, 1) == after
    registry.delete_model(mlp.name)
    with pytest.raises(NotFoundError):
        registry.update_serving(mlp.name, 1, {"max_queue_size": 8})
    assert registry.store.get_doc("version", version_id(mlp.name, 1)) is None


def test_variants_added_at_once_by_two_requests_are_added_once(tmp_path: Path) -> None:
    """Two replicas add the same variant, and retry the same failed one, from reads taken
    before either wrote: one of them gets each. Variants added by different requests all stay,
    in the order they were added, and a deleted version keeps nothing of an addition."""
    registry = Registry(LocalStore(tmp_path / "store"))
    mlp = MODELS["mlp"]
    failed = VariantStatus.failed
    ready_version(
        registry, mlp, {"torchscript": reference(BASELINE), "tvm": (HOST, b"packed", BASELINE)}, BASELINE
    )
    registry.update_variant("tvm", status=failed, error="killed (out of memory)", job_id="old-job")
    registry.store.put_doc("job", "old-job", {"id": "old-job"})
    version = registry.get_version(mlp.name, 1)
    [tvm] = [v for v in registry.variants_of(version) if v.id == "tvm"]
    ort = ("onnxruntime", {}, HOST)

    first = registry.add_variants(version, [ort], [tvm])
    second = registry.add_variants(version, [ort], [tvm])  # the same stale reads
    assert second == []
    assert [(v.backend, v.status, j.target) for v, j in first] == [
        ("onnxruntime", VariantStatus.queued, HOST),
        ("tvm", VariantStatus.queued, HOST),
    ]
    retried = registry.get_variant("tvm")
    assert retried is not None and (retried.status, retried.error) == (VariantStatus.queued, None)
    assert (retried.artifact_key, retried.latency_ms_by_batch) == (None, {})  # the failed job's
    assert retried.job_id == first[1][1].id and registry.get_job(retried.job_id).variant_id == "tvm"
    # The earlier job is the variant's no longer: its redelivery leaves the retry alone.
    registry.store.put_doc("job", "old-job", {**first[1][1].model_dump(mode="json"), "id": "old-job"})
    run_compile_job(registry, Settings(), "old-job")
    assert registry.get_variant("tvm") == retried and registry.get_job("old-job").attempts == 0

    inductor = registry.add_variants(version, [("inductor", {"mode": "max"}, HOST)], [])
    current = registry.get_version(mlp.name, 1)
    assert current.variant_ids == ["torchscript", "tvm", first[0][0].id, inductor[0][0].id]
    assert [v.options for v in registry.variants_of(current)][-1] == {"mode": "max"}

    registry.delete_model(mlp.name)  # the earlier job, no longer its variant's, goes too
    with pytest.raises(NotFoundError):
        registry.add_variants(current, [("onnxruntime", {"x": 1}, HOST)], [])
    assert registry.store.list_docs("variant") == [] and registry.store.list_docs("job") == []


def test_a_request_that_died_midway_is_finished_by_the_next(tmp_path: Path) -> None:
    """A request claimed its jobs and died before its other writes: while the claims are
    fresh the next request leaves them to their owner, still at work for all it knows; once
    they are stale it finishes them, and then the version lists the variant once."""
    registry = Registry(LocalStore(tmp_path / "store"))
    mlp = MODELS["mlp"]
    version, tvm = rejected_tvm(registry, mlp, HOST, BASELINE, "job-0")
    ort = ("onnxruntime", {}, HOST)
    [(new, new_job), (_, retry_job)] = registry.add_variants(version, [ort], [tvm])
    # Undo all but the claims: the state a request killed right after them leaves.
    registry.store.delete_doc("variant", new.id)
    registry.update_variant("tvm", status=VariantStatus.rejected, job_id="job-0")
    registry.store.put_doc("version", version_id(mlp.name, 1), version.model_dump(mode="json"))

    assert registry.add_variants(version, [ort], [tvm]) == []
    for job in (new_job, retry_job):
        registry.store.update_doc("job", job.id, {"created_at": job.created_at - CLAIM_S - 1})
    finished = registry.add_variants(version, [ort], [tvm])
    assert [(v.id, j.id) for v, j in finished] == [(new.id, new_job.id), ("tvm", retry_job.id)]
    current = registry.get_version(mlp.name, 1)
    assert current.variant_ids == ["torchscript", "tvm", new.id]
    assert [(v.status, v.job_id) for v in registry.variants_of(current)][1:] == [
        (VariantStatus.queued, retry_job.id),
        (VariantStatus.queued, new_job.id),
    ]
    # Finished, the claims are no longer abandoned: a further request adds nothing.
    assert registry.add_variants(current, [ort], []) == []


def test_a_compile_shows_its_baseline_on_the_torchscript_it_was_timed_against(tmp_path: Path) -> None:
    """A GPU variant is timed against TorchScript on its GPU, a CPU one against TorchScript on the
    CPU: each job's numbers go to that TorchScript variant's row, never to the other's."""
    registry = Registry(LocalStore(tmp_path / "store"))
    mlp = MODELS["mlp"]
    targets = {"cpu-ts": ("torchscript", "any"), "gpu-ts": ("torchscript", "cuda-sm90")}
    targets |= {"gpu-tvm": ("tvm", "cuda-sm90"), "cpu-tvm": ("tvm", HOST)}

    def plan(name: str, number: int) -> tuple[list[VariantRecord], list[JobRecord]]:
        return [
            VariantRecord(id=i, model=name, version=number, backend=b, target=t, status=VariantStatus.ready)
            for i, (b, t) in targets.items()
        ], []

    registry.create_version(ModelConfig.model_validate(mlp.config()), "0" * 64, [], plan)

    def finish(variant_id: str, baseline: dict[int, float]) -> dict[str, dict[int, float]]:
        backend, target = targets[variant_id]
        job = JobRecord(
            id="j", variant_id=variant_id, model=mlp.name, version=1, backend=backend, target=target
        )
        record = ArtifactRecord(
            key="k",
            backend=backend,
            target=target,
            size=1,
            compile_s=1,
            max_abs_error=0,
            latency_ms_by_batch=baseline,
            baseline_latency_ms_by_batch=baseline,
        )
        _record_baseline(registry, job, record)
        variants = registry.variants_of(registry.get_version(mlp.name, 1))
        return {v.id: v.latency_ms_by_batch for v in variants if v.backend == "torchscript"}

    assert finish("gpu-tvm", {1: 1.5}) == {"cpu-ts": {}, "gpu-ts": {1: 1.5}}
    assert finish("cpu-tvm", {1: 9.0}) == {"cpu-ts": {1: 9.0}, "gpu-ts": {1: 1.5}}


def test_an_output_recorded_before_batched_was_told_leads_with_the_batch_where_it_has_minus_1() -> None:
    """Such a record's -1 first was the batch's alone: its version batches as it did."""
    assert OutputInfo.model_validate({"name": "o", "dtype": "float32", "shape": [-1, 10]}).batched
    assert not OutputInfo.model_validate({"name": "o", "dtype": "float32", "shape": [8, -1]}).batched
    assert not OutputInfo.model_validate({"name": "o", "dtype": "float32", "shape": []}).batched
