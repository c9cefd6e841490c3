"""Jobs whose message never reached the broker, or left it, are enqueued again, once; a job that
keeps ending without settling its variant fails it after MAX_ATTEMPTS deliveries."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dramatiq
import httpx
import pytest
from dramatiq.broker import MessageProxy
from dramatiq.common import dq_name
from dramatiq.message import Message

from service import queue as queue_module
from service.jobs import MAX_ATTEMPTS, run_compile_job
from service.queue import ACTOR, Claim, DramatiqQueue, EmbeddedQueue, declare_actor, make_broker, queue_name
from service.records import JobRecord, JobStatus, VariantRecord, VariantStatus, now
from service.redelivery import Redelivery, requeue_lost, take_up_unheld
from service.registry import Registry, job_for
from service.settings import Settings
from service.store import StoreUnavailableError
from service.store.local import LocalStore
from service.store.redis import RedisStore
from tests.client import by_backend, upload, wait_settled
from tests.models import MODELS
from tests.registries import ready_version, reference, rejected_tvm
from tests.servers import KilnServer, free_port, running, wait_until

HOST = "cpu-x86_64-test-avx2"
BASELINE = {1: 1.0, 8: 8.0}


def test_lost_jobs_are_enqueued_again_once_and_only_those(redis_url: str) -> None:
    registry = Registry(RedisStore(redis_url))
    version, tvm = rejected_tvm(registry, MODELS["mlp"], HOST, BASELINE, "old-job")
    [(_, new_job), (_, retry_job)] = registry.add_variants(version, [("onnxruntime", {}, HOST)], [tvm])
    # The job the retry replaced, never settled: its variant belongs to another job now.
    registry.store.put_doc("job", "old-job", {**retry_job.model_dump(mode="json"), "id": "old-job"})
    queue = DramatiqQueue(Settings(redis_url=redis_url))
    queue.enqueue(retry_job)  # its API enqueued it; new_job's died first

    assert requeue_lost(registry, queue, older_than_s=60) == []  # its API may still be at it
    assert queue.held([new_job, retry_job]) == {retry_job.id}
    assert requeue_lost(registry, queue, older_than_s=0) == [new_job.id]
    assert queue.held([new_job, retry_job]) == {new_job.id, retry_job.id}
    assert requeue_lost(registry, queue, older_than_s=0) == []
    client = queue.broker.client
    assert client.llen(f"{queue.broker.namespace}:compile.{HOST}") == 2  # one message per job
    queue.close()


def test_a_queue_outage_at_enqueue_is_a_503_that_says_the_job_is_kept(redis_url: str) -> None:
    registry = Registry(RedisStore(redis_url))
    mlp = MODELS["mlp"]
    ready_version(registry, mlp, {"torchscript": reference(BASELINE)}, BASELINE)
    [(_, job)] = registry.add_variants(registry.get_version(mlp.name, 1), [("onnxruntime", {}, HOST)], [])
    queue = DramatiqQueue(Settings(redis_url=f"redis://127.0.0.1:{free_port()}/0"))
    with pytest.raises(StoreUnavailableError, match="the job is recorded"):
        queue.enqueue(job)


def test_a_job_that_never_settles_fails_its_variant_after_max_attempts(tmp_path: Path) -> None:
    registry = Registry(LocalStore(tmp_path / "store"))
    mlp = MODELS["mlp"]
    ready_version(registry, mlp, {"torchscript": reference(BASELINE)}, BASELINE)
    [(variant, job)] = registry.add_variants(
        registry.get_version(mlp.name, 1), [("onnxruntime", {}, HOST)], []
    )
    registry.update_job(job.id, status=JobStatus.running, attempts=MAX_ATTEMPTS)
    run_compile_job(registry, Settings(data_dir=tmp_path / "data"), job.id)
    failed = registry.get_variant(variant.id)
    assert failed is not None and failed.status == VariantStatus.failed
    assert failed.error is not None and failed.error.startswith(f"gave up after {MAX_ATTEMPTS} attempts")
    done = registry.get_job(job.id)
    assert (done.status, done.attempts) == (JobStatus.failed, MAX_ATTEMPTS)


def one_lost_job(registry: Registry) -> JobRecord:
    """An ONNX Runtime job added to a ready MLP version, whose API died before enqueueing it."""
    mlp = MODELS["mlp"]
    ready_version(registry, mlp, {"torchscript": reference(BASELINE)}, BASELINE)
    [(_, job)] = registry.add_variants(registry.get_version(mlp.name, 1), [("onnxruntime", {}, HOST)], [])
    return job


def test_a_job_whose_variant_settled_without_it_takes_the_variants_outcome(
    tmp_path: Path, redis_url: str
) -> None:
    """The store failed between the variant's write and the job's: the queue's retry of the job,
    or else a redelivery pass, settles the job as its variant did."""
    registry = Registry(LocalStore(tmp_path / "store"))
    job = one_lost_job(registry)
    registry.update_variant(job.variant_id, status=VariantStatus.ready, cache_hit=True)
    registry.update_job(job.id, status=JobStatus.running, attempts=1)
    run_compile_job(registry, Settings(data_dir=tmp_path / "data"), job.id)
    done = registry.get_job(job.id)
    assert (done.status, done.stage, done.cache_hit, done.attempts) == (
        JobStatus.succeeded,
        VariantStatus.ready,
        True,
        1,
    )
    assert done.finished_at is not None

    registry = Registry(RedisStore(redis_url))
    job = one_lost_job(registry)
    registry.update_variant(job.variant_id, status=VariantStatus.rejected, error="max abs error 3.0")
    queue = DramatiqQueue(Settings(redis_url=redis_url))
    assert requeue_lost(registry, queue, older_than_s=60) == []
    assert registry.get_job(job.id).status == JobStatus.queued  # its request may still be at it
    assert requeue_lost(registry, queue, older_than_s=0) == []
    done = registry.get_job(job.id)
    assert (done.status, done.stage) == (JobStatus.failed, VariantStatus.rejected)
    assert done.error == "max abs error 3.0"
    assert queue.held([done]) == set()
    queue.close()


def test_a_message_waiting_for_its_retry_is_held(redis_url: str) -> None:
    registry = Registry(RedisStore(redis_url))
    job = one_lost_job(registry)
    queue = DramatiqQueue(Settings(redis_url=redis_url))
    name = queue_name(HOST)
    queue.broker.declare_queue(name)
    # As Dramatiq's Retries middleware leaves it: in the delay queue, due in a minute.
    retry = Message(queue_name=name, actor_name=ACTOR, args=(job.id,), kwargs={}, options={})
    queue.broker.enqueue(retry, delay=60_000)
    queue.broker.client.hset(f"{queue.broker.namespace}:{name}.msgs", "junk", b"not a message")
    assert queue.held([job]) == {job.id}
    assert requeue_lost(registry, queue, older_than_s=0) == []
    queue.close()


def test_a_retry_that_its_worker_lost_is_dropped_and_its_job_enqueued_again(redis_url: str) -> None:
    """Dramatiq's consumer forgets the delayed messages it fetched when its connection fails (a
    Redis restart), and leaves them in Redis, in the acks of a worker that lives on: nothing runs
    them until that worker dies. One `queue_requeue_s` past its due time, its job is enqueued
    again, and the message dropped: the worker's death later does not run it a second time."""
    registry = Registry(RedisStore(redis_url))
    job = one_lost_job(registry)
    queue = DramatiqQueue(Settings(redis_url=redis_url, queue_requeue_s=5))
    ns, name = queue.broker.namespace, queue_name(HOST)
    queue.broker.declare_queue(name)
    # As Dramatiq's Retries middleware leaves it, due 10 s ago; a worker fetched it, then forgot it.
    retry = Message(queue_name=name, actor_name=ACTOR, args=(job.id,), kwargs={}, options={})
    queue.broker.enqueue(retry, delay=-10_000)
    assert len(queue.broker.do_fetch(dq_name(name), 1)) == 1
    patient = DramatiqQueue(Settings(redis_url=redis_url, queue_requeue_s=30))
    assert patient.held([job]) == {job.id}  # its worker may be about to move it on
    patient.close()

    assert requeue_lost(registry, queue, older_than_s=0) == [job.id]
    client = queue.broker.client
    assert client.hlen(f"{ns}:{name}.DQ.msgs") == 0 and client.llen(f"{ns}:{name}.DQ") == 0
    assert queue.held([job]) == {job.id}  # its new message
    assert requeue_lost(registry, queue, older_than_s=0) == []
    # The worker that held the retry dies: another worker's maintenance brings nothing back.
    client.zadd(f"{ns}:__heartbeats__", {queue.broker.broker_id: 0})
    survivor = DramatiqQueue(Settings(redis_url=redis_url))
    assert survivor.broker.do_fetch(dq_name(name), 10) == []
    assert client.llen(f"{ns}:{name}") == 1
    survivor.close()
    queue.close()


