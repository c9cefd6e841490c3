"""Every Prometheus series Kiln exports, in one place, and the scrape that renders them.

The API serves them at /metrics; `kiln worker` serves its own (compiles run in its process) on
`KILN_WORKER_METRICS_PORT`. With PROMETHEUS_MULTIPROC_DIR set before start, every uvicorn worker
writes its samples there and a scrape of any one of them aggregates all (prometheus_client's
multiprocess mode); the per-process `process_*` series are then left out.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Collection, Iterator, Mapping
from pathlib import Path

import psutil
from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

log = logging.getLogger("kiln.metrics")

# No `*_created` series: no query here reads them, and they would double every scrape.
disable_created_metrics()

REQUEST_SECONDS = Histogram(
    "kiln_request_duration_seconds",
    "Time to answer a prediction, from routing to outputs (loading a runner included), "
    "by model, version and the backend and target of the variant that ran it (`any`: TorchScript "
    "on the CPU; backend `cache` and no target: the response cache answered).",
    ["model", "version", "backend", "target"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
QUEUE_SECONDS = Histogram(
    "kiln_queue_duration_seconds",
    "Time a prediction waited, from reaching its model's batcher until its batch began to run: "
    "the share of latency that load and the batching delay add, by model.",
    ["model"],
    buckets=(0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
BATCH_SIZE = Histogram(
    "kiln_batch_size",
    "Samples per model execution after dynamic batching merged concurrent requests.",
    ["model"],
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096),
)
COMPILE_SECONDS = Histogram(
    "kiln_compile_duration_seconds",
    "Wall time of a sandboxed compile with its verification and benchmark, by backend and "
    "outcome (ready, failed, rejected). Artifact-cache hits compile nothing and are not here.",
    ["backend", "outcome"],
    buckets=(1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 3600),
)
RACE_SECONDS = Histogram(
    "kiln_race_duration_seconds",
    "Wall time of a race, a version's ready variants for one target re-timed side by side, by "
    "outcome: raced, or failed (the variants keep their compile-time numbers).",
    ["outcome"],
    buckets=(1, 2.5, 5, 10, 20, 30, 60, 120, 300),
)
for _outcome in ("raced", "failed"):  # both series exist from the start, for rate() and alerts
    RACE_SECONDS.labels(_outcome)
PENDING_REQUESTS = Gauge(
    "kiln_pending_requests",
    "Inference requests waiting for or in a batch, by model: what max_queue_size bounds.",
    ["model"],
    multiprocess_mode="livesum",
)
CACHE_HITS = Counter(
    "kiln_artifact_cache_hits",
    "Compile jobs answered from the artifact cache: identical work done before, anywhere.",
    ["backend"],
)
CACHE_MISSES = Counter(
    "kiln_artifact_cache_misses",
    "Compile jobs that found no artifact and compiled.",
    ["backend"],
)
# livesum: in multiprocess mode, the sum over the live uvicorn workers of one replica.
LOADED_RUNNERS = Gauge(
    "kiln_loaded_runners",
    "Runners (model variants) loaded in the runtime's LRU cache.",
    multiprocess_mode="livesum",
)
LOADED_BYTES = Gauge(
    "kiln_loaded_runner_bytes",
    "Artifact bytes (weights and code) of the loaded runners: what the LRU budget counts.",
    multiprocess_mode="livesum",
)
HTTP_ERRORS = Counter(
    "kiln_http_errors",
    "Responses with status >= 400, by status code and route template ('unmatched' when no route matched).",
    ["code", "route"],
)
RESPONSE_CACHE = Counter(
    "kiln_response_cache_lookups",
    "Answered requests of models with a response cache, by model and result (hit: answered from memory).",
    ["model", "result"],
)
GRPC_ERRORS = Counter(
    "kiln_grpc_errors",
    "gRPC calls that ended in an error, and requests of a ModelStreamInfer stream answered with "
    "one, by status code and method.",
    ["code", "method"],
)


def _triton(name: str, documentation: str, labels: tuple[str, ...] = ("model", "version")) -> Gauge:
    """One of Triton's own series, by its name in Triton's metrics documentation, so that the
    dashboards, alerts and autoscaling rules written for Triton read Kiln unchanged. A Gauge
    that only grows, rather than a Counter, to which prometheus-client would add `_total`: rate()
    reads it as Triton's counter. Summed over the worker processes, dead ones included."""
    return Gauge(name, documentation, list(labels), multiprocess_mode="sum")


