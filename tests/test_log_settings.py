"""Triton's logging extension through tritonclient, over HTTP and gRPC, against `kiln serve
--workers 2`: a change made through either process applies in both, and the lines it turns off
are not written."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from tests.client import upload, wait_settled
from tests.models import MODELS
from tests.servers import KilnServer, embedded_server, running, wait_until

ADMIN, INFER = "admin-secret", "infer-secret"
# Lower case, as gRPC metadata must be; read-only, as these calls do not add to them.
AS_ADMIN, AS_INFER = ({"authorization": f"Bearer {key}"} for key in (ADMIN, INFER))
DEFAULTS = {
    "log_file": "",
    "log_info": True,
    "log_warning": True,
    "log_error": True,
    "log_verbose_level": 0,
    "log_format": "json",
}
PROCESSES = 2


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KilnServer]:
    root = tmp_path_factory.mktemp("log-settings")
    env = {
        "KILN_DATA_DIR": str(root / "data"),
        "KILN_API_KEYS": f"{ADMIN}:admin,{INFER}:infer",
        "KILN_ROUTE_TTL_S": "0.2",
    }
    srv = KilnServer(env, root / "kiln.log", workers=PROCESSES)
    with running(srv):
        yield srv


@pytest.fixture
def http(server: KilnServer) -> Iterator[triton_http.InferenceServerClient]:
    client = triton_http.InferenceServerClient(server.url.removeprefix("http://"))
    yield client
    # Back to the defaults for the next test, in both processes: each announces them, if the test
    # left both elsewhere (as each that changes them settles both on its last change).
    before = applied(server, str(DEFAULTS))
    changed = client.get_log_settings(headers=AS_INFER) != DEFAULTS
    client.update_log_settings(DEFAULTS, headers=AS_ADMIN)
    if changed:
        settle(server, str(DEFAULTS), before)
    client.close()


@pytest.fixture
def grpc(server: KilnServer) -> Iterator[triton_grpc.InferenceServerClient]:
    client = triton_grpc.InferenceServerClient(server.grpc_address)
    yield client
    client.close()


def messages(server: KilnServer) -> list[str]:
    """Every line's message: JSON lines', and the text format's after its level and logger."""
    found = []
    for line in server.log.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            found.append(str(json.loads(line)["message"]))
        elif " kiln." in line:
            found.append(line.split("] ", 1)[-1])
    return found


def applied(server: KilnServer, text: str) -> int:
    """How many times a process applied settings whose announcement contains `text`."""
    return sum(1 for m in messages(server) if m.startswith("log settings now") and text in m)


def settle(server: KilnServer, text: str, before: int) -> None:
    """Wait until both processes applied the change announced with `text`."""
    wait_until(lambda: applied(server, text) >= before + PROCESSES, 10, f"both processes to log {text}")


def test_http_reads_and_changes_them_everywhere(
    server: KilnServer, http: triton_http.InferenceServerClient
) -> None:
    assert http.get_log_settings(headers=AS_INFER) == DEFAULTS
    assert "logging" in http.get_server_metadata()["extensions"]
    with pytest.raises(InferenceServerException, match="this API key has the infer scope"):
        http.update_log_settings({"log_verbose_level": 1}, headers=AS_INFER)

    before = applied(server, "'log_verbose_level': 1,")
    changed = http.update_log_settings({"log_verbose_level": 1}, headers=AS_ADMIN)
    assert changed == {**DEFAULTS, "log_verbose_level": 1}
    settle(server, "'log_verbose_level': 1,", before)
    assert http.get_log_settings(headers=AS_INFER)["log_verbose_level"] == 1

    # A change is announced at INFO while either its old or new settings write INFO lines: with
    # INFO off, turning WARNING off is written by neither process.
    before = applied(server, "'log_info': False")
    http.update_log_settings({"log_info": False}, headers=AS_ADMIN)
    settle(server, "'log_info': False", before)
    http.update_log_settings({"log_warning": False}, headers=AS_ADMIN)
    wait_until(lambda: http.get_log_settings(headers=AS_INFER)["log_warning"] is False, 10, "log_warning off")
    before = applied(server, "'log_error': False")
    http.update_log_settings({"log_info": True, "log_warning": True}, headers=AS_ADMIN)
    http.update_log_settings({"log_error": False}, headers=AS_ADMIN)
    settle(server, "'log_error': False", before)
    assert applied(server, "'log_warning': False") == 0


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"log_file": "/var/log/kiln.log"}, "Kiln writes its log to stderr"),
        ({"log_info": 1}, "log_info: Input should be a valid boolean"),
        ({"log_verbose_level": -1}, "log_verbose_level: Input should be greater than or equal to 0"),
        ({"log_verbose_level": 2**32}, "log_verbose_level: Input should be less than or equal to 4294967295"),
        ({"log_format": "ISO8601"}, "log_format: Input should be 'json' or 'text'"),
        ({"log_colour": True}, "log_colour: Extra inputs are not permitted"),
    ],
)
def test_http_refuses_what_it_cannot_apply(
    http: triton_http.InferenceServerClient, settings: dict[str, Any], message: str
) -> None:
    with pytest.raises(InferenceServerException, match=r"\[400\]") as refused:
        http.update_log_settings(settings, headers=AS_ADMIN)
    assert message in str(refused.value)
    assert http.get_log_settings(headers=AS_INFER) == DEFAULTS


