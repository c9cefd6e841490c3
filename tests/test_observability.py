"""Observability on a live embedded server: /metrics, job event streams, request ids in JSON logs,
and `kiln upload` following those streams. Real TVM compiles of the test MLP."""

from __future__ import annotations

import asyncio
import glob
import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import httpx
import psutil
import pytest
from httpx_sse import connect_sse
from prometheus_client import REGISTRY, multiprocess
from tritonclient.grpc.service_pb2 import ModelMetadataRequest
from tritonclient.grpc.service_pb2_grpc import GRPCInferenceServiceStub

from service import metrics
from service.errors import (
    ClientGoneError,
    ConflictError,
    DeletedError,
    NotFoundError,
    QueueFullError,
    TimeoutExpiredError,
)
from service.records import JobRecord
from service.stats import Stats, failure_reason
from service.store import StoreUnavailableError
from tests.client import by_backend, infer_body, predict, sample, scrape, upload, value, wait_settled
from tests.models import MODELS, UNCONVERTIBLE
from tests.servers import ROOT, KilnProcess, KilnServer, embedded_server, free_port, wait_until

pytestmark = pytest.mark.timeout(900)

MLP = MODELS["mlp"]
STAGES = ["queued", "compiling", "verifying", "benchmarking", "ready"]
DASHBOARD = ROOT / "deploy" / "grafana" / "kiln-dashboard.json"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KilnServer]:
    # One compile at a time, so that a second job waits, queued, behind the first.
    with embedded_server(
        tmp_path_factory.mktemp("observability"),
        KILN_COMPILE_WORKERS="1",
        KILN_LOG_FORMAT="json",
        KILN_ACCESS_LOG="true",
    ) as srv:
        yield srv


class JobStream(threading.Thread):
    """Reads one job's event stream to its end in the background."""

    def __init__(self, url: str, job_id: str) -> None:
        super().__init__(daemon=True)
        self.url, self.job_id = url, job_id
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.content_type = ""
        self.first = threading.Event()
        self.start()

    def run(self) -> None:
        with (
            httpx.Client(base_url=self.url, timeout=120) as client,
            connect_sse(client, "GET", f"/v1/jobs/{self.job_id}/events") as source,
        ):
            self.content_type = source.response.headers["content-type"]
            for event in source.iter_sse():
                self.events.append((event.event, event.json()))
                self.first.set()
        self.first.set()

    def finish(self, timeout: float) -> list[tuple[str, dict[str, Any]]]:
        self.join(timeout)
        assert not self.is_alive(), f"job {self.job_id}: the stream did not end: {self.events}"
        assert self.content_type.startswith("text/event-stream")
        return self.events

    def stages(self) -> list[str]:
        """Stage events, with repeats folded (an attempts or status change keeps the stage)."""
        stages: list[str] = []
        for name, data in self.events:
            if name == "stage" and (not stages or stages[-1] != data["stage"]):
                stages.append(data["stage"])
        return stages


def job_of(response: httpx.Response, backend: str = "tvm") -> str:
    assert response.status_code in (200, 202), response.text
    job_id: str = by_backend(response.json()["variants"], backend)["job_id"]
    return job_id


def in_order(stages: list[str], order: list[str]) -> bool:
    positions = [order.index(s) for s in stages]
    return positions == sorted(positions)


def test_compile_job_streams_its_stages_in_order(server: KilnServer, http: httpx.Client) -> None:
    compiled = JobStream(server.url, job_of(upload(http, MLP, backends=["tvm"])))
    # Waits behind the MLP's compile; deleting its model ends its stream.
    doomed = JobStream(server.url, job_of(upload(http, UNCONVERTIBLE, name="doomed", backends=["tvm"])))
    assert doomed.first.wait(30)
    assert http.delete("/v1/models/doomed").status_code == 200
    events = doomed.finish(30)
    assert events[0] == (
        "stage",
        {
            "stage": "queued",
            "status": "queued",
            "attempts": 0,
            "error": None,
            "cache_hit": False,
            "tuning": None,
        },
    )
    assert events[-1][0] == "end" and events[-1][1]["reason"] == "deleted"

    events = compiled.finish(600)
    stages = compiled.stages()
    assert stages[0] in ("queued", "compiling") and stages[-1] == "ready", events
    assert "compiling" in stages and in_order(stages, STAGES), stages
    assert events[-1] == ("end", {"reason": "settled", "status": "succeeded", "detail": None})