def test_a_message_whose_fetch_timed_out_is_dropped_and_its_job_enqueued_again(redis_url: str) -> None:
    """A worker's fetch timed out on a hung Redis, which ran it once it resumed: the message sits in
    the acks of a worker that lives on and never had it, and Dramatiq gives it back only when that
    worker dies. Its job, still queued with no worker, is enqueued again once it is old enough,
    and the message dropped: the worker's death later does not run it a second time."""
    registry = Registry(RedisStore(redis_url))
    job = one_lost_job(registry)
    settings = Settings(redis_url=redis_url)
    queue = DramatiqQueue(settings)
    queue.enqueue(job)
    client, ns, name = queue.broker.client, queue.broker.namespace, queue_name(HOST)
    worker = make_broker(settings)
    # Dramatiq's own fetch, whose reply the worker never reads: what a fetch that timed out leaves.
    assert len(worker.do_fetch(name, 1)) == 1
    acks = f"{ns}:__acks__.{worker.broker_id}.{name}"

    assert requeue_lost(registry, queue, older_than_s=60) == []  # its API may still be at it
    assert client.smembers(acks) != set()
    assert requeue_lost(registry, queue, older_than_s=0) == [job.id]
    assert client.smembers(acks) == set()
    assert client.hlen(f"{ns}:{name}.msgs") == client.llen(f"{ns}:{name}") == 1  # its new message
    assert requeue_lost(registry, queue, older_than_s=0) == []
    assert registry.get_job(job.id).attempts == 0  # it never ran
    # The worker dies: another worker's maintenance brings back nothing but the new message.
    client.zadd(f"{ns}:__heartbeats__", {worker.broker_id: 0})
    survivor = make_broker(settings)
    assert len(survivor.do_fetch(name, 10)) == 1
    for broker in (worker, survivor):
        broker.close()
    queue.close()