def test_grpc_verbose_lines_and_format(
    server: KilnServer,
    http: triton_http.InferenceServerClient,
    grpc: triton_grpc.InferenceServerClient,
) -> None:
    as_json = grpc.get_log_settings(headers=AS_INFER, as_json=True)["settings"]
    assert as_json["log_verbose_level"] == {"uint32_param": 0} and as_json["log_info"] == {"bool_param": True}
    with pytest.raises(InferenceServerException, match="PERMISSION_DENIED"):
        grpc.update_log_settings({"log_info": False}, headers=AS_INFER)
    with pytest.raises(InferenceServerException, match=r"INVALID_ARGUMENT.*'json' or 'text'"):
        grpc.update_log_settings({"log_format": "ISO8601"}, headers=AS_ADMIN)

    # Level 1 writes Kiln's DEBUG lines: gRPC's ModelReady logs why a model is not ready.
    assert not grpc.is_model_ready("quiet", headers=AS_INFER)
    before = applied(server, "'log_verbose_level': 1,")
    grpc.update_log_settings({"log_verbose_level": 1}, headers=AS_ADMIN)
    settle(server, "'log_verbose_level': 1,", before)
    assert not grpc.is_model_ready("loud", headers=AS_INFER)
    wait_until(lambda: "model loud is not ready: no model named 'loud'" in messages(server), 10, "DEBUG")
    assert not any(m.startswith("model quiet is not ready") for m in messages(server))

    # Text lines from the change on, its own announcement included; then JSON again.
    before = applied(server, "'log_format': 'text'")
    grpc.update_log_settings({"log_format": "text"}, headers=AS_ADMIN)
    settle(server, "'log_format': 'text'", before)
    text_lines = [line for line in server.log.read_text().splitlines() if " INFO kiln.logs [" in line]
    assert len(text_lines) == PROCESSES and all("'log_format': 'text'" in line for line in text_lines)
    before = applied(server, "'log_format': 'json'")
    grpc.update_log_settings({"log_format": "json"}, headers=AS_ADMIN)
    settle(server, "'log_format': 'json'", before)
    assert server.log.read_text().splitlines()[-1].startswith("{")


def test_every_line_is_json_warnings_and_compile_children_included(tmp_path: Path) -> None:
    """Python's warnings, and whatever a spawned upload check or compile wrote (torch's own
    handlers, its warnings), bypassed the JSON handler: bare text lines among the JSON."""
    with (
        embedded_server(tmp_path, KILN_LOG_FORMAT="json") as server,
        httpx.Client(base_url=server.url, timeout=120) as http,
    ):
        assert upload(http, MODELS["mlp"], "strays", backends=["onnxruntime"]).status_code == 202
        settled = wait_settled(http, "strays", 1)
        assert {v["backend"]: v["status"] for v in settled} == {
            "torchscript": "ready",
            "onnxruntime": "ready",
        }
        # float32 cannot hold 1e40: numpy warns of the overflow as it casts.
        huge = {"name": "x", "shape": [1, 64], "datatype": "FP32", "data": [1e40] * 64}
        assert http.post("/v2/models/strays/infer", json={"inputs": [huge]}).status_code == 200
        wait_until(lambda: "RuntimeWarning" in server.log.read_text(), 10, "the overflow's warning")
    lines = server.log.read_text().splitlines()
    docs = [json.loads(line) for line in lines]  # raises on the first line that is not JSON
    assert any(d["logger"] == "py.warnings" and "overflow" in d["message"] for d in docs)
