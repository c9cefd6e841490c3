"""A running compile job watches its variant: deleting the model stops the compile at once, and a
store outage meanwhile does not."""

from __future__ import annotations

import logging
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any

import psutil
import pytest

from compiler.hardware import local_targets
from compiler.pipeline import compile_to_bytes
from service import jobs
from service.jobs import run_compile_job
from service.queue import STOP_S, EmbeddedQueue
from service.records import ArtifactRecord, JobRecord, JobStatus, VariantRecord, VariantStatus
from service.registry import ARTIFACT_BLOB, ModelView, Registry
from service.sandbox import CANCEL_CHECK_S
from service.settings import Settings
from service.store import StoreUnavailableError
from service.store.local import LocalStore
from service.store.redis import RedisStore
from tests.models import MODELS
from tests.registries import ready_version, reference

HOST = local_targets()[0]
BASELINE = {1: 1.0}
# The folder through which the compile child and the test meet: it is run by name in a spawned
# child, so the test tells it where by the environment, which the child inherits.
HANDSHAKE = "KILN_TEST_HANDSHAKE"


def _handshake() -> Path:
    return Path(os.environ[HANDSHAKE])


def compile_when_told(*args: Any) -> tuple[bytes, dict[str, Any]]:
    """`compile_to_bytes` once the test has made a `go` file; its pid written before."""
    (_handshake() / "pid").write_text(str(os.getpid()))
    while not (_handshake() / "go").exists():
        time.sleep(0.05)
    return compile_to_bytes(*args)


