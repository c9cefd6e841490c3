"""Compile-job queues: Dramatiq on Redis for clusters, an in-process pool for embedded mode.

Queues are named by target, so a job only ever reaches a worker with matching hardware.
"""

from __future__ import annotations

import enum
import fcntl
import hashlib
import logging
import threading
from collections import Counter
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import NamedTuple, Protocol

import dramatiq
import redis
from dramatiq.broker import Broker, MessageProxy
from dramatiq.brokers.redis import MAINTENANCE_SCALE, RedisBroker
from dramatiq.common import current_millis, dq_name, xq_name
from dramatiq.errors import DecodeError
from dramatiq.message import Message
from dramatiq.middleware import Middleware, MiddlewareError, SkipMessage

from service.jobs import compile_limit_s, run_compile_job, this_worker
from service.races import RACE_TIMEOUT_S
from service.records import SETTLED_JOBS, JobRecord, JobStatus
from service.registry import Registry
from service.sandbox import CANCEL_CHECK_S
from service.settings import Settings
from service.store import StoreUnavailableError
from service.store.redis import CONNECT_TIMEOUT_S, SOCKET_TIMEOUT_S

log = logging.getLogger("kiln.queue")

ACTOR = "compile_variant"
# Beyond the compile child's own limit: what the job does around it (store reads and writes),
# and the race that follows it (service.races).
JOB_MARGIN_S = 120 + RACE_TIMEOUT_S

# A worker claims a message as its run starts, for as long as the run may last. KEYS: the queue's
# message hash, the claim. ARGV: the message's id in the broker, its time limit in ms.
_CLAIM = """
if redis.call('hexists', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('set', KEYS[2], '', 'px', ARGV[2])
return 1
"""