def test_failing_job_streams_to_failed(server: KilnServer, http: httpx.Client) -> None:
    stream = JobStream(server.url, job_of(upload(http, UNCONVERTIBLE, backends=["tvm"])))
    events = stream.finish(600)
    stages = stream.stages()
    assert stages[-1] == "failed" and in_order(stages[:-1], ["queued", "compiling"]), stages
    final = [data for name, data in events if name == "stage"][-1]
    assert final["status"] == "failed" and final["error"].startswith("tvm: ")
    assert events[-1] == ("end", {"reason": "settled", "status": "failed", "detail": None})


def test_cache_hit_streams_and_unknown_job_is_404(server: KilnServer, http: httpx.Client) -> None:
    stream = JobStream(server.url, job_of(upload(http, MLP, name="mlp-again", backends=["tvm"])))
    events = stream.finish(300)
    assert [d for n, d in events if n == "stage"][-1]["cache_hit"] is True
    assert events[-1][1]["status"] == "succeeded"
    missing = http.get("/v1/jobs/no-such-job/events")
    assert missing.status_code == 404 and "no-such-job" in missing.json()["detail"]


def test_metrics_cover_every_series(server: KilnServer, http: httpx.Client) -> None:
    assert predict(http, MLP.name, sample(MLP, 3)).status_code == 200
    assert http.get("/v1/models/no-such-model").status_code == 404
    assert http.post("/v2/models/no-such-model/infer", json=infer_body(sample(MLP, 1))).status_code == 404
    assert upload(http, MLP, name="mlp-cached", response_cache=True, backends=[]).status_code == 202
    for _ in range(2):
        assert predict(http, "mlp-cached", sample(MLP, 1)).status_code == 200
    with grpc.insecure_channel(server.grpc_address) as channel, pytest.raises(grpc.RpcError):
        GRPCInferenceServiceStub(channel).ModelMetadata(ModelMetadataRequest(name="no-such-model"))
    samples = scrape(http)
    assert value(samples, "kiln_grpc_errors_total", code="NOT_FOUND", method="ModelMetadata") == 1
    assert value(samples, "kiln_response_cache_lookups_total", model="mlp-cached", result="hit") == 1
    # The miss ran TorchScript on the CPU; the hit ran nothing.
    cached = {"name": "kiln_request_duration_seconds_count", "model": "mlp-cached"}
    assert value(samples, **cached, backend="torchscript", target="any") == 1
    assert value(samples, **cached, backend="cache", target="") == 1
    assert value(samples, "kiln_request_duration_seconds_count", model="mlp", version="1") >= 1
    assert value(samples, "kiln_batch_size_count", model="mlp") >= 1
    assert value(samples, "kiln_batch_size_sum", model="mlp") >= 3
    assert value(samples, "kiln_queue_duration_seconds_count", model="mlp") >= 1
    assert value(samples, "kiln_http_errors_total", code="404", route="/v1/models/{name}") >= 1
    # v2 inference, served ahead of the framework's middleware (hot_path), counts its errors too.
    assert value(samples, "kiln_http_errors_total", code="404", route="/v2/models/{name}/infer") == 1
    assert value(samples, "kiln_loaded_runners") >= 1
    assert value(samples, "kiln_loaded_runner_bytes") > 0
    assert value(samples, "process_resident_memory_bytes") > 0
    depth = samples["kiln_queue_depth"]
    assert depth and all(lab["queue"].startswith("compile.") and v >= 0 for lab, v in depth)
    assert value(samples, "kiln_compile_duration_seconds_count", backend="tvm", outcome="ready") >= 1
    assert value(samples, "kiln_compile_duration_seconds_count", backend="tvm", outcome="failed") >= 1
    assert value(samples, "kiln_artifact_cache_misses_total", backend="tvm") >= 2
    assert value(samples, "kiln_artifact_cache_hits_total", backend="tvm") >= 1

    # The dashboard queries only series that exist.
    panels = json.loads(DASHBOARD.read_text())["panels"]
    exprs = [t["expr"] for p in panels for t in p["targets"]]
    names = {n for e in exprs for n in re.findall(r"\b(?:kiln|process)_[a-z_]+\b", e)}
    assert len(panels) >= 9 and names and names <= samples.keys(), names - samples.keys()


