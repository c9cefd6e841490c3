"""Triton's trace extension: which requests the settings sample (in-process), and, through
tritonclient over HTTP and gRPC against `kiln serve --workers 2`, settings that apply in both
processes and traces of Triton's timestamps, in order, in the log."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from service.store.local import LocalStore
from service.trace_settings import TraceControl
from service.traces import Traces, TraceSettings, TraceSettingsIn
from tests import models
from tests.client import expected, sample, upload
from tests.servers import KilnServer, running, wait_until

ADMIN, INFER = "admin-secret", "infer-secret"
AS_ADMIN, AS_INFER = ({"authorization": f"Bearer {key}"} for key in (ADMIN, INFER))
DEFAULTS = {
    "trace_level": ["OFF"],
    "trace_rate": "1000",
    "trace_count": "-1",
    "log_frequency": "0",
    "trace_file": "",
    "trace_mode": "triton",
}
STAMPS = [
    "REQUEST_START",
    "QUEUE_START",
    "COMPUTE_START",
    "COMPUTE_INPUT_END",
    "COMPUTE_OUTPUT_START",
    "COMPUTE_END",
    "REQUEST_END",
]
PROCESSES = 2
MLP = models.MODELS["mlp"]


def traced(traces: Traces, model: str, requests: int) -> list[int]:
    """Which of `requests` requests of `model` (numbered from 1) are traced."""
    return [n for n in range(1, requests + 1) if traces.sample(model, 0.0, 1) is not None]


def test_rate_count_and_a_models_own_settings() -> None:
    traces = Traces()
    assert traced(traces, "a", 5) == []  # OFF by default
    on = TraceSettings(trace_level=["TIMESTAMPS"], trace_rate=3, trace_count=3)
    traces.apply({None: on})
    assert traced(traces, "a", 7) == [3, 6]
    assert traced(traces, "b", 4) == [2]  # the server's count and rate, shared by both models
    assert traced(traces, "a", 9) == []  # none left
    assert traces.settings("a").trace_count == "0"
    # A model's own rate, with the server's count: it starts from what the server has left.
    traces.apply({None: on, "a": on.model_copy(update={"trace_rate": 1})})
    assert traced(traces, "a", 3) == []
    assert traces.settings("a").trace_count == "0"
    # Its own count, then cleared: the server's again, and what the server has left.
    traces.apply(
        {None: on, "a": on.model_copy(update={"trace_rate": 1, "trace_count": 5, "count_set": "own"})}
    )
    assert traced(traces, "a", 1) == [1]
    traces.apply({None: on, "a": on.model_copy(update={"trace_rate": 1})})
    assert traced(traces, "a", 3) == []

    # A model's own settings count apart; unchanged settings keep their counts.
    own = TraceSettings(trace_level=["TIMESTAMPS"], trace_rate=1, trace_count=-1)
    traces.apply({None: on, "a": own})
    assert traced(traces, "a", 2) == [1, 2]
    assert traced(traces, "b", 3) == []
    assert traces.settings("b").model_dump() == {
        **DEFAULTS,
        "trace_level": ["TIMESTAMPS"],
        "trace_rate": "3",
        "trace_count": "0",
    }
    # trace_count set again counts anew, as in Triton, though its value is the same; another
    # setting changed leaves the count as it is.
    traces.apply({None: on.model_copy(update={"trace_rate": 1})})
    assert traced(traces, "b", 2) == []
    traces.apply({None: on.model_copy(update={"trace_rate": 1, "count_set": "again"})})
    assert traced(traces, "b", 5) == [1, 2, 3]
    traces.apply({None: TraceSettings(), "a": TraceSettings(trace_level=["OFF"])})
    assert traced(traces, "a", 3) == traced(traces, "b", 3) == []
    assert not traces.on


def test_processes_share_the_settings_through_the_store(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    a, b = (TraceControl(store, Traces(), 1) for _ in range(2))
    a.update(None, TraceSettingsIn(trace_level=["TIMESTAMPS"], trace_rate=1, trace_count=1))
    b.run_once()
    assert traced(b.traces, "m", 3) == [1]
    b.update(None, TraceSettingsIn(trace_rate=1))  # another setting named: the count left stays
    assert traced(b.traces, "m", 2) == []
    a.update(None, TraceSettingsIn(trace_count=1))  # the count set again: it counts anew, everywhere
    b.run_once()
    assert traced(b.traces, "m", 3) == [1]
    # Two settings of one model changed through two processes: both kept.
    a.update("m", TraceSettingsIn(trace_rate=2))
    b.update("m", TraceSettingsIn(trace_level=["OFF"]))
    a.run_once()
    assert (a.traces.settings("m").trace_rate, a.traces.settings("m").trace_level) == ("2", ["OFF"])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KilnServer]:
    root = tmp_path_factory.mktemp("traces")
    env = {
        "KILN_DATA_DIR": str(root / "data"),
        "KILN_API_KEYS": f"{ADMIN}:admin,{INFER}:infer",
        "KILN_ROUTE_TTL_S": "0.2",
    }
    srv = KilnServer(env, root / "kiln.log", workers=PROCESSES)
    with running(srv), httpx.Client(base_url=srv.url, timeout=60, headers=AS_ADMIN) as admin:
        for name in ("mlp", "other"):
            response = upload(admin, MLP, name, backends=[])
            assert response.status_code == 202, response.text
        yield srv


@pytest.fixture
def http(server: KilnServer) -> Iterator[triton_http.InferenceServerClient]:
    client = triton_http.InferenceServerClient(server.url.removeprefix("http://"))
    yield client
    # Back to the defaults for the next test, in both processes, if the test left them elsewhere.
    changed = any(client.get_trace_settings(m, headers=AS_INFER) != DEFAULTS for m in ("mlp", "other"))
    cleared = {key: None for key in DEFAULTS}
    change(server, {} if changed else None, setting(client, "mlp", cleared), setting(client, None, cleared))
    client.close()


def setting(
    client: triton_http.InferenceServerClient | triton_grpc.InferenceServerClient,
    model: str | None,
    settings: dict[str, Any],
) -> Callable[[], Any]:
    """An update of `model`'s settings (the server's for None), as the admin."""
    extra = {"as_json": True} if isinstance(client, triton_grpc.InferenceServerClient) else {}
    return partial(client.update_trace_settings, model, settings, headers=AS_ADMIN, **extra)


def applied(server: KilnServer, doc: dict[str, Any]) -> int:
    """How many times a process applied the stored settings `doc`."""
    text = "trace settings now " + json.dumps(doc, sort_keys=True)
    return sum(1 for line in server.json_lines() if line["message"] == text)


def change(server: KilnServer, doc: dict[str, Any] | None, *updates: Callable[[], Any]) -> list[Any]:
    """Make the `updates`, then wait until both processes applied the settings `doc` they store
    (None: they change nothing); what they answered."""
    before = 0 if doc is None else applied(server, doc)
    answers = [update() for update in updates]
    if doc is not None:
        wait_until(lambda: applied(server, doc) >= before + PROCESSES, 10, f"both processes to apply {doc}")
    return answers


def traces_of(server: KilnServer, model: str) -> list[list[dict[str, Any]]]:
    return [
        line["trace"]
        for line in server.json_lines()
        if line["logger"] == "kiln.trace" and "trace" in line and line["trace"][0]["model_name"] == model
    ]


def infer(client: triton_http.InferenceServerClient, model: str, count: int) -> None:
    x = sample(MLP, 1)
    for n in range(count):
        data = triton_http.InferInput("x", list(x.shape), "FP32")
        data.set_data_from_numpy(x)
        headers = {**AS_INFER, "X-Request-ID": f"{model}-{n}"}
        result = client.infer(model, [data], headers=headers)
        np.testing.assert_allclose(result.as_numpy("output0"), expected(MLP, x), rtol=1e-5, atol=1e-5)


def test_http_traces_sampled_requests_with_tritons_timestamps(
    server: KilnServer, http: triton_http.InferenceServerClient
) -> None:
    assert "trace" in http.get_server_metadata()["extensions"]
    assert http.get_trace_settings(headers=AS_INFER) == DEFAULTS
    assert http.get_trace_settings("mlp", headers=AS_INFER) == DEFAULTS
    infer(http, "mlp", 3)
    assert traces_of(server, "mlp") == []
    with pytest.raises(InferenceServerException, match="this API key has the infer scope"):
        http.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"]}, headers=AS_INFER)

    server_on = {"trace_level": ["TIMESTAMPS"], "trace_rate": 1}
    on = setting(http, None, {"trace_level": "TIMESTAMPS", "trace_rate": "1"})
    [changed] = change(server, {"server": server_on}, on)
    assert changed == {**DEFAULTS, "trace_level": ["TIMESTAMPS"], "trace_rate": "1"}
    infer(http, "mlp", 4)
    traces = traces_of(server, "mlp")
    assert len(traces) == 4
    for trace in traces:
        head, *stamps = trace
        assert head == {"id": head["id"], "model_name": "mlp", "model_version": 1, "request_id": ANY}
        assert head["request_id"] in {f"mlp-{n}" for n in range(4)}
        assert [s["id"] for s in stamps] == [head["id"]] * len(STAMPS)
        assert [s["timestamps"][0]["name"] for s in stamps] == STAMPS
        ns = [s["timestamps"][0]["ns"] for s in stamps]
        assert ns == sorted(ns) and ns[-1] - ns[0] < 60e9
    assert len({trace[0]["id"] for trace in traces}) == 4

    # A model's own settings: off for it alone, while the server's trace the other; null gives
    # them back to the server's.
    off = setting(http, "mlp", {"trace_level": ["OFF"], "trace_count": "5"})
    mlp_off = {"trace_level": ["OFF"], "trace_count": 5}
    [mine] = change(server, {"server": server_on, "model:mlp": mlp_off}, off)
    assert mine == {**changed, "trace_level": ["OFF"], "trace_count": "5"}
    infer(http, "mlp", 2)
    infer(http, "other", 2)
    assert len(traces_of(server, "mlp")) == 4 and len(traces_of(server, "other")) == 2
    assert http.get_trace_settings(headers=AS_INFER) == changed
    cleared = http.update_trace_settings("mlp", {"trace_level": None}, headers=AS_ADMIN)
    assert cleared == {**changed, "trace_count": "5"}
    assert http.update_trace_settings("mlp", {}, headers=AS_ADMIN) == changed  # as Triton: all back

    # trace_rate and trace_count count in each process: of 20 requests, one in 5 is traced, up
    # to 1 in each process.
    change(
        server,
        {"server": {**server_on, "trace_rate": 5, "trace_count": 1}},
        setting(http, None, {"trace_rate": "5", "trace_count": "1"}),
        setting(http, "mlp", {"trace_count": None}),
    )
    traced_before = len(traces_of(server, "other"))
    infer(http, "other", 20)
    assert 1 <= len(traces_of(server, "other")) - traced_before <= PROCESSES


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"trace_level": ["TENSORS"]}, "trace_level.0: Input should be 'OFF' or 'TIMESTAMPS'"),
        ({"trace_level": ["OFF", "TIMESTAMPS"]}, "OFF and TIMESTAMPS together"),
        ({"trace_rate": "0"}, "trace_rate: Input should be greater than or equal to 1"),
        ({"trace_rate": "often"}, "trace_rate: Input should be a valid integer"),
        ({"trace_rate": True}, "trace_rate: Value error, a number, or a string of one, not true or false"),
        ({"trace_rate": str(2**32)}, "trace_rate: Input should be less than or equal to 4294967295"),
        ({"trace_count": str(2**31)}, "trace_count: Input should be less than or equal to 2147483647"),
        ({"trace_level": []}, "trace_level: List should have at least 1 item"),
        ({"log_frequency": False}, "Kiln writes each trace to stderr"),
        ({"log_frequency": 0.0}, "Kiln writes each trace to stderr"),
        ({"trace_count": "-2"}, "trace_count: Input should be greater than or equal to -1"),
        ({"trace_file": "/tmp/trace.json"}, "Kiln writes each trace to stderr"),
        ({"log_frequency": "50"}, "Kiln writes each trace to stderr"),
        ({"trace_mode": "opentelemetry"}, "trace_mode: Input should be 'triton'"),
        ({"trace_colour": "blue"}, "trace_colour: Extra inputs are not permitted"),
    ],
)
def test_http_refuses_what_it_cannot_apply(
    http: triton_http.InferenceServerClient, settings: dict[str, Any], message: str
) -> None:
    with pytest.raises(InferenceServerException, match=r"\[400\]") as refused:
        http.update_trace_settings("mlp", settings, headers=AS_ADMIN)
    assert message in str(refused.value)
    assert http.get_trace_settings("mlp", headers=AS_INFER) == DEFAULTS


def test_unknown_model(server: KilnServer) -> None:
    url = f"{server.url}/v2/models/nope/trace/setting"
    for method in ("GET", "POST"):
        response = httpx.request(method, url, json={}, headers=AS_ADMIN)
        assert response.status_code == 404 and "nope" in response.json()["error"]
    grpc = triton_grpc.InferenceServerClient(server.grpc_address)
    with pytest.raises(InferenceServerException, match="nope"):
        grpc.get_trace_settings("nope", headers=AS_INFER)
    grpc.close()


def test_grpc_reads_and_changes_them(server: KilnServer, http: triton_http.InferenceServerClient) -> None:
    grpc = triton_grpc.InferenceServerClient(server.grpc_address)
    read = grpc.get_trace_settings(headers=AS_INFER, as_json=True)
    assert read["settings"]["trace_level"] == {"value": ["OFF"]}
    with pytest.raises(InferenceServerException, match="this API key has the infer scope"):
        grpc.update_trace_settings("mlp", {"trace_rate": "1"}, headers=AS_INFER)
    with pytest.raises(InferenceServerException, match="trace_rate"):
        grpc.update_trace_settings("mlp", {"trace_rate": "0"}, headers=AS_ADMIN)

    on = setting(grpc, "mlp", {"trace_level": ["TIMESTAMPS"], "trace_rate": "1"})
    [changed] = change(server, {"model:mlp": {"trace_level": ["TIMESTAMPS"], "trace_rate": 1}}, on)
    want = {**DEFAULTS, "trace_level": ["TIMESTAMPS"], "trace_rate": "1"}
    assert changed["settings"] == {
        key: {"value": v if isinstance(v, list) else [v]} for key, v in want.items()
    }
    x = sample(MLP, 2)
    data = triton_grpc.InferInput("x", list(x.shape), "FP32")
    data.set_data_from_numpy(x)
    traced_before = len(traces_of(server, "mlp"))
    grpc.infer("mlp", [data], headers={**AS_INFER, "x-request-id": "grpc-traced"})
    wait_until(lambda: len(traces_of(server, "mlp")) > traced_before, 10, "the gRPC request's trace")
    assert traces_of(server, "mlp")[-1][0]["request_id"] == "grpc-traced"
    cleared = grpc.update_trace_settings("mlp", {"trace_level": None}, headers=AS_ADMIN, as_json=True)
    assert cleared["settings"]["trace_level"] == {"value": ["OFF"]}
    grpc.close()
