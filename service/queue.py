"""Compile-job queues: Dramatiq on Redis for clusters, an in-process pool for embedded mode.

Queues are named by target, so a job only ever reaches a worker with matching hardware.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import threading
from collections import Counter
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Protocol

import dramatiq
import redis
from dramatiq.brokers.redis import MAINTENANCE_SCALE, RedisBroker
from dramatiq.common import current_millis, dq_name, xq_name
from dramatiq.errors import DecodeError
from dramatiq.message import Message

from service.jobs import compile_limit_s, run_compile_job, this_worker
from service.races import RACE_TIMEOUT_S
from service.records import SETTLED_JOBS, JobRecord
from service.registry import Registry
from service.sandbox import CANCEL_CHECK_S
from service.settings import Settings
from service.store import StoreUnavailableError

log = logging.getLogger("kiln.queue")

ACTOR = "compile_variant"
# Beyond the compile child's own limit: what the job does around it (store reads and writes),
# and the race that follows it (service.races).
JOB_MARGIN_S = 120 + RACE_TIMEOUT_S


def queue_name(target: str) -> str:
    return f"compile.{target}"


class JobQueue(Protocol):
    def enqueue(self, job: JobRecord) -> None: ...

    def depth(self, targets: Iterable[str]) -> dict[str, int]:
        """Jobs queued or running, not yet settled, per queue: those of `targets`, and any other
        that holds a job (one that no live worker serves is where jobs pile up)."""
        ...

    def close(self) -> None: ...


# How long closing waits for the compiles under way to stop: their children are asked every
# CANCEL_CHECK_S, then killed.
STOP_S = CANCEL_CHECK_S + 3.0


class EmbeddedQueue:
    """Threads that each drive one sandboxed compile child: a pool of worker processes.

    The queue lives in this process's memory, so a job it takes names this process as its
    `worker`, and the process holds a lock file of that name in the data dir for as long as it
    lives: every process of a data dir can tell a job that another one holds from one that no
    one will run (its process died, or its run failed), which `service.redelivery` takes up."""

    def __init__(self, registry: Registry, settings: Settings) -> None:
        self.registry = registry
        self.settings = settings
        self.pool = ThreadPoolExecutor(settings.compile_workers, thread_name_prefix="kiln-compile")
        self._running: set[Future[None]] = set()
        self._stopping = threading.Event()
        self.worker = this_worker()
        self._held: set[str] = set()
        self._held_lock = threading.Lock()
        self._workers = settings.data_dir / "workers"
        self._workers.mkdir(parents=True, exist_ok=True)
        # Released by the kernel however this process ends. A dead process of the same name
        # (a container restarted, its pids alike) holds it no more. Shared: the queues of one
        # process (tests make several) do not wait for each other.
        self._alive = self._lock_file(self.worker).open("a")
        fcntl.flock(self._alive, fcntl.LOCK_SH)

    def _lock_file(self, worker: str) -> Path:
        return self._workers / f"{hashlib.sha256(worker.encode()).hexdigest()[:32]}.lock"

    def enqueue(self, job: JobRecord) -> None:
        with self._held_lock:  # before the store names this process: its own sweep may read it
            self._held.add(job.id)
        try:
            self.registry.update_job(job.id, worker=self.worker)
        except Exception:  # not held, then: the sweep takes it up
            with self._held_lock:
                self._held.discard(job.id)
            raise
        future = self.pool.submit(self._run, job.id)
        self._running.add(future)
        future.add_done_callback(self._running.discard)

    def _run(self, job_id: str) -> None:
        try:
            run_compile_job(self.registry, self.settings, job_id, self._stopping)
        except Exception:  # a store outage, say: held no more, the next sweep takes it up again
            log.exception("job %s failed unexpectedly; it is tried again", job_id)
        finally:
            with self._held_lock:
                self._held.discard(job_id)

    def holds(self, job: JobRecord) -> bool:
        """Whether a live process of this data dir will run the job: this one, which has it
        queued or running, or another one that is alive."""
        if job.worker == self.worker:
            with self._held_lock:
                return job.id in self._held
        if job.worker is None:
            return False
        try:
            file = self._lock_file(job.worker).open()
        except FileNotFoundError:  # a process of another data dir or host: none here runs it
            return False
        with file:
            try:
                fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            return False

    def depth(self, targets: Iterable[str]) -> dict[str, int]:
        """Counted in the store: each process of `kiln serve --workers N` compiles its own
        uploads' jobs, and a scrape that any one of them answers counts them all."""
        unsettled = Counter(
            doc["target"]
            for doc in self.registry.store.list_docs("job")
            if doc.get("status") not in SETTLED_JOBS
        )
        return {queue_name(t): unsettled[t] for t in {*targets, *unsettled}}

    def close(self) -> None:
        # A compile under way is stopped (its child killed, its scratch space removed) before the
        # store closes, and its job left for the next process to start: a SIGTERM ends the
        # process as soon as the app has stopped, and a compile going on after that wrote to a
        # closed store. The lock file stays held until the process exits, so that no other
        # process takes the job up meanwhile.
        self._stopping.set()
        self.pool.shutdown(wait=False, cancel_futures=True)
        wait(list(self._running), timeout=STOP_S)


