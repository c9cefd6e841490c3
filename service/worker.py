"""`kiln worker`: consume the compile queue of every target this host has, and announce them."""

from __future__ import annotations

import logging
import os
import signal
import threading

import dramatiq
from prometheus_client import start_http_server

from compiler.backends import availability
from compiler.threads import set_threads
from service import scratch
from service.jobs import this_worker
from service.log_settings import LogControl
from service.periodic import Periodic
from service.queue import DramatiqQueue, declare_actor, make_broker, queue_name
from service.records import WorkerRecord, now
from service.redelivery import Redelivery
from service.registry import Registry
from service.settings import Settings
from service.store import StoreUnavailableError, open_store

log = logging.getLogger("kiln.worker")


def serve_metrics(port: int) -> None:
    """Compile durations and cache hits are counted in this process, not in any API's."""
    try:
        start_http_server(port)
    except OSError as exc:  # a second worker on one host: compiling matters more than metrics
        log.warning("worker metrics not served: port %d: %s", port, exc)
        return
    log.info("worker metrics on :%d/metrics", port)


class Heartbeat(Periodic):
    """Announces this worker's targets (and its backends' availability on each) every few
    seconds, so uploads with targets ["auto"] compile for them; withdraws them on a clean stop."""

    def __init__(self, registry: Registry, targets: list[str], interval_s: float) -> None:
        super().__init__("kiln-heartbeat", interval_s)
        self.registry = registry
        # Computed once: it imports every backend, and what is installed does not change.
        self.record = WorkerRecord(
            id=this_worker(), targets=targets, backends={t: availability(t) for t in targets}
        )

    def start(self) -> None:
        self.run_once()  # before consuming: the first upload after start already sees us
        super().start()

    def run_once(self) -> None:
        self.record.last_seen = now()
        try:
            self.registry.announce_worker(self.record)
        except StoreUnavailableError as exc:  # the queue notices the outage too; keep beating
            log.warning("heartbeat not stored: %s", exc)

    def stop(self, wait_s: float | None = None) -> None:
        super().stop(wait_s)
        try:
            self.registry.remove_worker(self.record.id)
        except StoreUnavailableError as exc:  # the doc goes stale instead
            log.warning("heartbeat not withdrawn: %s", exc)


def run_worker(settings: Settings) -> None:
    if settings.embedded:
        raise SystemExit("kiln worker needs KILN_REDIS_URL; embedded `kiln serve` compiles itself")
    set_threads(settings.threads)
    scratch.sweep()  # what a worker killed mid-compile left on the disk
    registry = Registry(open_store(settings))
    broker = make_broker(settings)
    # Set by SIGTERM or Ctrl-C: compiles under way stop, and their jobs go back to the queue.
    stop = threading.Event()
    declare_actor(broker, registry, settings, stop)
    targets = settings.host_targets()
    queues = {queue_name(t) for t in targets}
    for name in queues:
        broker.declare_queue(name)
    worker = dramatiq.Worker(broker, queues=queues, worker_threads=settings.compile_workers)
    # Dramatiq takes twice its threads' messages: a worker busy with an hour of tuning held the
    # next job that long while other workers sat idle.
    worker.queue_prefetch = settings.compile_workers

    def on_signal(*_: object) -> None:
        if stop.is_set():  # a second: at once (the compile children die with this process)
            os._exit(1)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    if settings.worker_metrics_port:
        serve_metrics(settings.worker_metrics_port)
    heartbeat = Heartbeat(registry, targets, settings.worker_heartbeat_s)
    for target, backends in heartbeat.record.backends.items():
        for name, reason in backends.items():
            log.info("target %s: %s %s", target, name, "available" if reason is None else reason)
    redelivery = Redelivery(registry, DramatiqQueue(settings, broker), settings.queue_requeue_s)
    logs = LogControl(registry.store, settings.log_format, settings.route_ttl_s)
    logs.run_once()
    worker.start()
    heartbeat.start()
    redelivery.start()
    logs.start()
    log.info("worker %s consuming %s", heartbeat.record.id, sorted(queues))
    stop.wait()
    log.info("worker stopping")
    logs.stop()
    redelivery.stop()
    worker.stop(timeout=int(settings.shutdown_timeout_s * 1000))
    heartbeat.stop()  # withdrawn once nothing compiles here
    broker.close()
