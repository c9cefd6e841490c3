"""Shutdown of a live `kiln serve`: job event streams end at once, with `end` `shutdown`, so that
a watching client does not hold the server; `kiln upload` follows its job through the restart;
gRPC stops at once; and a request that never finishes is cancelled after KILN_SHUTDOWN_TIMEOUT_S."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import httpx
import psutil
import pytest
import torch
from httpx_sse import connect_sse
from tritonclient.grpc.service_pb2 import ServerLiveRequest
from tritonclient.grpc.service_pb2_grpc import GRPCInferenceServiceStub

from service.api.events import SHUTDOWN
from tests.client import by_backend
from tests.models import MODELS
from tests.servers import ROOT, KilnServer, embedded_server, wait_until

pytestmark = pytest.mark.timeout(900)

MLP = MODELS["mlp"]
UPLOAD = ["--name", "mlp", "--input", "x:float32[-1,64]", "--backend", "tvm"]


def events_of(url: str, job_id: str, into: list[tuple[str, dict[str, Any]]]) -> threading.Thread:
    def read() -> None:
        with (
            httpx.Client(base_url=url, timeout=120) as client,
            connect_sse(client, "GET", f"/v1/jobs/{job_id}/events") as source,
        ):
            into.extend((event.event, event.json()) for event in source.iter_sse())

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def terminate(server: KilnServer, within: float) -> float:
    """SIGTERM, as Kubernetes and Ctrl+C stop it: the seconds it took to exit, at most `within`."""
    assert server.proc is not None
    began = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    try:
        server.proc.wait(within)
    except subprocess.TimeoutExpired:
        pytest.fail(f"kiln serve still running {within} s after SIGTERM:\n{server.tail()}")
    server.proc = None
    return time.monotonic() - began


def test_shutdown_ends_job_streams_and_the_cli_follows_its_job_across_a_restart(tmp_path: Path) -> None:
    model = tmp_path / "mlp.pt"
    model.write_bytes(MLP.torchscript())
    with embedded_server(tmp_path) as server, httpx.Client(base_url=server.url, timeout=60) as http:
        cli = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "upload", str(model), *UPLOAD, "--url", server.url],
            cwd=ROOT,
            env={**os.environ, "COLUMNS": "200"},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            wait_until(lambda: http.get("/v1/models/mlp/versions/1").status_code == 200, 120, "the upload")
            job_id = by_backend(http.get("/v1/models/mlp/versions/1").json()["variants"], "tvm")["job_id"]
            events: list[tuple[str, dict[str, Any]]] = []
            stream = events_of(server.url, job_id, events)
            wait_until(lambda: events, 30, "the job's first event")

            # Well inside KILN_SHUTDOWN_TIMEOUT_S's 30 s: the streams end as soon as it is told.
            assert terminate(server, 15) < 10
            stream.join(5)
            assert not stream.is_alive()
            assert events[0][0] == "stage" and events[0][1]["stage"] != "ready", events
            assert events[-1] == (
                "end",
                {
                    "reason": "shutdown",
                    "status": None,
                    "detail": SHUTDOWN,
                },
            )

            server.start()  # the same port and data dir: the job resumes
            out, _ = cli.communicate(timeout=600)
        finally:
            cli.kill()
    assert cli.returncode == 0, out
    assert re.search(r"^tvm\s+cpu-\S+\s+ready", out, re.M), out


def test_a_request_that_never_finishes_is_cancelled_at_the_shutdown_timeout(tmp_path: Path) -> None:
    """And gRPC stops at once, beside HTTP's drain: its clients' channels go elsewhere."""
    with (
        embedded_server(tmp_path, KILN_SHUTDOWN_TIMEOUT_S="3") as server,
        socket.create_connection(("127.0.0.1", server.port)) as stalled,
        grpc.insecure_channel(server.grpc_address) as channel,
    ):
        live = GRPCInferenceServiceStub(channel).ServerLive
        assert live(ServerLiveRequest(), timeout=10).live
        # An upload whose body stops short: its handler waits on the rest for ever.
        stalled.sendall(
            b"POST /v1/models HTTP/1.1\r\nHost: kiln\r\nContent-Length: 100000\r\n"
            b"Content-Type: multipart/form-data; boundary=b\r\n\r\n--b\r\n"
        )
        time.sleep(1)  # for uvicorn to hand the request to the app
        assert server.proc is not None
        server.proc.send_signal(signal.SIGTERM)
        time.sleep(1)
        with pytest.raises(grpc.RpcError) as refused:
            live(ServerLiveRequest(), timeout=1)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert server.proc.poll() is None, "the stalled request held HTTP's drain"
        assert terminate(server, 20) < 15
        # Told to send it again: uvicorn's own answer was a 500, as for a bug.
        stalled.settimeout(5)
        answer = stalled.recv(4096).decode()
        assert answer.startswith("HTTP/1.1 503 ") and "KILN_SHUTDOWN_TIMEOUT_S" in answer, answer
    assert "Cancel 1 running task(s), timeout graceful shutdown exceeded" in server.log.read_text()


class Spin(torch.nn.Module):
    """Runs x[0, 0] steps: a request as long as its caller asks."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x
        for _ in range(int(x[0, 0])):
            y = torch.tanh(y @ torch.ones(4, 4)) + x
        return y


