"""Jobs whose message the broker lost are enqueued again.

An API records a job in the store, then enqueues its message: a crash or a Redis outage between
the two leaves a queued job that no worker will ever see, and the client that retries the upload
is told it is a duplicate. Dramatiq forgets a message too once its retries are spent. So every
`queue_requeue_s`, one worker of the cluster (whichever takes the pass's lock) looks for jobs
whose variant is still to settle and whose message the broker does not hold, and enqueues them.

Embedded mode has no broker: its queue is in the memory of the processes of `kiln serve`. There,
every `queue_requeue_s`, and as it starts, each process takes up the jobs that no live process
holds: those of a process that died (killed, or the whole server restarted), and those whose run
failed (the store unavailable a moment).
"""

from __future__ import annotations

import logging

import redis
from pydantic import ValidationError

from service.jobs import give_up, settle_behind, this_worker, unsettled_variant
from service.periodic import Periodic
from service.queue import DramatiqQueue, EmbeddedQueue
from service.records import SETTLED_JOBS, TUNING_TRIALS, JobRecord, now
from service.registry import Registry
from service.store import StoreUnavailableError

log = logging.getLogger("kiln.redelivery")

LOCK = "requeue-lost.lock"
EMBEDDED_LOCK = "take-up-unheld"


def requeue_lost(registry: Registry, queue: DramatiqQueue, older_than_s: float) -> list[str]:
    """Enqueue every unsettled job older than `older_than_s` that the broker does not hold; the
    ids of those enqueued. The age leaves alone a job whose API is still on its way to enqueue it.
    Each time counts as one of the job's attempts, so that one whose message keeps going missing
    fails its variant after MAX_ATTEMPTS, as one that keeps killing its worker does; not a job
    whose message `look` dropped from a live worker's acks unclaimed: it never ran, and a busy
    worker's prefetch may hold its message back at every pass. An old job whose variant settled
    without it takes the variant's outcome (`settle_behind`). Settled jobs go to `look` too,
    which drops what their messages left in a worker's acks."""
    lost, settled = [], []
    for doc in registry.store.list_docs("job"):
        try:
            job = JobRecord.model_validate(doc)
            if job.status in SETTLED_JOBS:
                settled.append(job)
            elif _is_lost(registry, job, older_than_s):
                lost.append(job)
            elif _is_old(job, older_than_s):
                settle_behind(registry, job)
        except ValidationError as exc:  # one record that no longer loads must not stop the pass
            log.warning("job %s is not looked at: a record does not load: %s", doc.get("id"), exc)
    # Read after the store, which is slower: a message enqueued meanwhile is seen.
    held, unreceived = queue.look([*lost, *settled])
    requeued = []
    for job in lost:
        if job.id in held:
            continue
        if job.id not in unreceived:
            if give_up(registry, job):
                continue
            registry.update_job(job.id, attempts=job.attempts + 1)
        why = "had its message dropped unreceived" if job.id in unreceived else "has no message in the queue"
        log.warning("job %s (%s for %s) %s: enqueueing it again", job.id, job.backend, job.target, why)
        queue.enqueue(job)
        requeued.append(job.id)
    return requeued


def _is_lost(registry: Registry, job: JobRecord, older_than_s: float) -> bool:
    """Whether the job may have lost its message: old enough, unfinished, and its variant listed
    and still to settle. Not a job whose version does not list its variant: the request that
    claimed it died before its last write, and the next request for the variant takes it over
    (an upload that died leaves no version, and nothing to compile)."""
    return (
        _is_old(job, older_than_s)
        and registry.lists_variant(job)
        and unsettled_variant(registry, job) is not None
    )


def _is_old(job: JobRecord, older_than_s: float) -> bool:
    """Unfinished, and old enough that the request that made it is done with it."""
    return job.status not in SETTLED_JOBS and now() - job.created_at >= older_than_s


def take_up_unheld(registry: Registry, queue: EmbeddedQueue, older_than_s: float) -> list[str]:
    """Enqueue on `queue` every unsettled job that no live process of its data dir holds; the
    ids of those taken up. Call it under the store's lock, or two processes may take one job. A
    job that names no worker is left alone for `older_than_s`: the request that recorded it may
    still be on its way to enqueue it. Each run of a job counts as one of its attempts, so one
    that keeps killing its process fails its variant after MAX_ATTEMPTS. Taken up in the order
    they were made, tuned ones after the others, as an upload queues them: the store lists them
    by their random ids, and quick variants waited behind hours of tuning after a restart."""
    jobs = []
    for doc in registry.store.list_docs("job"):
        try:
            jobs.append(JobRecord.model_validate(doc))
        except ValidationError as exc:
            log.warning("job %s is not looked at: a record does not load: %s", doc.get("id"), exc)
    taken = []
    for job in sorted(jobs, key=lambda j: (bool(j.options.get(TUNING_TRIALS)), j.created_at)):
        if job.status in SETTLED_JOBS or queue.holds(job):
            continue
        if job.worker is None and not _is_old(job, older_than_s):
            continue
        if not registry.lists_variant(job) or unsettled_variant(registry, job) is None:
            settle_behind(registry, job)
            continue
        if give_up(registry, job):
            continue
        log.warning(
            "job %s (%s for %s) is held by no live process (last %s): taking it up",
            job.id,
            job.backend,
            job.target,
            job.worker,
        )
        queue.enqueue(job)
        taken.append(job.id)
    return taken


class EmbeddedRedelivery(Periodic):
    """A thread of each `kiln serve` process in embedded mode that runs `take_up_unheld` every
    `interval_s`, under the data dir's lock."""

    def __init__(self, registry: Registry, queue: EmbeddedQueue, interval_s: float) -> None:
        super().__init__("kiln-redelivery", interval_s)
        self.registry = registry
        self.queue = queue

    def run_once(self) -> None:
        try:
            with self.registry.store.lock(EMBEDDED_LOCK, self.interval_s):
                take_up_unheld(self.registry, self.queue, self.interval_s)
        except StoreUnavailableError as exc:  # the next pass tries again
            log.warning("unheld jobs not looked for: %s", exc)


class Redelivery(Periodic):
    """A thread of `kiln worker` that runs `requeue_lost` every `interval_s`, when no other
    worker ran it in that interval: the lock in Redis expires with the interval."""

    def __init__(self, registry: Registry, queue: DramatiqQueue, interval_s: float) -> None:
        super().__init__("kiln-redelivery", interval_s)
        self.registry = registry
        self.queue = queue

    def run_once(self) -> None:
        """One pass, unless another worker took one in this interval."""
        broker = self.queue.broker
        lock = f"{broker.namespace}:{LOCK}"
        try:
            if broker.client.set(lock, this_worker(), nx=True, px=int(self.interval_s * 1000)):
                requeue_lost(self.registry, self.queue, self.interval_s)
        except (StoreUnavailableError, redis.RedisError) as exc:  # the next pass tries again
            log.warning("lost jobs not looked for: %s", exc)