def test_request_id_is_echoed_and_logged(server: KilnServer, http: httpx.Client) -> None:
    given = http.get("/healthz", headers={"X-Request-ID": "obs-given.1"})
    assert given.headers["x-request-id"] == "obs-given.1"
    generated = http.get("/healthz").headers["x-request-id"]
    assert re.fullmatch(r"[0-9a-f]{32}", generated)
    insane = http.get("/healthz", headers={"X-Request-ID": "two words"}).headers["x-request-id"]
    assert re.fullmatch(r"[0-9a-f]{32}", insane)
    error = http.get("/v1/models/nope", headers={"X-Request-ID": "obs-404"})
    assert error.status_code == 404 and error.headers["x-request-id"] == "obs-404"
    # Never loaded yet, so the runtime logs the load inside this request.
    loaded = predict_with_id(http, "mlp-again", "obs-predict")
    assert loaded.status_code == 200 and loaded.headers["x-request-id"] == "obs-predict"
    body = infer_body(sample(MLP, 1))
    v2 = http.post("/v2/models/mlp-again/infer", json=body, headers={"X-Request-ID": "obs-v2"})
    assert v2.status_code == 200 and v2.headers["x-request-id"] == "obs-v2"

    lines = server.json_lines()
    assert all({"ts", "level", "logger", "message"} <= line.keys() for line in lines)
    by_id = {
        rid: [line for line in lines if line.get("request_id") == rid] for rid in ("obs-predict", generated)
    }
    assert {line["logger"] for line in by_id["obs-predict"]} >= {"kiln.runtime", "uvicorn.access"}
    assert any("POST /v1/models/mlp-again/predict" in line["message"] for line in by_id["obs-predict"])
    assert any("GET /healthz" in line["message"] for line in by_id[generated])
    v2_lines = [line["message"] for line in lines if line.get("request_id") == "obs-v2"]
    assert any("POST /v2/models/mlp-again/infer" in message for message in v2_lines), v2_lines