def make_broker(settings: Settings) -> RedisBroker:
    """A broker whose maintenance runs on every fetch, so a SIGKILLed worker's jobs come back
    once its heartbeat is `queue_heartbeat_timeout_s` old, not many minutes later."""
    assert settings.redis_url, "the Dramatiq queue needs KILN_REDIS_URL"
    broker = RedisBroker(
        url=settings.redis_url,
        namespace=f"{settings.queue_namespace}-queue",
        heartbeat_timeout=int(settings.queue_heartbeat_timeout_s * 1000),
        maintenance_chance=MAINTENANCE_SCALE,
    )
    return broker


def declare_actor(
    broker: RedisBroker, registry: Registry, settings: Settings, stopping: threading.Event
) -> None:
    def compile_variant(job_id: str) -> None:
        run_compile_job(registry, settings, job_id, stopping)
        if stopping.is_set():
            give_back(job_id)

    def give_back(job_id: str) -> None:
        """A compile stopped as its worker stops: its message is acknowledged as the actor
        returns, so a new one goes out now, for another worker; Redelivery would find the job
        only a while later, and count that as an attempt."""
        job = registry.get_job(job_id)
        if job.status not in SETTLED_JOBS:
            DramatiqQueue(settings, broker).enqueue(job)

    # Compile failures are recorded on the variant and never raise; what raises is
    # transient (a store outage), so a few retries with backoff are right.
    dramatiq.actor(
        actor_name=ACTOR,
        broker=broker,
        max_retries=5,
        min_backoff=1000,
        max_backoff=30000,
        time_limit=int((settings.compile_timeout_s + JOB_MARGIN_S) * 1000),
    )(compile_variant)


