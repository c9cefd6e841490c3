"""Jobs whose message the broker lost are enqueued again.

An API records a job in the store, then enqueues its message: a crash or a Redis outage between
the two leaves a queued job that no worker will ever see, and the client that retries the upload
is told it is a duplicate. Dramatiq forgets a message too once its retries are spent. So every
`queue_requeue_s`, one worker of the cluster (whichever takes the pass's lock) looks for jobs
whose variant is still to settle and whose message the broker does not hold, and enqueues them.
"""

from __future__ import annotations

import logging
import threading

import redis

from service.jobs import this_worker, unsettled_variant
from service.queue import DramatiqQueue
from service.records import JobRecord, JobStatus, now
from service.registry import Registry
from service.store import StoreUnavailableError

log = logging.getLogger("kiln.redelivery")

LOCK = "requeue-lost.lock"


def requeue_lost(registry: Registry, queue: DramatiqQueue, older_than_s: float) -> list[str]:
    """Enqueue every unsettled job older than `older_than_s` that the broker does not hold; the
    ids of those enqueued. The age leaves alone a job whose API is still on its way to enqueue it."""
    unfinished = (JobRecord.model_validate(doc) for doc in registry.store.list_docs("job"))
    due = [
        job
        for job in unfinished
        if job.status in (JobStatus.queued, JobStatus.running) and now() - job.created_at >= older_than_s
    ]
    held = queue.held({job.target for job in due}) if due else set()
    requeued = []
    for job in due:
        if job.id in held or unsettled_variant(registry, job) is None:
            continue
        log.warning(
            "job %s (%s for %s) has no message in the queue: enqueueing it again",
            job.id,
            job.backend,
            job.target,
        )
        queue.enqueue(job)
        requeued.append(job.id)
    return requeued


class Redelivery:
    """A thread of `kiln worker` that runs `requeue_lost` every `interval_s`, when no other
    worker ran it in that interval: the lock in Redis expires with the interval."""

    def __init__(self, registry: Registry, queue: DramatiqQueue, interval_s: float) -> None:
        self.registry = registry
        self.queue = queue
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kiln-redelivery", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _pass(self) -> None:
        broker = self.queue.broker
        lock = f"{broker.namespace}:{LOCK}"
        try:
            if broker.client.set(lock, this_worker(), nx=True, px=int(self.interval_s * 1000)):
                requeue_lost(self.registry, self.queue, self.interval_s)
        except (StoreUnavailableError, redis.RedisError) as exc:  # the next pass tries again
            log.warning("lost jobs not looked for: %s", exc)
        except Exception:  # a bug: logged, and the thread lives on
            log.exception("looking for lost jobs failed")

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._pass()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