def predict_with_id(http: httpx.Client, name: str, rid: str) -> httpx.Response:
    body = {"inputs": {"x": sample(MLP, 1).tolist()}}
    return http.post(f"/v1/models/{name}/predict", json=body, headers={"X-Request-ID": rid})


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *args],
        stdin=subprocess.DEVNULL,  # the delete prompt gets no answer, on a terminal too
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_cli_upload_follows_the_streams(server: KilnServer, tmp_path: Path) -> None:
    model = tmp_path / "mlp.pt"
    model.write_bytes(MLP.torchscript())
    common = ["--input", "x:float32[-1,64]", "--backend", "tvm", "--url", server.url]
    done = run_cli("upload", str(model), "--name", "cli-mlp", *common)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"^torchscript\s+any\s+ready", done.stdout, re.M), done.stdout
    assert re.search(r"^tvm\s+cpu-\S+\s+ready", done.stdout, re.M), done.stdout

    listed = run_cli("models", "--url", server.url)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    # One compiled variant: timed against TorchScript when it compiled (its ms, then TorchScript's
    # in that run, then the ratio), with nothing to race.
    pattern = r"cli-mlp\W+1\W+tvm\W+cpu-\S+\W+ready\W+[\d.]+\W+[\d.]+\W+[\d.]+x\W+compile"
    assert re.search(pattern, listed.stdout), listed.stdout

    pinned = run_cli("default", "cli-mlp", "1", "--url", server.url)
    assert pinned.returncode == 0, pinned.stdout + pinned.stderr
    assert "cli-mlp: default version 1; serving v1" in pinned.stdout, pinned.stdout
    assert re.search(r"cli-mlp\W+1 \(default\)\W+torchscript", run_cli("models", "--url", server.url).stdout)
    cleared = run_cli("default", "cli-mlp", "--url", server.url)
    assert "default version the newest ready one; serving v1" in cleared.stdout, cleared.stdout
    missing = run_cli("default", "cli-mlp", "9", "--url", server.url)
    assert missing.returncode == 1 and "has no version 9" in missing.stderr, missing.stderr

    nothing = run_cli("add-variants", "cli-mlp", "1", "--url", server.url)
    assert nothing.returncode == 0, nothing.stdout + nothing.stderr
    assert "cli-mlp version 1: nothing to compile" in nothing.stdout, nothing.stdout
    assert re.search(r"^tvm\s+cpu-\S+\s+skipped: already ready", nothing.stdout, re.M), nothing.stdout
    added = run_cli("add-variants", "cli-mlp", "1", "--backend", "onnxruntime", "--url", server.url)
    assert added.returncode == 0, added.stdout + added.stderr
    assert re.search(r"^onnxruntime\s+cpu-\S+\s+ready [\d.]+ ms at batch 1$", added.stdout, re.M), (
        added.stdout
    )
    assert "tvm" not in added.stdout and "torchscript" not in added.stdout  # only what it queued

    changed = run_cli(
        "serving", "cli-mlp", "1", "--set", "max_queue_size=4", "--set", "preferred_batch_sizes=[2]",
        "--url", server.url,
    )  # fmt: skip
    assert changed.returncode == 0, changed.stdout + changed.stderr
    shown = json.loads(run_cli("serving", "cli-mlp", "1", "--url", server.url).stdout)
    assert (shown["max_queue_size"], shown["preferred_batch_sizes"]) == (4, [2])
    not_json = run_cli("serving", "cli-mlp", "1", "--set", "max_queue_size=four", "--url", server.url)
    assert not_json.returncode == 2 and "VALUE in JSON" in not_json.stderr, not_json.stderr
    refused = run_cli("serving", "cli-mlp", "1", "--set", "max_batch_size=4", "--url", server.url)
    assert refused.returncode == 1 and "fixed at upload" in refused.stderr, refused.stderr

    # Any other config field at upload, as --set FIELD=JSON.
    fields = ["--set", "max_queue_delay_us=1500", "--set", "response_cache=true"]
    labels = tmp_path / "labels.txt"
    labels.write_text("cat\ndog\n")  # Triton's label file: one label a line
    fields += ["--labels", f"output0={labels}"]
    queued = run_cli("upload", str(model), "--name", "cli-later", "--no-wait", *fields, *common)
    assert queued.returncode == 0, queued.stdout + queued.stderr
    assert re.search(r"^tvm\s+cpu-\S+\s+queued", queued.stdout, re.M), queued.stdout
    shown = json.loads(run_cli("serving", "cli-later", "1", "--url", server.url).stdout)
    assert (shown["max_queue_delay_us"], shown["response_cache"]) == (1500, True)
    assert shown["labels"] == {"output0": ["cat", "dog"]}
    labels.write_text("tabby\n")
    relabelled = run_cli("serving", "cli-later", "1", "--labels", f"output0={labels}", "--url", server.url)
    assert json.loads(relabelled.stdout)["labels"] == {"output0": ["tabby"]}, relabelled.stdout
    missing = run_cli("serving", "cli-later", "1", "--labels", "output0=/nonexistent", "--url", server.url)
    assert missing.returncode == 2 and "No such file" in missing.stderr, missing.stderr
    not_json = run_cli("upload", str(model), "--name", "cli-bad", "--set", "rtol=small", *common)
    assert not_json.returncode == 2 and "VALUE in JSON" in not_json.stderr, not_json.stderr
    unknown = run_cli("upload", str(model), "--name", "cli-bad", "--set", "colour=1", *common)
    assert unknown.returncode == 1 and "colour" in unknown.stderr, unknown.stderr

    x = json.dumps({"x": [[0.5] * 64]})
    pinned_run = run_cli(
        "predict",
        "cli-later",
        "--data",
        x,
        "--backend",
        "torchscript",
        "--priority",
        "1",
        "--url",
        server.url,
    )
    assert pinned_run.returncode == 0, pinned_run.stdout + pinned_run.stderr
    answer = json.loads(pinned_run.stdout)
    assert answer["variant"]["backend"] == "torchscript" and len(answer["outputs"]["output0"][0]) == 10
    not_data = run_cli("predict", "cli-later", "--data", "{x: 1}", "--url", server.url)
    assert not_data.returncode == 2 and "not JSON" in not_data.stderr, not_data.stderr
    down = run_cli("unload", "cli-later", "--url", "http://127.0.0.1:1")  # nothing listens there
    assert down.returncode == 1 and "cannot reach Kiln at http://127.0.0.1:1/" in down.stderr, down.stderr
    assert "Traceback" not in down.stdout + down.stderr
    unloaded = run_cli("unload", "cli-later", "--url", server.url)
    assert unloaded.returncode == 0 and "cli-later: unloaded" in unloaded.stdout, unloaded.stdout
    assert "cli-later (unloaded)" in run_cli("models", "--url", server.url).stdout
    assert run_cli("load", "cli-later", "--url", server.url).stdout.strip() == "cli-later: loaded"
    assert "cli-later (unloaded)" not in run_cli("models", "--url", server.url).stdout
    missing = run_cli("unload", "cli-none", "--url", server.url)  # the protocol's {"error"}, shown
    assert missing.returncode == 1 and "no model named 'cli-none'" in missing.stderr, missing.stderr
    asked = run_cli("delete", "cli-later", "1", "--url", server.url)  # no one to say yes: kept
    assert asked.returncode == 1 and "Delete cli-later version 1 and its artifacts?" in asked.stdout
    assert "cli-later" in run_cli("models", "--url", server.url).stdout
    deleted = run_cli("delete", "cli-later", "--yes", "--url", server.url)
    assert deleted.returncode == 0 and "cli-later: deleted" in deleted.stdout, deleted.stdout
    assert "cli-later" not in run_cli("models", "--url", server.url).stdout