class DramatiqQueue:
    def __init__(self, settings: Settings, broker: RedisBroker | None = None) -> None:
        self.settings = settings
        self.broker = broker or make_broker(settings)
        self.declared: set[str] = set()

    def enqueue(self, job: JobRecord) -> None:
        name = queue_name(job.target)
        if name not in self.declared:
            self.broker.declare_queue(name)
            self.declared.add(name)
        # Per message: the actor's own limit would interrupt a tuned compile, allowed more time.
        limit_ms = int((compile_limit_s(self.settings, job) + JOB_MARGIN_S) * 1000)
        message: Message[None] = Message(
            queue_name=name, actor_name=ACTOR, args=(job.id,), kwargs={}, options={"time_limit": limit_ms}
        )
        try:
            self.broker.enqueue(message)
        except redis.RedisError as exc:
            raise StoreUnavailableError(
                f"the compile queue is unreachable ({exc}); the job is recorded, and a worker "
                "enqueues it once the queue is back"
            ) from exc

    def held(self, targets: Iterable[str]) -> set[str]:
        """The ids of the jobs whose message the broker has, in the queues of `targets`: from
        enqueue until a worker acknowledges it, `{namespace}:{queue}.msgs` holds it, and while it
        waits to be retried, `.DQ.msgs` does (under an id of the broker's, not the job's).

        Not a delayed message `queue_requeue_s` past its due time: the worker that fetched it
        lost it. Dramatiq's consumer forgets the delayed messages it holds when its connection
        fails (a Redis restart), and leaves them in Redis, to come back only when that worker's
        heartbeat dies. Such a message is dropped, so that it cannot run again beside the job's
        new message."""
        client: redis.Redis = self.broker.client
        ns = self.broker.namespace
        queues = [f"{ns}:{name}" for t in targets for name in (queue_name(t), dq_name(queue_name(t)))]
        # One snapshot of both hashes: Dramatiq moves a message between them by adding it to one,
        # then removing it from the other, so it is always in one, but two reads can miss it.
        with client.pipeline(transaction=True) as pipe:
            for queue in queues:
                pipe.hgetall(f"{queue}.msgs")
            replies: list[dict[bytes, bytes]] = pipe.execute()
        overdue_ms = current_millis() - int(self.settings.queue_requeue_s * 1000)
        held: set[str] = set()
        for queue, messages in zip(queues, replies, strict=True):
            for redis_id, data in messages.items():
                try:
                    message = Message.decode(data)
                    job_id = message.args[0]
                except (DecodeError, IndexError):  # not a compile job's message
                    log.warning("queue message %r is not a compile job's; ignored", data[:200])
                    continue
                eta = message.options.get("eta")  # in ms; only a delayed message has one
                if (
                    isinstance(eta, int | float)
                    and eta < overdue_ms
                    and _drop(client, queue, redis_id.decode())
                ):
                    late_s = (current_millis() - eta) / 1000
                    log.warning(
                        "job %s: its retry, due %.0f s ago, was lost by its worker; dropped", job_id, late_s
                    )
                else:
                    held.add(job_id)
        return held

    def depth(self, targets: Iterable[str]) -> dict[str, int]:
        """Dramatiq keeps each message in the hash `{namespace}:{queue}.msgs` from enqueue to ack,
        so its size counts queued and running jobs; `.DQ.msgs` holds those waiting to retry. It
        deletes an emptied hash, so those that exist are the queues that hold a job."""
        client: redis.Redis = self.broker.client
        ns = self.broker.namespace
        names = {queue_name(t) for t in targets}
        for key in client.scan_iter(match=f"{ns}:{queue_name('*')}.msgs", count=1000):
            name = key.decode().removeprefix(f"{ns}:").removesuffix(".msgs")
            if not name.endswith(xq_name("")):  # a dead letter's is settled for good
                names.add(name.removesuffix(dq_name("")))
        ordered = sorted(names)
        with client.pipeline(transaction=False) as pipe:
            for name in ordered:
                pipe.hlen(f"{ns}:{name}.msgs")
                pipe.hlen(f"{ns}:{dq_name(name)}.msgs")
            counts = pipe.execute()
        return {name: int(counts[2 * i]) + int(counts[2 * i + 1]) for i, name in enumerate(ordered)}

    def close(self) -> None:
        self.broker.close()


def _drop(client: redis.Redis, queue: str, redis_id: str) -> bool:
    """Drop a delayed message from its queue; whether it was there still (else it has moved on to
    its queue since it was read). Its id stays in its worker's acks, harmless: once that worker's
    heartbeat dies, Dramatiq requeues only the ids whose message the hash still holds."""
    with client.pipeline(transaction=True) as pipe:
        pipe.hdel(f"{queue}.msgs", redis_id)
        pipe.lrem(queue, 0, redis_id)
        dropped, _ = pipe.execute()
    return bool(dropped)