def test_ctrl_c_exits_at_the_shutdown_timeout_though_a_model_still_runs(tmp_path: Path) -> None:
    """After Ctrl-C uvicorn returns once the server has stopped; the thread still running the
    model held the exit for its whole run (25 s past a limit of 3)."""
    model = io.BytesIO()
    torch.jit.save(torch.jit.script(Spin()), model)
    config = {"name": "spin", "inputs": [{"name": "x", "dtype": "float32", "shape": [-1, 4]}], "backends": []}
    answers: list[int] = []
    with embedded_server(tmp_path, KILN_SHUTDOWN_TIMEOUT_S="3", KILN_THREADS="1") as server:
        http = httpx.Client(base_url=server.url, timeout=120)
        files = {"file": ("spin.pt", model.getvalue())}
        assert http.post("/v1/models", files=files, data={"config": json.dumps(config)}).status_code == 202
        assert http.post("/v1/models/spin/predict", json={"inputs": {"x": [[1, 0, 0, 0]]}}).status_code == 200
        steps = {"inputs": {"x": [[50_000_000, 0, 0, 0]]}}  # minutes
        running = threading.Thread(
            target=lambda: answers.append(http.post("/v1/models/spin/predict", json=steps).status_code)
        )
        running.start()
        time.sleep(1)
        assert server.proc is not None
        began = time.monotonic()
        server.proc.send_signal(signal.SIGINT)
        try:
            server.proc.wait(20)
        except subprocess.TimeoutExpired:
            pytest.fail(f"kiln serve still running 20 s after Ctrl-C:\n{server.tail()}")
        assert time.monotonic() - began < 10
        server.proc = None
        running.join(10)
    assert answers == [503]


def test_workers_stop_with_their_killed_supervisor_and_one_that_cannot_start_fails_it(tmp_path: Path) -> None:
    """`kiln serve --workers 2` killed with -9: its workers served on, holding the port, and a
    restart failed. And a worker that cannot start (its gRPC port taken) ended the supervisor
    with 0, which `restart: on-failure` takes for a clean stop."""
    server = KilnServer({"KILN_DATA_DIR": str(tmp_path / "data")}, tmp_path / "kiln.log", workers=2)
    server.start()
    assert server.proc is not None
    workers = psutil.Process(server.proc.pid).children()
    assert len(workers) >= 2
    server.kill()
    _, alive = psutil.wait_procs(workers, timeout=30)
    assert not alive, [p.cmdline() for p in alive]

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        env = {**server.env, "KILN_GRPC_PORT": str(taken.getsockname()[1])}
        args = [sys.executable, "-m", "service.cli", "serve", "--port", "0", "--workers", "2"]
        done = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "failed to start" in done.stdout + done.stderr


# `kiln serve --workers 2`'s supervisor, but past the checks `kiln serve` makes first: as if the
# app failed to build only in the worker processes.
SUPERVISED = """
import uvicorn
from service.cli import APP, supervise
from service.logs import logging_config
log_config = logging_config("text")
supervise(uvicorn.Config(APP, factory=True, host="127.0.0.1", port=0, workers=2, log_config=log_config))
"""


def test_workers_whose_app_cannot_be_built_stop_their_supervisor(tmp_path: Path) -> None:
    """They exited 1, which uvicorn's supervisor takes for a crash: it started another, which
    failed alike, forever. Now they exit as uvicorn's own startup failures do."""
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    env = {
        **inherited,
        "KILN_DATA_DIR": str(tmp_path / "data"),
        "KILN_GRPC_PORT": "0",
        "KILN_API_KEYS": "k:root",
    }
    # Still restarting them at the timeout, without the fix.
    done = subprocess.run(
        [sys.executable, "-c", SUPERVISED], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    out = done.stdout + done.stderr
    assert done.returncode == 3, out
    assert "the app could not be built" in out and "entry 1 must be KEY:admin or KEY:infer" in out, out
    assert "died" not in out, out  # no worker was started again
