"""`kiln worker`: consume the compile queue of every target this host has."""

from __future__ import annotations

import logging
import signal
import threading

import dramatiq
from prometheus_client import start_http_server

from compiler.hardware import local_targets
from compiler.threads import set_threads
from service.queue import declare_actor, make_broker, queue_name
from service.registry import Registry
from service.settings import Settings
from service.store import open_store

log = logging.getLogger("kiln.worker")


def serve_metrics(port: int) -> None:
    """Compile durations and cache hits are counted in this process, not in any API's."""
    try:
        start_http_server(port)
    except OSError as exc:  # a second worker on one host: compiling matters more than metrics
        log.warning("worker metrics not served: port %d: %s", port, exc)
        return
    log.info("worker metrics on :%d/metrics", port)


def run_worker(settings: Settings) -> None:
    if settings.embedded:
        raise SystemExit("kiln worker needs KILN_REDIS_URL; embedded `kiln serve` compiles itself")
    set_threads(settings.threads)
    registry = Registry(open_store(settings))
    broker = make_broker(settings)
    declare_actor(broker, registry, settings)
    queues = {queue_name(t) for t in local_targets()}
    for name in queues:
        broker.declare_queue(name)
    worker = dramatiq.Worker(broker, queues=queues, worker_threads=settings.compile_workers)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if settings.worker_metrics_port:
        serve_metrics(settings.worker_metrics_port)
    worker.start()
    log.info("worker consuming %s", sorted(queues))
    stop.wait()
    log.info("worker stopping")
    worker.stop()
    broker.close()