def test_worker_serves_its_own_metrics(redis_url: str, tmp_path: Path) -> None:
    port = free_port()
    env = {"KILN_REDIS_URL": redis_url, "KILN_WORKER_METRICS_PORT": str(port), "KILN_THREADS": "1"}
    worker = KilnProcess(["worker"], env, tmp_path / "worker.log")
    worker.start()
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        wait_until(lambda: httpx.get(url).status_code == 200, 60, "the worker's metrics")
        text = httpx.get(url).text
        assert "# TYPE kiln_compile_duration_seconds histogram" in text
        assert "process_resident_memory_bytes" in text
    finally:
        worker.stop()
    assert any(line.startswith("{") and "worker metrics on" in line for line in worker.tail().splitlines())


def compile_job(job_id: str, target: str, **options: object) -> JobRecord:
    return JobRecord(
        id=job_id, variant_id="v", model="m", version=1, backend="tvm", target=target, options=options
    )


def test_redis_queue_depth_counts_unsettled_messages(redis_url: str) -> None:
    from compiler.hardware import local_targets
    from service.queue import DramatiqQueue, queue_name
    from service.settings import Settings

    queue = DramatiqQueue(Settings(redis_url=redis_url))
    try:
        target = local_targets()[0]
        name = queue_name(target)
        assert queue.depth([target]) == {name: 0}
        queue.enqueue(compile_job("job-1", target))
        queue.enqueue(compile_job("job-2", target))
        assert queue.depth([target]) == {name: 2}  # nothing consumes them here
        # A GPU worker's queue, which the API's host neither serves nor knows of, still shows.
        queue.enqueue(compile_job("job-3", "cuda-sm90"))
        assert queue.depth([target]) == {name: 2, queue_name("cuda-sm90"): 1}
        # Dramatiq's dead letters (out of retries) are settled, not waiting: kept 7 days, they
        # showed as a queue of their own.
        dead = f"{queue.broker.namespace}:{queue_name('cuda-sm80')}.XQ.msgs"
        queue.broker.client.hset(dead, "message-id", b"{}")
        assert queue.depth([target]) == {name: 2, queue_name("cuda-sm90"): 1}
    finally:
        queue.close()