def _wait_for(predicate: Callable[[], object], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return bool(predicate())


@pytest.fixture
def handshake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "handshake"
    folder.mkdir()
    monkeypatch.setenv(HANDSHAKE, str(folder))
    monkeypatch.setattr(jobs, "compile_to_bytes", compile_when_told)
    return folder


@pytest.fixture
def registry(tmp_path: Path) -> Registry:
    return Registry(LocalStore(tmp_path / "store"))


def queued_job(registry: Registry) -> JobRecord:
    """An ONNX Runtime job for this host, added to a ready MLP version."""
    mlp = MODELS["mlp"]
    ready_version(registry, mlp, {"torchscript": reference(BASELINE)}, BASELINE)
    [(_, job)] = registry.add_variants(registry.get_version(mlp.name, 1), [("onnxruntime", {}, HOST)], [])
    return job


@pytest.fixture
def worker(
    registry: Registry, handshake: Path, tmp_path: Path
) -> Iterator[Callable[[JobRecord], threading.Thread]]:
    """Start `run_compile_job` for a job in a thread; at the end, let its child go on (or end
    it, where it would otherwise run to its time limit) and wait for the thread."""
    settings = Settings(data_dir=tmp_path / "data", compile_timeout_s=120, race_rounds=0)
    threads: list[threading.Thread] = []

    def start(job: JobRecord) -> threading.Thread:
        thread = threading.Thread(target=run_compile_job, args=(registry, settings, job.id))
        thread.start()
        threads.append(thread)
        return thread

    yield start
    (handshake / "go").touch()
    for thread in threads:
        thread.join(60)
        if thread.is_alive():
            with suppress(ProcessLookupError):
                os.kill(int((handshake / "pid").read_text()), signal.SIGKILL)
            thread.join()


def _child_started(handshake: Path) -> int:
    pid_file = handshake / "pid"
    assert _wait_for(lambda: pid_file.exists() and pid_file.read_text(), 30), "the compile child started"
    return int(pid_file.read_text())


def run_to_ready(registry: Registry, handshake: Path, thread: threading.Thread, job: JobRecord) -> JobRecord:
    """Let the compile under way go on; it must end with its variant ready."""
    (handshake / "go").touch()
    thread.join(120)
    assert not thread.is_alive()
    variant = registry.get_variant(job.variant_id)
    assert variant is not None and variant.status == VariantStatus.ready, variant
    done = registry.get_job(job.id)
    assert done.status == JobStatus.succeeded
    return done


def test_deleting_the_model_stops_its_running_compile(
    registry: Registry,
    handshake: Path,
    worker: Callable[[JobRecord], threading.Thread],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="kiln.jobs")
    job = queued_job(registry)
    thread = worker(job)
    child = _child_started(handshake)
    registry.delete_model(MODELS["mlp"].name)
    thread.join(CANCEL_CHECK_S + 5)
    assert not thread.is_alive(), "the compile of a deleted model went on"
    assert not psutil.pid_exists(child)
    assert f"job {job.id}: its model was deleted while it compiled; stopped the compile" in caplog.text
    # Nothing recorded for the records that went: no failure, no artifact.
    for kind in ("job", "variant", "artifact"):
        assert registry.store.list_docs(kind) == []


def test_a_store_outage_while_it_compiles_does_not_stop_it(
    registry: Registry,
    handshake: Path,
    worker: Callable[[JobRecord], threading.Thread],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    job = queued_job(registry)
    outage = threading.Event()
    failed_reads: list[str] = []
    get_variant = registry.get_variant

    def flaky_get_variant(variant_id: str) -> Any:
        if outage.is_set():
            failed_reads.append(variant_id)
            raise StoreUnavailableError("the store is down")
        return get_variant(variant_id)

    monkeypatch.setattr(registry, "get_variant", flaky_get_variant)
    thread = worker(job)
    _child_started(handshake)
    outage.set()
    seen = _wait_for(lambda: failed_reads, 2 * CANCEL_CHECK_S + 3)
    outage.clear()
    assert seen, "the running compile did not look for its variant during the outage"
    run_to_ready(registry, handshake, thread, job)


def test_progress_the_store_cannot_record_does_not_stop_the_compile(
    registry: Registry,
    handshake: Path,
    worker: Callable[[JobRecord], threading.Thread],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Redis that blinks while a job reports its stages (or an hour of tuning its trials):
    the compile goes on, and only what it showed meanwhile is lost."""
    job = queued_job(registry)
    lost: list[VariantStatus] = []

    def down(job: JobRecord, stage: VariantStatus) -> None:
        lost.append(stage)
        raise StoreUnavailableError("the store is down")

    monkeypatch.setattr(registry, "set_stage", down)
    thread = worker(job)
    _child_started(handshake)
    run_to_ready(registry, handshake, thread, job)
    assert VariantStatus.verifying in lost


def test_a_finished_compile_is_stored_through_a_short_outage(
    registry: Registry,
    handshake: Path,
    worker: Callable[[JobRecord], threading.Thread],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The store is out just as the compile ends: its results are written again a moment later,
    not thrown away for the queue's retry to compile anew."""
    job = queued_job(registry)
    put_artifact, refused = registry.put_artifact, []

    def out_once(record: ArtifactRecord, data: bytes) -> None:
        if not refused:
            refused.append(record.key)
            raise StoreUnavailableError("the store is down")
        put_artifact(record, data)

    monkeypatch.setattr(registry, "put_artifact", out_once)
    failures: list[BaseException] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: failures.append(args.exc_value))
    thread = worker(job)
    _child_started(handshake)
    assert run_to_ready(registry, handshake, thread, job).attempts == 1
    assert failures == [] and refused


def run_now(registry: Registry, handshake: Path, tmp_path: Path, job: JobRecord) -> None:
    """The job's whole run, here: its compile child told to go at once."""
    (handshake / "go").touch()
    run_compile_job(
        registry, Settings(data_dir=tmp_path / "data", compile_timeout_s=120, race_rounds=0), job.id
    )


def no_artifacts(registry: Registry) -> bool:
    return (
        registry.store.list_docs("artifact") == []
        and registry.store.list_blobs(ARTIFACT_BLOB.format(key="")) == []
    )


@pytest.mark.parametrize("finished", ["before the artifact is stored", "after its variant took it"])
def test_a_model_deleted_as_its_compile_stores_its_artifact_leaves_nothing(
    redis_url: str, handshake: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, finished: str
) -> None:
    """The DELETE lands as a worker stores a finished compile: the deletion reads the model while
    the variant has no artifact yet, and removes it before the artifact is stored, or after the
    variant is marked ready with it. Either way the artifact goes with the model."""
    registry = Registry(RedisStore(redis_url))
    job = queued_job(registry)
    name = MODELS["mlp"].name
    viewed, go_on = threading.Event(), threading.Event()
    get_model, put_artifact = registry.get_model, registry.put_artifact

    def view_then_wait(model: str) -> ModelView:
        view = get_model(model)
        viewed.set()
        go_on.wait(60)
        return view

    monkeypatch.setattr(registry, "get_model", view_then_wait)
    deleting = threading.Thread(target=registry.delete_model, args=(name,))

    def deleted_meanwhile(record: ArtifactRecord, data: bytes) -> None:
        if not viewed.is_set():
            deleting.start()
            assert viewed.wait(30)
            if finished.startswith("before"):
                go_on.set()
                deleting.join(30)
        put_artifact(record, data)

    monkeypatch.setattr(registry, "put_artifact", deleted_meanwhile)
    run_now(registry, handshake, tmp_path, job)
    go_on.set()
    deleting.join(30)
    assert not deleting.is_alive() and viewed.is_set()
    for kind in ("version", "variant", "job", "deletion"):
        assert registry.store.list_docs(kind) == [], kind
    assert no_artifacts(registry)


def test_an_artifact_that_an_identical_compile_shares_stays_with_it(
    registry: Registry, handshake: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The artifact's key is its content's: the same model compiled alike under another name
    references it too. A model deleted as its compile stores the artifact leaves it to that one."""
    job = queued_job(registry)
    put_artifact, shared = registry.put_artifact, []

    def deleted_meanwhile(record: ArtifactRecord, data: bytes) -> None:
        shared.append(record.key)
        identical = VariantRecord(
            id="identical",
            model="copy",
            version=1,
            backend="onnxruntime",
            target=HOST,
            status=VariantStatus.ready,
            artifact_key=record.key,
        )
        registry.store.put_doc("variant", identical.id, identical.model_dump(mode="json"))
        registry.delete_model(MODELS["mlp"].name)
        put_artifact(record, data)

    monkeypatch.setattr(registry, "put_artifact", deleted_meanwhile)
    run_now(registry, handshake, tmp_path, job)
    assert [doc["key"] for doc in registry.store.list_docs("artifact")] == shared
    assert registry.get_artifact(shared[0]) is not None


def test_an_artifact_collected_with_an_identical_compile_as_it_is_stored_is_put_back(
    registry: Registry, handshake: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The deletion of another model, whose identical compile had the same artifact, collects
    it between its store and the variant's update: the variant does not take a missing artifact."""
    job = queued_job(registry)
    put_artifact, collected = registry.put_artifact, []

    def collected_meanwhile(record: ArtifactRecord, data: bytes) -> None:
        put_artifact(record, data)
        if not collected:
            collected.append(record.key)
            registry.store.delete_blob(ARTIFACT_BLOB.format(key=record.key))
            registry.store.delete_doc("artifact", record.key)

    monkeypatch.setattr(registry, "put_artifact", collected_meanwhile)
    run_now(registry, handshake, tmp_path, job)
    variant = registry.get_variant(job.variant_id)
    assert variant is not None and variant.status == VariantStatus.ready and variant.artifact_key
    assert registry.get_artifact(variant.artifact_key) is not None


def test_a_cached_artifact_collected_as_it_is_taken_is_compiled_anew(
    registry: Registry, handshake: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An identical compile's artifact, found in the cache and then collected with that compile's
    model before the variant took it: the variant pointed at a missing artifact."""
    job = queued_job(registry)
    version, variant = registry.get_version(job.model, job.version), registry.get_variant(job.variant_id)
    assert variant is not None
    key = jobs.variant_key(version, variant, Settings().threads)
    registry.put_artifact(
        ArtifactRecord(
            key=key,
            backend="onnxruntime",
            target=HOST,
            size=1,
            compile_s=1.0,
            max_abs_error=0.0,
            latency_ms_by_batch={1: 1.0},
            baseline_latency_ms_by_batch={1: 2.0},
        ),
        b"x",
    )
    get_artifact, found = registry.get_artifact, []

    def collected_once_found(wanted: str) -> ArtifactRecord | None:
        record = get_artifact(wanted)
        if record is not None and not found:
            found.append(record)
            registry.collect_artifacts([wanted])  # the other model's deletion, at this moment
        return record

    monkeypatch.setattr(registry, "get_artifact", collected_once_found)
    run_now(registry, handshake, tmp_path, job)
    done = registry.get_variant(job.variant_id)
    assert done is not None and done.status == VariantStatus.ready and done.artifact_key == key
    assert get_artifact(key) is not None and registry.get_job(job.id).cache_hit is False


def test_a_closing_embedded_queue_stops_its_compile_and_leaves_the_job_to_the_next_start(
    registry: Registry, handshake: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server closes its store as it stops, and a SIGTERM ends it as soon as the app has:
    a compile that went on wrote to a closed store, and left its scratch space behind."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    job = queued_job(registry)
    queue = EmbeddedQueue(registry, Settings(data_dir=tmp_path / "data", compile_timeout_s=120))
    queue.enqueue(job)
    child = _child_started(handshake)
    started = time.monotonic()
    queue.close()
    assert time.monotonic() - started < STOP_S + 1
    assert _wait_for(
        lambda: not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE, 5
    )
    assert not [t for t in threading.enumerate() if t.name.startswith("kiln-compile") and t.is_alive()]
    assert list(scratch.iterdir()) == []
    variant = registry.get_variant(job.variant_id)
    assert variant is not None and variant.status not in {VariantStatus.failed, VariantStatus.ready}
    stopped = registry.get_job(job.id)
    assert stopped.status == JobStatus.running  # for redelivery to take up
    assert stopped.attempts == job.attempts  # a restart does not bring its giving up nearer
