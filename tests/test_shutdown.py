"""Shutdown of a live `kiln serve`: job event streams end at once, with `end` `shutdown`, so that
a watching client does not hold the server; `kiln upload` follows its job through the restart;
gRPC stops at once; and a request that never finishes is cancelled after KILN_SHUTDOWN_TIMEOUT_S."""

from __future__ import annotations

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
import pytest
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