def test_embedded_queue_depth_is_every_processs(tmp_path: Path) -> None:
    """`kiln serve --workers 2` in embedded mode: each process compiles its own uploads' jobs,
    and either one answers a scrape with the jobs of both, from the store they share."""
    from service.queue import EmbeddedQueue, queue_name
    from service.registry import Registry
    from service.settings import Settings
    from service.store.local import LocalStore

    target = "cpu-x86_64-test-avx2"
    settings = Settings(data_dir=tmp_path / "data", targets=[target])
    one, other = (EmbeddedQueue(Registry(LocalStore(tmp_path / "store")), settings) for _ in range(2))
    try:
        store = one.registry.store
        for job_id, status in (("a", "queued"), ("b", "running"), ("c", "succeeded"), ("d", "failed")):
            job = compile_job(job_id, target).model_dump(mode="json")
            store.put_doc("job", job_id, {**job, "status": status})
        assert one.depth([target]) == other.depth([target]) == {queue_name(target): 2}
        # A job no process here compiles (a data dir moved from another host) waits: it shows.
        store.put_doc("job", "elsewhere", compile_job("elsewhere", "cuda-sm90").model_dump(mode="json"))
        assert one.depth([target]) == {queue_name(target): 2, queue_name("cuda-sm90"): 1}
    finally:
        one.close()
        other.close()


def test_a_tuned_job_gets_time_for_its_trials(redis_url: str) -> None:
    """Dramatiq's time limit interrupts a job: a tuned compile's message must allow what its
    compile child is allowed, or a long tuning run would be cut off and retried."""
    from compiler.hardware import local_targets
    from service.jobs import compile_limit_s
    from service.queue import DramatiqQueue, queue_name
    from service.settings import Settings

    settings = Settings(redis_url=redis_url, compile_timeout_s=600, tuning_s_per_trial=6)
    queue = DramatiqQueue(settings)
    try:
        target = local_targets()[0]
        quick, tuned = compile_job("quick", target), compile_job("tuned", target, tuning_trials=1500)
        assert compile_limit_s(settings, tuned) == 600 + 1500 * 6
        for job in (quick, tuned):
            queue.enqueue(job)
        key = f"{queue.broker.namespace}:{queue_name(target)}.msgs"
        messages = [json.loads(raw) for raw in queue.broker.client.hvals(key)]
        limits = {m["args"][0]: m["options"]["time_limit"] / 1000 for m in messages}
        assert limits["quick"] > compile_limit_s(settings, quick)
        assert limits["tuned"] > compile_limit_s(settings, tuned)
    finally:
        queue.close()


