"""One Settings object, read from KILN_* environment variables."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from compiler.hardware import local_targets
from compiler.race import RACE_ROUNDS
from compiler.threads import available_cpus
from service.records import MAX_BATCH_SIZE, BackendRequest, as_requests, backends_problem


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="KILN_", env_file=None)

    # Redis mode when set; embedded mode (local disk + SQLite + in-process pool) otherwise.
    redis_url: str | None = None
    data_dir: Path = Path("~/.local/share/kiln").expanduser()

    # Comma-separated `key:scope` pairs, scope in {admin, infer}. Empty: open, with a warning.
    api_keys: str = ""

    max_upload_mb: int = Field(default=512, ge=1)
    # A JSON inference request, decompressed: parsed, it takes 10 to 15 times its size in memory
    # (a 130 KB gzip body of 128 MiB of JSON took 1.7 GB), where binary tensors take their own;
    # nested a number a list, 37 times (30 MB of `[[0], [0], ...]` took 1.1 GB more).
    max_json_mb: int = Field(default=32, ge=1)
    compile_timeout_s: float = Field(default=600.0, gt=0)
    compile_memory_mb: int = Field(default=8192, ge=1)
    # A tuned compile may take compile_timeout_s plus this much per MetaSchedule trial
    # (ResNet-18 on 2 cores: 3.1 s per trial on one box, 4.9 s on another).
    tuning_s_per_trial: float = Field(default=6.0, ge=0)
    validate_timeout_s: float = Field(default=120.0, gt=0)
    # Uploads whose model is checked at once, each in a child allowed compile_memory_mb; the
    # others wait their turn rather than take the host's memory together.
    upload_checks: int = Field(default=2, ge=1)
    # Interleaved rounds in which a worker re-times a version's ready variants for its target
    # together, each time one of them turns ready (service.races); 0: compile-time numbers only.
    race_rounds: int = Field(default=RACE_ROUNDS, ge=0, le=50)
    # Compile jobs run concurrently in embedded mode, and per `kiln worker` process.
    compile_workers: int = Field(default=1, ge=1)

    # Intra-op threads for every runtime (torch, TVM): set once so runtimes compare fairly
    # and the server does not oversubscribe cores.
    threads: int = Field(default_factory=available_cpus, ge=1)

    # Dramatiq redelivers the job of a dead worker once its heartbeat is this old and a
    # maintenance pass runs; both are set on purpose, the library defaults take minutes.
    queue_heartbeat_timeout_s: float = Field(default=60.0, gt=0)
    # How often one worker looks for jobs whose message the broker lost (service.redelivery), or in
    # embedded mode one process for jobs that no live process holds; and how old such a job must
    # be: far longer than an API takes from recording a job to enqueueing it.
    queue_requeue_s: float = Field(default=30.0, gt=0)
    queue_namespace: str = "kiln"

    # The Open Inference Protocol over gRPC, beside HTTP, on Triton's port (0: off). `kiln serve`
    # binds it on its own --host, and under --workers N lets the N processes share it.
    grpc_port: int = Field(default=8001, ge=0, le=65535)
    grpc_host: str = "127.0.0.1"
    grpc_reuse_port: bool = False

    # Triton's system shared-memory extension, for clients on this host: registering a region
    # gives the server's access to any POSIX shared-memory segment here, so it is opt-in, and
    # registering needs an admin key.
    shared_memory: bool = False

    # Compress a v2 inference response when its request's Accept-Encoding takes gzip or deflate,
    # as Triton does; httpx and requests send that by default, and a tensor of floats shrinks
    # by about a tenth for the CPU it costs, so a server behind a fast network may turn it off.
    response_compression: bool = True

    # Memory of the response cache, per process, for the models that opt in (0: none cached).
    response_cache_mb: int = Field(default=256, ge=0)
    # How long a replica trusts its cached routing decision before asking the store again.
    route_ttl_s: float = Field(default=1.0, ge=0)
    # How often a process lets go of the versions deleted through another: their runners,
    # statistics and series.
    deletion_sweep_s: float = Field(default=30.0, gt=0.0)
    # Memory budget of loaded runners; the least recently used are evicted past it.
    runtime_max_mb: int = Field(default=4096, ge=0)
    # Models each process loads and warms up as it starts, before it reports ready (Triton's
    # --load-model, TorchServe's --models): names, comma-separated, or "*" for every model.
    # The others load on their first request.
    load_models: str = ""
    # A Triton model repository deployed as the API starts, before it reports ready (tritonserver's
    # --model-repository; KServe's /mnt/models): each model's versions, then loaded and warmed up.
    model_repository: Path | None = None
    # Seconds between looks for model directories that changed there, deployed as they change,
    # and removed ones, unloaded (tritonserver's --repository-poll-secs); 0: only at startup.
    model_repository_poll_s: float = Field(default=0.0, ge=0.0)

    @field_validator("model_repository", mode="before")
    @classmethod
    def _no_repository(cls, value: object) -> object:
        return None if value == "" else value  # KILN_MODEL_REPOSITORY= is unset, not "."

    # Threads that run batches: as many lanes, each batching model on one of them, one batch at
    # a time; and a pool of as many for the requests of models that cannot batch.
    inference_workers: int = Field(default=4, ge=1)
    # FastAPI's OpenTelemetry spans and metrics, for an OTel provider or exporter configured in
    # this process. Off by default: Kiln's metrics are Prometheus, and FastAPI looks up its
    # providers on every request, ~6% of a small model's server CPU.
    opentelemetry: bool = False
    # Server default for models whose config sets no max_queue_delay_us (as in Triton). With 0,
    # requests still merge when they queue behind a running batch.
    max_queue_delay_us: int = Field(default=0, ge=0)
    # Server default for models whose config sets no max_queue_size: requests of one version
    # waiting or running at once in this process, past which new ones get a 503 (0: no limit).
    # Bounded, as TorchServe's job queue is: an overloaded server sheds load at once instead of
    # answering minutes late, after the clients gave up.
    max_queue_size: int = Field(default=1024, ge=0)

    # Hardware targets this process compiles for (a worker) or serves (an API), overriding
    # detection: to pin a worker to some of its targets, or to give test processes on one host
    # different ones (KILN_TARGETS='["cuda-sm90"]'). None: detect (compiler.hardware).
    targets: list[str] | None = Field(default=None, min_length=1)
    # How often `kiln worker` announces its targets; an API counts a worker live for 3 beats.
    worker_heartbeat_s: float = Field(default=5.0, gt=0)

    default_max_batch_size: int = Field(default=8, ge=1, le=MAX_BATCH_SIZE)
    # ONNX Runtime is the CPU bar TVM must beat, and compiles in seconds; inductor is opt-in,
    # as its C++ build takes a minute or more per model on a small host. The backends of an
    # upload that names none: entries as its config.backends takes them, names or
    # {"name", "options"}.
    default_backends: list[str | BackendRequest] = ["tvm", "onnxruntime"]

    @field_validator("default_backends")
    @classmethod
    def _known_backends(cls, backends: list[str | BackendRequest]) -> list[str | BackendRequest]:
        # Checked as an upload's config.backends is, which would otherwise refuse every upload
        # that names no backends. An option that depends on the model's largest batch is checked
        # against the largest any model may have.
        problem = backends_problem(as_requests(backends), MAX_BATCH_SIZE)
        if problem:
            raise ValueError(problem)
        return backends

    # JSON lines for log collectors; text for a person at a terminal.
    log_format: Literal["json", "text"] = "json"
    # uvicorn's line per request. Off by default, as in Triton: at a small model's thousands of
    # requests a second it took about a tenth of the serving process's CPU, and /metrics already
    # counts every request and error.
    access_log: bool = False
    # Told to stop (SIGTERM, Ctrl+C), the API takes no new connections and gives the requests in
    # flight this long to finish, then cancels those still running: a stalled client (a body that
    # never ends) would otherwise hold the shutdown until something kills the process.
    shutdown_timeout_s: int = Field(default=30, ge=1)
    # `kiln worker` serves Prometheus metrics here (its compiles happen in its process); 0: off.
    worker_metrics_port: int = Field(default=9100, ge=0, le=65535)

    @property
    def max_request_bytes(self) -> int:
        """The largest request body, in either protocol."""
        return self.max_upload_mb * 1024 * 1024

    @property
    def max_json_bytes(self) -> int:
        """The largest JSON inference request, decompressed (a binary one's JSON header too)."""
        return min(self.max_json_mb, self.max_upload_mb) * 1024 * 1024

    @property
    def embedded(self) -> bool:
        return not self.redis_url

    def host_targets(self) -> list[str]:
        return list(self.targets) if self.targets is not None else local_targets()


@functools.cache
def get_settings() -> Settings:
    return Settings()