# Drops a fetched message: from its worker's acks, then the queue's message hash; not one that a
# worker claimed, where ARGV[2] is '1'. KEYS: the hash, the acks, the claim. ARGV: the message's
# id, whether a claim keeps it.
_DROP_FETCHED = """
if ARGV[2] == '1' and redis.call('exists', KEYS[3]) == 1 then return 0 end
if redis.call('srem', KEYS[2], ARGV[1]) == 0 then return 0 end
redis.call('hdel', KEYS[1], ARGV[1])
return 1
"""


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
    # A client, not a URL: RedisBroker ignores its connection parameters beside a URL.
    client = redis.Redis.from_url(
        settings.redis_url,
        socket_connect_timeout=CONNECT_TIMEOUT_S,
        socket_timeout=SOCKET_TIMEOUT_S,
        socket_keepalive=True,
    )
    broker = RedisBroker(
        client=client,
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

    broker.add_middleware(Claim(broker))
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


def _claim_key(namespace: str, redis_id: str) -> str:
    return f"{namespace}:claimed.{redis_id}"


class UnclaimedError(MiddlewareError):
    """A message whose claim Redis did not answer: not run, it fails, for Retries to send again."""


class Claim(Middleware):
    """Claims each message as its run starts, so that `DramatiqQueue.held` can tell a message that
    a worker fetched but never received from one whose run is about to mark its job running.

    A fetch that times out on a hung Redis runs once Redis resumes: the message moves to the
    worker's acks, the worker never sees it, and its heartbeat stays fresh, so Dramatiq never gives
    it back. `held` drops it, and its job is enqueued again. Neither the job record nor an age can
    tell it from a message that a worker did receive: a job stays queued until its run's first
    write, and Redis has no time of fetch. Nor does a fetched message start at once: each of a
    worker's queues (one per target) prefetches KILN_COMPILE_WORKERS messages for the threads that
    they share. The claim can: Redis runs it and `held`'s drop one after the other, so either the
    claim comes first and the message is kept, or the drop does and this run is skipped, for the
    message enqueued in its place. The job runs once, either way."""

    def __init__(self, broker: RedisBroker) -> None:
        self.namespace = broker.namespace
        self._claim = broker.client.register_script(_CLAIM)

    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        redis_id = message.options["redis_message_id"]
        # As Dramatiq's TimeLimit reads it: past it, the run is stopped.
        limit_ms = (
            message.options.get("time_limit") or broker.get_actor(message.actor_name).options["time_limit"]
        )
        try:
            claimed = self._claim(
                keys=[f"{self.namespace}:{message.queue_name}.msgs", _claim_key(self.namespace, redis_id)],
                args=[redis_id, int(limit_ms)],
            )
        except redis.RedisError as exc:  # unclaimed, the run could be dropped and run twice
            raise UnclaimedError(f"message {redis_id} not claimed: {exc}") from exc
        if not claimed:
            log.warning("job %s: its message was dropped as never received; not run", message.args[0])
            raise SkipMessage(f"message {redis_id} was dropped")


class Drop(enum.Enum):
    """Why `DramatiqQueue.look` dropped a message."""

    overdue = enum.auto()  # a retry its worker lost
    unreceived = enum.auto()  # fetched into a live worker's acks, and no run claimed it
    settled = enum.auto()  # its job settled, its ack lost


class Holdings(NamedTuple):
    """What `DramatiqQueue.look` found: the jobs whose message the broker holds, and those whose
    message it dropped from a live worker's acks unclaimed (`Claim`), so that their job never ran."""

    held: set[str]
    unreceived: set[str]


class DramatiqQueue:
    def __init__(self, settings: Settings, broker: RedisBroker | None = None) -> None:
        self.settings = settings
        self.broker = broker or make_broker(settings)
        self.declared: set[str] = set()
        self._drop_fetched = self.broker.client.register_script(_DROP_FETCHED)

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

    def held(self, jobs: Iterable[JobRecord]) -> set[str]:
        """The ids of those of `jobs` whose message the broker has (`look`)."""
        return self.look(jobs).held

    def look(self, jobs: Iterable[JobRecord]) -> Holdings:
        """The ids of those of `jobs` whose message the broker has, in the queues of their
        targets: from enqueue until a worker acknowledges it, `{namespace}:{queue}.msgs` holds it,
        and while it waits to be retried, `.DQ.msgs` does (under an id of the broker's, not the
        job's).

        Not one that its worker lost, dropped so that it cannot run beside the job's new message:
        a delayed one `queue_requeue_s` past its due time (Dramatiq's consumer forgets those it
        holds when its connection fails, and leaves them in Redis until its heartbeat dies), or
        one in a live worker's acks that no run claimed (`Claim`), whose job shows no run begun.
        A settled job's message left in a live worker's acks by a lost ack is dropped too: it
        counted in `depth` until that worker stopped. Beside them, the jobs whose message was
        dropped from a live worker's acks unclaimed: no run of theirs began."""
        by_id = {job.id: job for job in jobs}
        client: redis.Redis = self.broker.client
        ns = self.broker.namespace
        names = sorted({queue_name(job.target) for job in by_id.values()})
        queues = [f"{ns}:{q}" for name in names for q in (name, dq_name(name))]
        # One snapshot of both hashes: Dramatiq moves a message between them by adding it to one,
        # then removing it from the other, so it is always in one, but two reads can miss it.
        with client.pipeline(transaction=True) as pipe:
            for queue in queues:
                pipe.hgetall(f"{queue}.msgs")
            pipe.zrangebyscore(
                f"{ns}:__heartbeats__", current_millis() - self.broker.heartbeat_timeout, "+inf"
            )
            *replies, live = pipe.execute()
        # Read after: a message fetched since is in them. Dead workers' are Dramatiq's to give back.
        fetched = self._fetched([worker.decode() for worker in live], names)
        held: set[str] = set()
        unreceived: set[str] = set()
        for queue, messages in zip(queues, replies, strict=True):
            for key, data in messages.items():
                try:
                    message = Message.decode(data)
                    job_id = message.args[0]
                except (DecodeError, IndexError):  # not a compile job's message
                    log.warning("queue message %r is not a compile job's; ignored", data[:200])
                    continue
                redis_id = key.decode()
                drop = self._dropped(queue, redis_id, message, by_id.get(job_id), fetched.get(redis_id))
                if drop is None:
                    held.add(job_id)
                elif drop is Drop.unreceived:
                    unreceived.add(job_id)
        return Holdings(held, unreceived - held)

    def _fetched(self, workers: list[str], names: list[str]) -> dict[str, str]:
        """The ids of the messages in the acks of `workers` for the queues `names`, each with the
        key of the acks that hold it."""
        ns = self.broker.namespace
        keys = [f"{ns}:__acks__.{worker}.{name}" for worker in workers for name in names]
        with self.broker.client.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.smembers(key)
            members: list[set[bytes]] = pipe.execute()
        return {redis_id.decode(): key for key, ids in zip(keys, members, strict=True) for redis_id in ids}

    def _dropped(
        self, queue: str, redis_id: str, message: Message[None], job: JobRecord | None, acks: str | None
    ) -> Drop | None:
        """Why the message, lost by its worker, is dropped now (`look`); None if it is kept."""
        eta = message.options.get("eta")  # in ms; only a delayed message has one
        if isinstance(eta, int | float):
            overdue_ms = current_millis() - int(self.settings.queue_requeue_s * 1000)
            if eta >= overdue_ms or not _drop(self.broker.client, queue, redis_id):
                return None
            late_s = (current_millis() - eta) / 1000
            log.warning(
                "job %s: its retry, due %.0f s ago, was lost by its worker; dropped", message.args[0], late_s
            )
            return Drop.overdue
        if acks is None or job is None:
            return None
        settled = job.status in SETTLED_JOBS
        # A run's first write marks its job running, and nothing marks it queued again.
        if not settled and (job.status != JobStatus.queued or job.worker is not None):
            return None
        claim = _claim_key(self.broker.namespace, redis_id)
        if not self._drop_fetched(keys=[f"{queue}.msgs", acks, claim], args=[redis_id, int(not settled)]):
            return None
        lost = "settled, its ack lost" if settled else "its message fetched but never received"
        log.warning("job %s: %s, in %s; dropped", job.id, lost, acks)
        return Drop.settled if settled else Drop.unreceived

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