def test_triton_series_match_the_statistics(http: httpx.Client) -> None:
    """Triton's nv_inference_* series carry the numbers of Triton's statistics extension, so that
    dashboards and autoscalers written for Triton read Kiln unchanged."""
    assert upload(http, MLP, name="mlp-nv", response_cache=True, backends=[]).status_code == 202
    url = "/v2/models/mlp-nv/infer"
    for seed in range(5):
        assert http.post(url, json=infer_body(sample(MLP, 2, seed=seed))).status_code == 200
    assert http.post(url, json=infer_body(sample(MLP, 2, seed=0))).status_code == 200  # a cache hit
    expired = http.post(url, json=infer_body(sample(MLP, 1, seed=9), parameters={"timeout": 1}))
    assert expired.status_code == 503, expired.text
    [stats] = http.get("/v2/models/mlp-nv/stats").json()["model_stats"]
    samples = scrape(http)

    def series(name: str, **labels: str) -> float:
        return value(samples, name, model="mlp-nv", version="1", **labels)

    inference = stats["inference_stats"]
    assert series("nv_inference_request_success") == inference["success"]["count"] == 6
    assert series("nv_inference_request_failure", reason="REJECTED") == inference["fail"]["count"] == 1
    # Every reason's series exists from the version's load, at 0 until it counts.
    failures = {
        lab["reason"]: v for lab, v in samples["nv_inference_request_failure"] if lab["model"] == "mlp-nv"
    }
    assert failures == {"REJECTED": 1, "CANCELED": 0, "BACKEND": 0, "OTHER": 0}
    pending = [v for lab, v in samples["nv_inference_pending_request_count"] if lab["model"] == "mlp-nv"]
    assert pending == [0]  # none waits once every request is answered
    assert series("nv_inference_count") == stats["inference_count"] == 10
    assert series("nv_inference_exec_count") == stats["execution_count"] >= 1
    assert series("nv_cache_num_hits_per_model") == inference["cache_hit"]["count"] == 1
    assert series("nv_cache_num_misses_per_model") == inference["cache_miss"]["count"] == 5
    for name, key in [
        ("nv_inference_request_duration_us", "success"),
        ("nv_inference_queue_duration_us", "queue"),
        ("nv_inference_compute_input_duration_us", "compute_input"),
        ("nv_inference_compute_infer_duration_us", "compute_infer"),
        ("nv_inference_compute_output_duration_us", "compute_output"),
        ("nv_cache_hit_duration_per_model", "cache_hit"),
        ("nv_cache_miss_duration_per_model", "cache_miss"),
    ]:
        # The statistics keep whole nanoseconds per request.
        assert series(name) == pytest.approx(
            inference[key]["ns"] / 1000, abs=inference[key]["count"] / 1000 + 1e-6
        ), name
    assert series("nv_inference_compute_infer_duration_us") > 0


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (QueueFullError("full"), "REJECTED"),
        (TimeoutExpiredError("expired"), "REJECTED"),
        (ClientGoneError("gone"), "CANCELED"),
        (asyncio.CancelledError(), "CANCELED"),
        (ConflictError("unloaded"), "OTHER"),
        (NotFoundError("deleted meanwhile"), "OTHER"),
        (StoreUnavailableError("redis down"), "OTHER"),
        (RuntimeError("the model raised"), "BACKEND"),
    ],
)
def test_failures_count_by_triton_reason(error: BaseException, reason: str) -> None:
    assert failure_reason(error) == reason


def test_a_forgotten_version_never_counts_again_and_a_newer_one_stays() -> None:
    """Version numbers are never reused: a request of a deleted version still in flight counts
    nowhere, and a version counted after the store was read is not taken for a deleted one."""
    stats, name = Stats(), "stats-forget"

    def versions_in_series() -> set[str]:
        return {
            s.labels["version"]
            for family in REGISTRY.collect()
            for s in family.samples
            if s.labels.get("model") == name and "version" in s.labels
        }

    stats.start(name, 1)
    stats.answered(name, 1, 0.001, 0.002, "torchscript", "any")
    held = stats.versions(name)
    stats.start(name, 2)  # uploaded and loaded after the store was read, which had neither
    stats.forget(name, held, stored=set())
    assert stats.versions(name) == {2} and versions_in_series() == {"2"}
    assert stats.models() == {name}  # the model's series are kept while a version is counted
    stats.failed(name, 1, 0.001, "CANCELED")  # v1's request in flight, as its batcher drains
    stats.cache_hit(name, 1, 0.001, 0.001)
    assert [s["version"] for s in stats.doc(name)] == ["2"] and versions_in_series() == {"2"}
    # One not yet at its batch or its load fails as if sent after the delete.
    with pytest.raises(DeletedError):
        stats.labelled(metrics.NV_PENDING, name, 1, per_version=True)
    with pytest.raises(DeletedError):
        stats.start(name, 1)
    assert stats.deleted(name, 1) and not stats.deleted(name, 2)
    stats.labelled(metrics.BATCH_SIZE, name, 2).observe(4)
    stats.forget(name, stats.versions(name), stored=set())
    assert stats.doc(name) == [] and stats.models() == set()
    assert REGISTRY.get_sample_value("kiln_batch_size_count", {"model": name}) is None
    assert versions_in_series() == set()