def test_a_message_held_back_for_a_busy_thread_runs_once_and_one_just_received_is_kept(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker of two targets prefetches KILN_COMPILE_WORKERS messages for each, for threads that
    they share: a message may wait while another job compiles, its job queued with no worker, as
    is the job of a message just received, whose run is still to mark it running. The run that
    began claimed its message, which stays; the waiting one is dropped and its job enqueued again,
    and a thread that frees up skips it: each job runs once. That drop is no attempt of the job's:
    a busy worker may hold a message back at every pass, and its job must not run out of them."""
    registry = Registry(RedisStore(redis_url))
    ready_version(registry, MODELS["mlp"], {"torchscript": reference(BASELINE)}, BASELINE)
    wanted = [(backend, {}, HOST) for backend in ("onnxruntime", "openvino")]
    [(_, first), (_, second)] = registry.add_variants(registry.get_version("mlp", 1), wanted, [])
    settings = Settings(redis_url=redis_url)
    queue = DramatiqQueue(settings)
    for job in (first, second):
        queue.enqueue(job)
    ran: list[str] = []
    free = threading.Event()

    def compile_job(registry: Registry, settings: Settings, job_id: str, stopping: threading.Event) -> None:
        ran.append(job_id)  # and the job's record left as it was: queued, no worker
        free.wait(30)

    monkeypatch.setattr(queue_module, "run_compile_job", compile_job)
    broker = make_broker(settings)
    declare_actor(broker, registry, settings, threading.Event())
    name = queue_name(HOST)
    broker.declare_queue(name)
    worker = dramatiq.Worker(broker, queues={name}, worker_threads=1)
    worker.queue_prefetch = 2  # as each of two targets' queues prefetches one
    acks = f"{broker.namespace}:__acks__.{broker.broker_id}.{name}"
    worker.start()
    try:
        wait_until(lambda: ran == [first.id] and broker.client.scard(acks) == 2, 10, "both messages fetched")
        registry.update_job(second.id, attempts=MAX_ATTEMPTS - 1)
        assert requeue_lost(registry, queue, older_than_s=0) == [second.id]
        assert registry.get_job(second.id).attempts == MAX_ATTEMPTS - 1
        free.set()
        wait_until(lambda: queue.depth([HOST]) == {name: 0}, 10, "both jobs acknowledged")
        assert ran == [first.id, second.id]
    finally:
        free.set()
        worker.stop()
        broker.close()
        queue.close()


def test_a_settled_jobs_message_whose_ack_was_lost_is_dropped(redis_url: str) -> None:
    """The run settled its job, and its ack timed out and never reached Redis: the message stayed
    in its live worker's acks, counted in the queue's depth until that worker stopped."""
    registry = Registry(RedisStore(redis_url))
    job = one_lost_job(registry)
    settings = Settings(redis_url=redis_url)
    queue = DramatiqQueue(settings)
    queue.enqueue(job)
    worker = make_broker(settings)
    declare_actor(worker, registry, settings, threading.Event())
    name = queue_name(HOST)
    [data] = worker.do_fetch(name, 1)
    Claim(worker).before_process_message(worker, MessageProxy(Message.decode(data)))
    registry.update_job(job.id, status=JobStatus.succeeded, worker="w", finished_at=now())
    assert queue.depth([HOST]) == {name: 1}
    assert requeue_lost(registry, queue, older_than_s=0) == []
    assert queue.depth([HOST]) == {name: 0}
    worker.close()
    queue.close()


def test_the_queue_times_out_as_the_store_does_whatever_redis_py_defaults_to(redis_url: str) -> None:
    """redis-py before 8.0 waits forever for a Redis that stopped answering: a worker's fetch, and
    an API's enqueue, would hang on a black-holed connection."""
    broker = make_broker(Settings(redis_url=redis_url))
    store = RedisStore(redis_url)
    connection = broker.client.connection_pool.connection_kwargs
    for timeout in ("socket_connect_timeout", "socket_timeout"):
        assert connection.get(timeout) == store._client.connection_pool.connection_kwargs[timeout]
    assert connection.get("socket_keepalive") is True
    broker.close()


def test_jobs_that_their_requests_may_still_finish_are_left_to_them(redis_url: str) -> None:
    """A job whose version does not list its variant yet (its add-variants request died midway:
    the next request for it takes it over) or has no version at all (its upload died) is not
    enqueued; nor does a record that no longer loads stop the pass."""
    registry = Registry(RedisStore(redis_url))
    lost = one_lost_job(registry)
    for model, variant_id in (("mlp", "unlisted"), ("never-uploaded", "orphan")):
        variant = VariantRecord(
            id=variant_id,
            model=model,
            version=1,
            backend="onnxruntime",
            target=HOST,
            status=VariantStatus.queued,
            job_id=f"{variant_id}-job",
        )
        registry.store.put_doc("variant", variant.id, variant.model_dump(mode="json"))
        registry.store.put_doc(
            "job", variant.job_id, job_for(variant, f"{variant_id}-job").model_dump(mode="json")
        )
    registry.store.put_doc("job", "bad", {"id": "bad", "status": "from a newer Kiln"})
    queue = DramatiqQueue(Settings(redis_url=redis_url))
    assert requeue_lost(registry, queue, older_than_s=0) == [lost.id]
    assert registry.get_job(lost.id).attempts == 1  # the enqueue counts as an attempt
    queue.close()


def test_a_job_whose_message_keeps_going_missing_fails_its_variant(redis_url: str) -> None:
    registry = Registry(RedisStore(redis_url))
    job = one_lost_job(registry)
    registry.update_job(job.id, attempts=MAX_ATTEMPTS - 1)
    queue = DramatiqQueue(Settings(redis_url=redis_url))
    assert requeue_lost(registry, queue, older_than_s=0) == [job.id]
    ns, name = queue.broker.namespace, queue_name(HOST)
    queue.broker.client.delete(f"{ns}:{name}", f"{ns}:{name}.msgs")  # lost once more
    assert requeue_lost(registry, queue, older_than_s=0) == []
    failed = registry.get_variant(job.variant_id)
    assert failed is not None and failed.status == VariantStatus.failed
    assert failed.error is not None and failed.error.startswith(f"gave up after {MAX_ATTEMPTS} attempts")
    assert registry.get_job(job.id).status == JobStatus.failed
    queue.close()


def test_one_worker_per_interval_looks_for_lost_jobs(redis_url: str) -> None:
    registry = Registry(RedisStore(redis_url))
    job = one_lost_job(registry)
    registry.update_job(job.id, created_at=now() - 120)  # older than the interval
    queues = [DramatiqQueue(Settings(redis_url=redis_url)) for _ in range(2)]
    first, second = (Redelivery(registry, queue, interval_s=60) for queue in queues)
    first.run_once()
    held = queues[0].held
    assert held([job]) == {job.id}
    ns, name = queues[0].broker.namespace, queue_name(HOST)
    queues[0].broker.client.delete(f"{ns}:{name}", f"{ns}:{name}.msgs")  # lost again, at once
    second.run_once()  # another worker, in the same interval: the lock is taken
    assert held([job]) == set()
    for queue in queues:
        queue.close()


# What the next runs of `compiles` raise, last first.
FAILURES: list[Exception] = []


@pytest.fixture
def compiles(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The jobs that embedded queues run, in order: a stand-in for the compile (the queue is
    what is tested), which holds its thread until the test ends, as a compile under way does,
    or raises what FAILURES holds."""
    ran: list[str] = []
    done = threading.Event()

    def compile_job(registry: Registry, settings: Settings, job_id: str, stopping: threading.Event) -> None:
        ran.append(job_id)
        if FAILURES:
            raise FAILURES.pop()
        while not (done.wait(0.05) or stopping.is_set()):
            pass

    monkeypatch.setattr(queue_module, "run_compile_job", compile_job)
    yield ran
    done.set()
    FAILURES.clear()


def hold(store: Path, data_dir: Path, job_id: str, holding: Any, close: bool = False) -> None:
    """Another process of the server, which enqueues the job and compiles it until it is killed;
    with `close`, one that is shutting down: its queue closed, the compile still going."""
    registry = Registry(LocalStore(store))
    queue = EmbeddedQueue(registry, Settings(data_dir=data_dir))
    queue.enqueue(registry.get_job(job_id))
    if close:
        queue.close()
    holding.set()
    time.sleep(60)


def test_jobs_are_taken_up_in_the_order_they_were_made_tuned_ones_last(
    tmp_path: Path, compiles: list[str]
) -> None:
    """As an upload queues them: in the store's order, by random id, a restart had quick
    variants wait behind hours of tuning."""
    registry = Registry(LocalStore(tmp_path / "store"))
    ready_version(registry, MODELS["mlp"], {"torchscript": reference(BASELINE)}, BASELINE)
    wanted = [("tvm", {"tuning_trials": 8}, HOST), ("openvino", {}, HOST), ("onnxruntime", {}, HOST)]
    jobs = [job for _, job in registry.add_variants(registry.get_version("mlp", 1), wanted, [])]
    for made, job in enumerate(jobs):
        registry.update_job(job.id, worker="killed-4242", status=JobStatus.running, created_at=1000.0 + made)
    queue = EmbeddedQueue(registry, Settings(data_dir=tmp_path / "data"))
    try:
        tuned, openvino, onnxruntime = jobs
        assert take_up_unheld(registry, queue, older_than_s=0) == [openvino.id, onnxruntime.id, tuned.id]
    finally:
        queue.close()


def test_embedded_jobs_that_no_live_process_holds_are_taken_up_once(
    tmp_path: Path, compiles: list[str]
) -> None:
    """`kiln serve --workers 2`, embedded: a process that dies takes its queue with it. Its jobs,
    and those that no process enqueued, are taken up by one process; not a job that a live
    process has queued or running, nor one that its request may still be enqueueing."""
    registry = Registry(LocalStore(tmp_path / "store"))
    ready_version(registry, MODELS["mlp"], {"torchscript": reference(BASELINE)}, BASELINE)
    wanted = [(backend, {}, HOST) for backend in ("onnxruntime", "openvino", "inductor")]
    [(_, dead), (_, live), (_, fresh)] = registry.add_variants(registry.get_version("mlp", 1), wanted, [])
    registry.update_job(dead.id, worker="killed-4242", status=JobStatus.running, attempts=1)
    settings = Settings(data_dir=tmp_path / "data")
    fork = multiprocessing.get_context("fork")  # with this test's stand-in for a compile
    holding = fork.Event()
    other = fork.Process(target=hold, args=(tmp_path / "store", settings.data_dir, live.id, holding))
    other.start()
    queue = EmbeddedQueue(registry, settings)
    try:
        assert holding.wait(30)
        assert take_up_unheld(registry, queue, older_than_s=60) == [dead.id]
        assert take_up_unheld(registry, queue, older_than_s=60) == []  # now it holds that one
        assert registry.get_job(dead.id).worker == queue.worker
        assert take_up_unheld(registry, queue, older_than_s=0) == [fresh.id]  # its request died
        os.kill(other.pid, signal.SIGKILL)  # type: ignore[arg-type]
        other.join(10)
        assert take_up_unheld(registry, queue, older_than_s=60) == [live.id]
        assert all(queue.holds(registry.get_job(job.id)) for job in (dead, fresh, live))
        assert compiles == [dead.id]  # one compile at a time (KILN_COMPILE_WORKERS), the others queued
    finally:
        other.kill()
        queue.close()


def test_a_compile_that_goes_on_after_its_queue_closed_is_not_taken_up(
    tmp_path: Path, compiles: list[str]
) -> None:
    """A server stopping waits for the compile under way: until its process exits, no other
    process (a sibling, or the server started again) may take the job up and compile it twice."""
    registry = Registry(LocalStore(tmp_path / "store"))
    job = one_lost_job(registry)
    settings = Settings(data_dir=tmp_path / "data")
    fork = multiprocessing.get_context("fork")
    holding = fork.Event()
    stopping = fork.Process(target=hold, args=(tmp_path / "store", settings.data_dir, job.id, holding, True))
    stopping.start()
    queue = EmbeddedQueue(registry, settings)
    try:
        assert holding.wait(30)
        assert take_up_unheld(registry, queue, older_than_s=0) == []
        os.kill(stopping.pid, signal.SIGKILL)  # type: ignore[arg-type]
        stopping.join(10)
        assert take_up_unheld(registry, queue, older_than_s=0) == [job.id]
    finally:
        stopping.kill()
        queue.close()


def test_a_sweep_while_a_job_is_enqueued_leaves_it_to_the_enqueue(
    tmp_path: Path, compiles: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sweep reads the job just as its enqueue has named this process in the store: the
    job is held already, and compiled once."""
    registry = Registry(LocalStore(tmp_path / "store"))
    job = one_lost_job(registry)
    queue = EmbeddedQueue(registry, Settings(data_dir=tmp_path / "data", compile_workers=2))
    swept: list[str] = []
    update_job = registry.update_job

    def then_a_sweep(job_id: str, **fields: Any) -> None:
        update_job(job_id, **fields)
        swept.extend(take_up_unheld(registry, queue, older_than_s=0))

    monkeypatch.setattr(registry, "update_job", then_a_sweep)
    try:
        queue.enqueue(job)
        assert swept == []
        wait_until(lambda: compiles == [job.id], 10, "the compile")
    finally:
        queue.close()


def test_an_embedded_run_that_failed_on_the_store_is_taken_up_again(
    tmp_path: Path, compiles: list[str]
) -> None:
    registry = Registry(LocalStore(tmp_path / "store"))
    job = one_lost_job(registry)
    queue = EmbeddedQueue(registry, Settings(data_dir=tmp_path / "data"))
    try:
        FAILURES.append(StoreUnavailableError("the database is locked (simulated)"))
        queue.enqueue(job)
        wait_until(lambda: not queue.holds(registry.get_job(job.id)), 10, "the failed run to end")
        assert take_up_unheld(registry, queue, older_than_s=60) == [job.id]
        assert queue.holds(registry.get_job(job.id))
        wait_until(lambda: compiles == [job.id, job.id], 10, "the job to run again")
    finally:
        queue.close()


def test_a_compile_whose_server_process_is_killed_is_taken_up_by_another(tmp_path: Path) -> None:
    """`kiln serve --workers 2`, embedded: the process that took an upload, and so its compile,
    is killed with -9 mid-compile. Its sibling (or the process uvicorn starts in its place) takes
    the job up within KILN_QUEUE_REQUEUE_S, and the variant is compiled and ready."""
    env = {"KILN_DATA_DIR": str(tmp_path / "data"), "KILN_QUEUE_REQUEUE_S": "2", "KILN_GRPC_PORT": "0"}
    server = KilnServer(env, tmp_path / "kiln.log", workers=2)
    with running(server):
        with httpx.Client(base_url=server.url, timeout=60) as http:
            made = upload(http, MODELS["mlp"], backends=["tvm"])
            assert made.status_code == 202, made.text
            job_id = by_backend(made.json()["variants"], "tvm")["job_id"]
            job = http.get(f"/v1/jobs/{job_id}").json()
            wait_until(lambda: http.get(f"/v1/jobs/{job_id}").json()["status"] == "running", 60, "compiling")
            os.kill(int(job["worker"].rpartition("-")[2]), signal.SIGKILL)
        with httpx.Client(base_url=server.url, timeout=60) as http:  # not the killed one's connection
            tvm = by_backend(wait_settled(http, "mlp", 1, timeout=240), "tvm")
            assert tvm["status"] == "ready", tvm
            done = http.get(f"/v1/jobs/{job_id}").json()
            assert done["attempts"] == 2 and done["worker"] != job["worker"], done