# Fed by service.stats, which keeps the same numbers for Triton's statistics extension.
NV_REQUEST_SUCCESS = _triton(
    "nv_inference_request_success", "Successful inference requests, all batch sizes."
)
NV_REQUEST_FAILURE = _triton(
    "nv_inference_request_failure",
    "Failed inference requests, all batch sizes, by reason: REJECTED (a full queue, or a timeout "
    "that expired in it), CANCELED (the client left), BACKEND (the model failed), OTHER.",
    ("model", "version", "reason"),
)
NV_INFERENCE_COUNT = _triton("nv_inference_count", "Inferences performed: a batch of n counts n.")
NV_EXEC_COUNT = _triton("nv_inference_exec_count", "Model executions: batches run.")
NV_REQUEST_US = _triton(
    "nv_inference_request_duration_us",
    "Cumulative time of successful requests, from after their inputs' check to their outputs "
    "(cache hits included).",
)
NV_QUEUE_US = _triton(
    "nv_inference_queue_duration_us", "Cumulative time requests waited for their batch to run."
)
NV_COMPUTE_INPUT_US = _triton(
    "nv_inference_compute_input_duration_us", "Cumulative time preparing the inputs of requests' batches."
)
NV_COMPUTE_INFER_US = _triton(
    "nv_inference_compute_infer_duration_us", "Cumulative time running the model on requests' batches."
)
NV_COMPUTE_OUTPUT_US = _triton(
    "nv_inference_compute_output_duration_us",
    "Cumulative time splitting requests' outputs from their batches.",
)
# Fed by the batcher (service.runtime): the statistics extension has no such number.
NV_PENDING = Gauge(
    "nv_inference_pending_request_count",
    "Inference requests waiting to run: for their model's runner to load, then from their arrival "
    "at the model's queue until they start to run, or are answered without.",
    ["model", "version"],
    multiprocess_mode="livesum",
)
NV_CACHE_HITS = _triton("nv_cache_num_hits_per_model", "Requests answered from the response cache.")
NV_CACHE_MISSES = _triton("nv_cache_num_misses_per_model", "Response-cache lookups that found nothing.")
NV_CACHE_HIT_US = _triton(
    "nv_cache_hit_duration_per_model", "Cumulative time of response-cache hits' lookups."
)
NV_CACHE_MISS_US = _triton(
    "nv_cache_miss_duration_per_model", "Cumulative time of response-cache misses' lookups and insertions."
)
# The series of a model's versions, and of the model alone: they go when those are deleted.
BY_VERSION: tuple[Gauge | Histogram | Counter, ...] = (
    REQUEST_SECONDS,
    NV_REQUEST_SUCCESS,
    NV_REQUEST_FAILURE,
    NV_INFERENCE_COUNT,
    NV_EXEC_COUNT,
    NV_REQUEST_US,
    NV_QUEUE_US,
    NV_COMPUTE_INPUT_US,
    NV_COMPUTE_INFER_US,
    NV_COMPUTE_OUTPUT_US,
    NV_PENDING,
    NV_CACHE_HITS,
    NV_CACHE_MISSES,
    NV_CACHE_HIT_US,
    NV_CACHE_MISS_US,
)
BY_MODEL: tuple[Gauge | Histogram | Counter, ...] = (
    QUEUE_SECONDS,
    BATCH_SIZE,
    PENDING_REQUESTS,
    RESPONSE_CACHE,
)
QUEUE_DEPTH_HELP = (
    "Compile jobs queued or running and not yet settled, per target queue of this host; read "
    "at scrape time from the job records (embedded) or the queue's messages (Redis)."
)


class QueueDepth:
    """`kiln_queue_depth`, read when scraped: the queue, not this process, holds the truth."""

    def __init__(self, depth: Callable[[], Mapping[str, int]]) -> None:
        self.depth = depth

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily("kiln_queue_depth", QUEUE_DEPTH_HELP, labels=["queue"])
        try:
            for queue, count in sorted(self.depth().items()):
                family.add_metric([queue], count)
        except Exception as exc:  # a scrape must answer even while the queue's Redis is down
            log.warning("queue depth unavailable: %s", exc)
        yield family


def multiprocess() -> bool:
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))


def scrape(queue_depth: Callable[[], Mapping[str, int]]) -> bytes:
    """The text exposition of this process's series (or every worker's) plus the queue depth."""
    registry = CollectorRegistry()
    if multiprocess():
        forget_dead_processes()
        MultiProcessCollector(registry)
    else:
        registry.register(REGISTRY)
    registry.register(QueueDepth(queue_depth))
    return generate_latest(registry)


def replica_runners() -> float:
    """The runners loaded in the other live workers of this replica (in multiprocess mode: the
    livesum a scrape shows); 0 in a process of its own."""
    if not multiprocess():
        return 0.0
    registry = CollectorRegistry()
    forget_dead_processes()
    MultiProcessCollector(registry)
    [described] = LOADED_RUNNERS.describe()
    return registry.get_sample_value(described.name) or 0.0


def forget_dead_processes() -> None:
    """uvicorn kills and replaces a worker that misses its health check, and nothing then marks
    it dead: drop the live gauges of every process that no longer exists."""
    for path in Path(os.environ["PROMETHEUS_MULTIPROC_DIR"]).glob("gauge_live*_*.db"):
        pid = int(path.stem.rpartition("_")[2])
        if not psutil.pid_exists(pid):
            # Another worker's scrape may remove the same files between this one's glob and remove.
            with contextlib.suppress(FileNotFoundError):
                mark_process_dead(pid)


def forget(model: str, versions: Collection[int] | None) -> None:
    """Remove the series of a deleted model (`versions` None) or of some of its versions, as
    Triton removes a model's with it: else every version ever served stays a series. Not in
    multiprocess mode, where prometheus-client cannot remove one (the processes' files keep it
    until they restart)."""
    if multiprocess():
        return
    if versions is None:
        for metric in BY_VERSION + BY_MODEL:
            metric.remove_by_labels({"model": model})
        return
    for number in versions:
        for metric in BY_VERSION:
            metric.remove_by_labels({"model": model, "version": str(number)})


def process_exiting() -> None:
    """Drop this process's live gauges from a multiprocess directory, so they stop counting."""
    if multiprocess():
        mark_process_dead(os.getpid())