def test_multiprocess_mode_aggregates_workers(tmp_path: Path) -> None:
    prom_dir = tmp_path / "prom"
    prom_dir.mkdir()
    env = {"KILN_DATA_DIR": str(tmp_path / "data"), "PROMETHEUS_MULTIPROC_DIR": str(prom_dir)}
    srv = KilnServer(env, tmp_path / "kiln.log", workers=2)
    srv.start()
    try:
        with httpx.Client(base_url=srv.url, timeout=60) as http:
            assert upload(http, MLP, backends=[]).status_code == 202
        # Fresh connections, so both workers are likely to answer some.
        for _ in range(12):
            with httpx.Client(base_url=srv.url, timeout=60) as http:
                assert predict(http, MLP.name, sample(MLP, 1)).status_code == 200
        with httpx.Client(base_url=srv.url, timeout=60) as http:
            samples = scrape(http)
        # Whichever worker answers the scrape counts every worker's requests.
        assert value(samples, "kiln_request_duration_seconds_count", model="mlp") == 12
        assert value(samples, "nv_inference_request_success", model="mlp", version="1") == 12
        assert value(samples, "nv_inference_count", model="mlp", version="1") == 12
        assert 1 <= value(samples, "kiln_loaded_runners") <= 2
        # Two workers (uvicorn may have replaced one that missed a health check: its gauges
        # were dropped by that scrape).
        live = live_gauge_pids(prom_dir)
        assert len(live) == 2 and all(psutil.pid_exists(pid) for pid in live), live
    finally:
        srv.stop()
    assert not live & live_gauge_pids(prom_dir), "workers left their live gauges behind"


def test_two_scrapes_at_once_both_forget_a_dead_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Workers scraped at once may find the same dead worker's live gauges: the scrape whose
    remove comes second finds them gone, and still answers."""
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    dead = subprocess.Popen(["true"])
    dead.wait()
    (tmp_path / f"gauge_livesum_{dead.pid}.db").touch()

    def found_then_removed_by_the_other(pattern: str) -> list[str]:
        paths = glob.glob(pattern)
        for path in paths:
            os.remove(path)
        return paths

    monkeypatch.setattr(multiprocess, "glob", SimpleNamespace(glob=found_then_removed_by_the_other))
    metrics.forget_dead_processes()
    assert not live_gauge_pids(tmp_path)


def test_a_restart_with_several_workers_resumes_each_job_once(tmp_path: Path) -> None:
    """An embedded server killed mid-compile comes back with two workers. The interrupted job is
    compiled once, by the worker that takes it up, not once per worker; the scrape
    (multiprocess mode, which `kiln serve --workers 2` turns on by itself) counts both."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {"KILN_DATA_DIR": str(tmp_path / "data"), "TMPDIR": str(tmp)}
    first = KilnServer(env, tmp_path / "first.log")
    first.start()
    try:
        with httpx.Client(base_url=first.url, timeout=60) as http:
            assert upload(http, MLP, backends=["tvm"]).status_code == 202
        os.kill(first.pid, signal.SIGKILL)
    finally:
        first.stop()
    second = KilnServer(env, tmp_path / "second.log", workers=2)
    second.start()
    try:
        (prom_dir,) = tmp.glob("kiln-metrics-*")
        with httpx.Client(base_url=second.url, timeout=60) as http:
            assert by_backend(wait_settled(http, MLP.name, 1), "tvm")["status"] == "ready"
            samples = scrape(http)
        assert value(samples, "kiln_artifact_cache_misses_total", backend="tvm") == 1
        assert value(samples, "kiln_compile_duration_seconds_count", backend="tvm") == 1
        assert "process_resident_memory_bytes" not in samples  # multiprocess mode leaves it out
        assert len(live_gauge_pids(prom_dir)) == 2
    finally:
        second.stop()
    assert not prom_dir.exists(), "kiln serve left its metrics directory behind"


def live_gauge_pids(prom_dir: Path) -> set[int]:
    return {int(p.stem.rpartition("_")[2]) for p in prom_dir.glob("gauge_livesum_*.db")}
