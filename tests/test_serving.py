"""Serving: dynamic batching over HTTP, LRU residency under a memory budget, several uvicorn workers."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import psutil
import pytest
import torch
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from torch import nn
from tritonclient.utils import InferenceServerException

from tests.client import expected, predict, sample, upload
from tests.models import MODELS, TestModel
from tests.servers import KilnServer, embedded_server, wait_until

MLP = MODELS["mlp"]


class Wide(nn.Module):
    """About 32 MB of float32 weights: big enough to see in the process RSS."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2048, 4096)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


class Slow(nn.Module):
    """One square layer applied 512 times: most of a second a call at batch 512 on one thread."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(256, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(512):
            x = torch.tanh(self.fc(x))
        return x


SLOW = TestModel("slow", Slow, [{"name": "x", "dtype": "float32", "shape": [-1, 256]}])


class Centered(nn.Module):
    """Each row less the batch's mean row: a row's answer depends on the batch's other rows."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x - x.mean(dim=0, keepdim=True)


CENTERED = TestModel("centered", Centered, [{"name": "x", "dtype": "float32", "shape": [-1, 4]}])

WIDE = [
    TestModel(f"wide{i}", Wide, [{"name": "x", "dtype": "float32", "shape": [-1, 2048]}]) for i in range(2)
]


def stats(http: httpx.Client, name: str) -> dict[str, object]:
    response = http.get(f"/v2/models/{name}/stats")
    assert response.status_code == 200, response.text
    found: dict[str, object] = response.json()["model_stats"][0]
    return found


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KilnServer]:
    # Budget for one Wide model, not two: loading the second evicts the first.
    with embedded_server(
        tmp_path_factory.mktemp("serving"), KILN_RUNTIME_MAX_MB="48", KILN_THREADS="1"
    ) as srv:
        yield srv


async def burst(url: str, name: str, xs: list[np.ndarray]) -> list[httpx.Response]:
    """All of `xs` at once, one batch-1 request each."""
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        return await asyncio.gather(
            *(client.post(f"/v1/models/{name}/predict", json={"inputs": {"x": x.tolist()}}) for x in xs)
        )


def test_concurrent_requests_are_batched_and_split_back_exactly(
    http: httpx.Client, server: KilnServer
) -> None:
    response = upload(http, MLP, name="batched", max_batch_size=16, max_queue_delay_us=20000, backends=[])
    assert response.status_code == 202, response.text
    xs = [sample(MLP, 1, seed=i) for i in range(32)]
    predict(http, "batched", xs[0])  # load the runner first, so the burst below is all batching

    before = stats(http, "batched")
    responses = asyncio.run(burst(server.url, "batched", xs))
    after = stats(http, "batched")
    executions = int(after["execution_count"]) - int(before["execution_count"])  # type: ignore[call-overload]
    inferred = int(after["inference_count"]) - int(before["inference_count"])  # type: ignore[call-overload]
    assert inferred == 32
    assert executions < 32
    assert max(b["batch_size"] for b in after["batch_stats"]) > 1  # type: ignore[attr-defined]
    # Triton's statistics: per request, its queue time apart from its batch's compute.
    computed = {"success", "fail", "queue", "compute_input", "compute_infer", "compute_output"}
    phases = {*computed, "cache_hit", "cache_miss"}
    infer_before: dict[str, dict[str, int]] = before["inference_stats"]  # type: ignore[assignment]
    infer_after: dict[str, dict[str, int]] = after["inference_stats"]  # type: ignore[assignment]
    assert set(infer_after) == phases
    grew = {k: (infer_after[k]["count"] - infer_before[k]["count"]) for k in phases}
    assert grew == {**dict.fromkeys(phases, 32), "fail": 0, "cache_hit": 0, "cache_miss": 0}
    queued_ns = infer_after["queue"]["ns"] - infer_before["queue"]["ns"]
    assert queued_ns > 20_000_000  # 32 requests queue behind each other's batches
    batch_stats: list[dict[str, dict[str, int]]] = after["batch_stats"]  # type: ignore[assignment]
    assert sum(b["compute_infer"]["count"] for b in batch_stats) == after["execution_count"]
    for x, r in zip(xs, responses, strict=True):
        assert r.status_code == 200, r.text
        # Equal to the model run alone at batch 1, up to float summation order.
        np.testing.assert_allclose(r.json()["outputs"]["output0"], expected(MLP, x), rtol=1e-5, atol=1e-6)


def test_a_model_whose_rows_depend_on_each_other_is_never_batched(
    http: httpx.Client, server: KilnServer
) -> None:
    """Merged, its requests would get each other's data: the upload finds its rows are not
    apart, and each request runs alone, though batching is on by default."""
    response = upload(http, CENTERED, max_queue_delay_us=20_000, backends=[])
    assert response.status_code == 202, response.text
    [output] = http.get("/v1/models/centered/versions/1").json()["outputs"]
    assert (output["shape"], output["rows_apart"]) == ([-1, 4], False)
    assert http.get("/v2/models/centered/config").json()["max_batch_size"] == 0
    xs = [np.full((1, 4), i, np.float32) for i in range(16)]
    responses = asyncio.run(burst(server.url, "centered", xs))
    for r in responses:
        assert r.status_code == 200, r.text
        assert r.json()["outputs"]["output0"] == [[0.0] * 4]  # its own mean: never another's
    assert [b["batch_size"] for b in stats(http, "centered")["batch_stats"]] == [1]  # type: ignore[attr-defined]
    # KServe V1's instances, which Kiln runs as batches of up to max_batch_size: here each alone.
    instances = http.post("/v1/models/centered:predict", json={"instances": [[1.0] * 4, [3.0] * 4]})
    assert instances.status_code == 200, instances.text
    assert instances.json()["predictions"] == [[0.0] * 4, [0.0] * 4]
    # The MLP's rows are its own.
    assert upload(http, MLP, name="rows-apart", backends=[]).status_code == 202
    [mlp] = http.get("/v1/models/rows-apart/versions/1").json()["outputs"]
    assert mlp["rows_apart"] is True


def test_unbatched_requests_run_alone_and_are_counted(http: httpx.Client, server: KilnServer) -> None:
    # max_batch_size 1: no batcher queue, the runtime runs each request in its inference threads.
    response = upload(http, MLP, name="single", max_batch_size=1, backends=[])
    assert response.status_code == 202, response.text
    xs = [sample(MLP, 1, seed=i) for i in range(16)]
    predict(http, "single", xs[0])

    before = stats(http, "single")
    responses = asyncio.run(burst(server.url, "single", xs))
    after = stats(http, "single")
    for key in ("inference_count", "execution_count"):
        assert int(after[key]) - int(before[key]) == 16, key  # type: ignore[call-overload]
    assert [b["batch_size"] for b in after["batch_stats"]] == [1]  # type: ignore[attr-defined]
    for x, r in zip(xs, responses, strict=True):
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(r.json()["outputs"]["output0"], expected(MLP, x), rtol=1e-5, atol=1e-6)


def test_dynamic_batching_off_runs_each_request_alone(http: httpx.Client, server: KilnServer) -> None:
    """dynamic_batching false, at upload and as a PATCH sets it live: requests of up to
    max_batch_size rows each run alone, never merged; true again, they merge."""
    name = "rows-alone"
    config = {"max_batch_size": 8, "max_queue_delay_us": 20_000, "dynamic_batching": False, "backends": []}
    assert upload(http, MLP, name=name, **config).status_code == 202
    xs = [sample(MLP, 2, seed=i) for i in range(16)]
    predict(http, name, xs[0])

    def runs_of_a_burst() -> int:
        before = stats(http, name)
        responses = asyncio.run(burst(server.url, name, xs))
        after = stats(http, name)
        for x, r in zip(xs, responses, strict=True):
            assert r.status_code == 200, r.text
            np.testing.assert_allclose(r.json()["outputs"]["output0"], expected(MLP, x), rtol=1e-5, atol=1e-6)
        assert int(after["inference_count"]) - int(before["inference_count"]) == 32  # type: ignore[call-overload]
        return int(after["execution_count"]) - int(before["execution_count"])  # type: ignore[call-overload]

    assert runs_of_a_burst() == 16
    path = f"/v1/models/{name}/versions/1/serving"
    assert http.patch(path, json={"dynamic_batching": True}).json()["serving"]["dynamic_batching"] is True
    predict(http, name, xs[0])  # reads the route again, which applies the change
    assert runs_of_a_burst() < 16
    assert http.patch(path, json={"dynamic_batching": False}).status_code == 200
    predict(http, name, xs[0])
    assert runs_of_a_burst() == 16


def rss_mb(server: KilnServer) -> float:
    return float(psutil.Process(server.pid).memory_info().rss) / 2**20


def test_lru_evicts_under_budget_and_reloads(http: httpx.Client, server: KilnServer) -> None:
    for model in WIDE:
        assert upload(http, model, max_batch_size=2, backends=[]).status_code == 202
    x = np.random.default_rng(0).standard_normal((1, 2048)).astype(np.float32)
    first, second = WIDE

    def run(model: TestModel) -> None:
        response = predict(http, model.name, x)
        assert response.status_code == 200, response.text
        np.testing.assert_allclose(
            response.json()["outputs"]["output0"], expected(model, x), rtol=1e-4, atol=1e-4
        )

    run(first)
    with_first = rss_mb(server)
    run(second)  # over budget: the first is evicted, so RSS grows by far less than a model
    with_second = rss_mb(server)
    assert with_second - with_first < 16, (with_first, with_second)
    run(first)  # reloaded from the store after its eviction, and correct
    assert http.post(f"/v2/repository/models/{first.name}/unload").status_code == 200
    wait_until(lambda: rss_mb(server) < with_second - 20, 10, "RSS to drop after unloading")
    index = {m["name"]: m for m in http.post("/v2/repository/index", json={}).json()}
    unavailable = {"name": first.name, "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}
    assert index[first.name] == unavailable
    assert http.post(f"/v2/repository/models/{first.name}/load").status_code == 200
    run(first)


def test_several_uvicorn_workers_share_one_redis(tmp_path: Path, redis_url: str) -> None:
    srv = KilnServer({"KILN_REDIS_URL": redis_url}, tmp_path / "kiln.log", workers=2)
    srv.start()
    try:
        with httpx.Client(base_url=srv.url, timeout=120) as http:
            assert upload(http, MLP, backends=[]).status_code == 202
            x = sample(MLP, 3)
            want = expected(MLP, x)
            for _ in range(20):  # new connections spread over both worker processes
                with httpx.Client(base_url=srv.url, timeout=60) as fresh:
                    response = predict(fresh, "mlp", x)
                    assert response.status_code == 200, response.text
                    np.testing.assert_allclose(response.json()["outputs"]["output0"], want, rtol=1e-5)
            assert json.loads(http.get("/v1/models").text)["models"][0]["name"] == "mlp"
            # Both processes listen for gRPC on the one port: new channels reach either.
            for _ in range(10):
                grpc_client = triton_grpc.InferenceServerClient(srv.grpc_address)
                tensor = triton_grpc.InferInput("x", list(x.shape), "FP32")
                tensor.set_data_from_numpy(x)
                got = grpc_client.infer("mlp", [tensor]).as_numpy("output0")
                np.testing.assert_allclose(got, want, rtol=1e-5)
                grpc_client.close()
            assert "Errno" not in srv.log.read_text() and "cannot listen" not in srv.log.read_text()

            def answers() -> set[tuple[int, int | None]]:
                """Status and version of predictions over new connections, which spread over
                both processes."""
                found = set()
                for _ in range(10):
                    with httpx.Client(base_url=srv.url, timeout=60) as fresh:
                        response = predict(fresh, "mlp", x)
                        found.add((response.status_code, response.json().get("model_version")))
                return found

            # Received by one process, an unload reaches the other through Redis: once the route
            # it cached expires, neither serves the model until it is loaded again.
            assert http.post("/v2/repository/models/mlp/unload").status_code == 200
            wait_until(lambda: answers() == {(409, None)}, 10, "both processes to refuse the unloaded model")
            assert http.get("/v1/models/mlp").json()["unloaded"] is True
            assert http.post("/v2/repository/models/mlp/load").status_code == 200
            wait_until(lambda: answers() == {(200, 1)}, 10, "both processes to serve it again")

            # So does a default version: a rollback holds on both once the newer version serves.
            assert upload(http, MLP, max_batch_size=4, backends=[]).status_code == 202
            wait_until(lambda: answers() == {(200, 2)}, 10, "both processes to serve version 2")
            pinned = http.put("/v1/models/mlp/default-version", json={"version": 1})
            assert pinned.status_code == 200, pinned.text
            wait_until(lambda: answers() == {(200, 1)}, 10, "both processes to roll back to version 1")
    finally:
        srv.stop()


def pending(http: httpx.Client, name: str) -> float:
    """kiln_pending_requests for a model, from /metrics."""
    for line in http.get("/metrics").text.splitlines():
        if line.startswith(f'kiln_pending_requests{{model="{name}"}}'):
            return float(line.split()[-1])
    return 0.0


TritonClients = tuple[triton_http.InferenceServerClient, triton_grpc.InferenceServerClient]


@pytest.fixture
def triton_clients(server: KilnServer) -> Iterator[TritonClients]:
    clients = (
        triton_http.InferenceServerClient(server.url.removeprefix("http://")),
        triton_grpc.InferenceServerClient(server.grpc_address),
    )
    yield clients
    for client in clients:
        client.close()


def triton_inputs(x: np.ndarray) -> list[triton_http.InferInput | triton_grpc.InferInput]:
    """`x` as the input tensor of each client: HTTP's first."""
    tensors = [
        triton_http.InferInput("x", list(x.shape), "FP32"),
        triton_grpc.InferInput("x", list(x.shape), "FP32"),
    ]
    for tensor in tensors:
        tensor.set_data_from_numpy(x)
    return tensors


def v2_binary(url: str, x: np.ndarray, name: str) -> httpx.Response:
    tensor = {"name": "x", "shape": list(x.shape), "datatype": "FP32"}
    inputs = [{**tensor, "parameters": {"binary_data_size": x.nbytes}}]
    header = json.dumps({"inputs": inputs, "parameters": {"binary_data_output": True}}).encode()
    return httpx.post(
        f"{url}/v2/models/{name}/infer",
        content=header + x.tobytes(),
        headers={"Inference-Header-Content-Length": str(len(header))},
        timeout=120,
    )


def test_a_full_queue_answers_503_with_retry_after_in_each_protocol(
    http: httpx.Client, server: KilnServer
) -> None:
    """max_queue_size 1: while one long request runs, the next is refused at once, with the
    status and Retry-After TorchServe's and Triton's clients know, and nothing is lost."""
    assert upload(http, SLOW, max_batch_size=512, max_queue_size=1, backends=[]).status_code == 202
    small = sample(SLOW, 1)
    assert predict(http, SLOW.name, small).status_code == 200  # loaded
    big = sample(SLOW, 512)
    with ThreadPoolExecutor(1) as pool:
        long_request = pool.submit(v2_binary, server.url, big, SLOW.name)
        wait_until(lambda: pending(http, SLOW.name) == 1, 30, "the long request to be in flight")
        refused_v1 = predict(http, SLOW.name, small)
        refused_v2 = v2_binary(server.url, small, SLOW.name)
        answered = long_request.result()
    assert refused_v1.status_code == 503 and refused_v1.headers["retry-after"] == "1"
    assert "max_queue_size" in refused_v1.json()["detail"]
    assert refused_v2.status_code == 503 and refused_v2.headers["retry-after"] == "1"
    assert "max_queue_size" in refused_v2.json()["error"]
    assert answered.status_code == 200, answered.text
    length = int(answered.headers["inference-header-content-length"])
    got = np.frombuffer(answered.content[length:], np.float32).reshape(big.shape)
    np.testing.assert_allclose(got, expected(SLOW, big), rtol=1e-4, atol=1e-5)
    assert pending(http, SLOW.name) == 0
    assert predict(http, SLOW.name, small).status_code == 200
    counts = {k: v["count"] for k, v in stats(http, SLOW.name)["inference_stats"].items()}  # type: ignore[attr-defined]
    assert (counts["success"], counts["fail"]) == (3, 2)  # the statistics extension counts the refusals


def cache_counts(http: httpx.Client, name: str) -> tuple[int, int, int]:
    """Response-cache hits and misses, and executions, from the model's v2 statistics."""
    found = stats(http, name)
    inference = found["inference_stats"]
    assert isinstance(inference, dict)
    executions = int(str(found["execution_count"]))
    return inference["cache_hit"]["count"], inference["cache_miss"]["count"], executions


def test_the_response_cache_answers_repeated_inputs_without_running(
    http: httpx.Client, server: KilnServer
) -> None:
    name = "mlp-cached"
    assert upload(http, MLP, name=name, response_cache=True, backends=[]).status_code == 202
    assert http.get(f"/v2/models/{name}/config").json()["response_cache"] == {"enable": True}
    x, other = sample(MLP, 2), sample(MLP, 2) + 1
    first = predict(http, name, x).json()
    assert cache_counts(http, name) == (0, 1, 1)
    again = predict(http, name, x).json()
    assert again == first  # the same numbers and the variant that computed them
    np.testing.assert_allclose(again["outputs"]["output0"], expected(MLP, x), rtol=1e-5, atol=1e-6)
    assert cache_counts(http, name) == (1, 1, 1)  # answered, not run
    assert predict(http, name, other).status_code == 200
    assert predict(http, name, x[:1]).status_code == 200  # another shape is another key
    assert predict(http, name, x, backend="torchscript").status_code == 200  # pinned: never cached
    assert cache_counts(http, name) == (1, 3, 4)
    # The same answer in every protocol, from the read-only arrays the hits share.
    binary = v2_binary(server.url, x, name)
    header_length = int(binary.headers["inference-header-content-length"])
    got = np.frombuffer(binary.content[header_length:], np.float32).reshape(2, 10)
    np.testing.assert_array_equal(got, np.asarray(first["outputs"]["output0"], np.float32))
    grpc_client = triton_grpc.InferenceServerClient(server.grpc_address)
    tensor = triton_grpc.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    np.testing.assert_array_equal(grpc_client.infer(name, [tensor]).as_numpy("output0"), got)
    grpc_client.close()
    assert cache_counts(http, name) == (3, 3, 4)
    samples = http.get("/metrics").text
    assert f'kiln_response_cache_lookups_total{{model="{name}",result="hit"}} 3.0' in samples

    # An unload drops the model's answers with its runners.
    assert http.post(f"/v2/repository/models/{name}/unload").status_code == 200
    assert http.post(f"/v2/repository/models/{name}/load").status_code == 200
    assert predict(http, name, x).status_code == 200
    assert cache_counts(http, name) == (3, 4, 5)
    # A model that did not opt in runs every request.
    assert upload(http, MLP, name="mlp-uncached", backends=[]).status_code == 202
    for _ in range(2):
        assert predict(http, "mlp-uncached", x).status_code == 200
    assert cache_counts(http, "mlp-uncached") == (0, 0, 2)


def test_a_request_past_its_timeout_gets_503_in_each_protocol(
    http: httpx.Client, server: KilnServer, triton_clients: TritonClients
) -> None:
    """Triton's queue policy: behind a long batch, a request past its timeout (its own `timeout`
    parameter, or its model's default_timeout_us when shorter) is answered at once, never run."""
    name = "slow-timeout"
    config = {"max_batch_size": 512, "default_timeout_us": 60_000_000, "backends": []}
    assert upload(http, SLOW, name=name, **config).status_code == 202
    policy = http.get(f"/v2/models/{name}/config").json()["dynamic_batching"]["default_queue_policy"]
    assert policy["default_timeout_microseconds"] == 60_000_000 and policy["allow_timeout_override"] is True
    small = sample(SLOW, 1)
    http_client, grpc_client = triton_clients
    tensors = triton_inputs(small)

    def with_timeout(timeout_us: int) -> httpx.Response:
        tensor = {"name": "x", "shape": [1, 256], "datatype": "FP32", "data": small.ravel().tolist()}
        body = {"inputs": [tensor], "parameters": {"timeout": timeout_us}}
        return httpx.post(f"{server.url}/v2/models/{name}/infer", json=body, timeout=120)

    assert predict(http, name, small).status_code == 200  # loaded
    with ThreadPoolExecutor(2) as pool:
        long_request = pool.submit(v2_binary, server.url, sample(SLOW, 512), name)
        wait_until(lambda: pending(http, name) == 1, 30, "the long request to be in flight")
        with pytest.raises(InferenceServerException, match="timeout expired") as over_http:
            http_client.infer(name, [tensors[0]], timeout=1_000)
        with pytest.raises(InferenceServerException, match="timeout expired") as over_grpc:
            grpc_client.infer(name, [tensors[1]], timeout=1_000)
        over_json = with_timeout(1_000)
        body = {"inputs": {"x": small.tolist()}}
        over_v1 = http.post(f"/v1/models/{name}/predict", json=body, params={"timeout_us": 1_000})
        patient = pool.submit(with_timeout, 0)  # 0 sets none: the model's minute applies
        assert long_request.result().status_code == 200
        got = np.asarray(patient.result().json()["outputs"][0]["data"], np.float32).reshape(1, 256)
        np.testing.assert_allclose(got, expected(SLOW, small), rtol=1e-4, atol=1e-5)
    assert over_http.value.status() == "503"
    assert over_grpc.value.status() == "StatusCode.UNAVAILABLE"
    assert over_json.status_code == 503 and "timeout expired" in over_json.json()["error"]
    assert over_v1.status_code == 503 and "timeout expired" in over_v1.json()["detail"]
    counts = {k: v["count"] for k, v in stats(http, name)["inference_stats"].items()}  # type: ignore[attr-defined]
    assert (counts["success"], counts["fail"]) == (3, 4)
    assert stats(http, name)["inference_count"] == 1 + 512 + 1  # the four refused never ran
    negative = http.post(f"/v1/models/{name}/predict", json=body, params={"timeout_us": -1})
    assert negative.status_code == 422 and "timeout_us" in negative.text
    too_long = with_timeout(2**70).json()["error"]
    assert too_long.startswith("parameter timeout must be an integer of microseconds from 0 to")

    # A model's own default: a microsecond passes before
    # any request of this one is queued, so every one is refused, and none runs.
    strict = {"max_batch_size": 1, "default_timeout_us": 1, "backends": []}
    assert upload(http, SLOW, name="slow-strict", **strict).status_code == 202
    refused = predict(http, "slow-strict", small)
    assert refused.status_code == 503 and "timeout expired" in refused.json()["detail"]
    assert stats(http, "slow-strict")["inference_count"] == 0


def test_serving_settings_change_in_place_without_a_recompile(http: httpx.Client, server: KilnServer) -> None:
    """PATCH .../serving: a serving version's queue limit, batching delay and response cache
    change at once, with no new version and no compile; null restores the server default, and
    what only a recompile could change is refused with a 422 that says so."""
    name = "slow-live"
    assert upload(http, SLOW, name=name, max_batch_size=512, backends=[]).status_code == 202
    small, big = sample(SLOW, 1), sample(SLOW, 512)
    assert predict(http, name, small).status_code == 200  # serving, through its batcher
    path = f"/v1/models/{name}/versions/1/serving"
    changed = http.patch(path, json={"max_queue_size": 1, "max_queue_delay_us": 1000, "response_cache": True})
    assert changed.status_code == 200, changed.text
    assert changed.json()["serving"] == {
        "dynamic_batching": True,
        "max_queue_delay_us": 1000,
        "preferred_batch_sizes": [],
        "max_queue_size": 1,
        "default_timeout_us": None,
        "response_cache": True,
        "adaptive_queue_delay": True,
        "priority_levels": 0,
        "default_priority_level": None,
        "instances": 1,
        "labels": {},
    }
    [version] = http.get(f"/v1/models/{name}").json()["versions"]
    assert version["serving"] == changed.json()["serving"]
    config = http.get(f"/v2/models/{name}/config").json()
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 1000
    assert config["dynamic_batching"]["default_queue_policy"]["max_queue_size"] == 1
    assert config["response_cache"] == {"enable": True}
    with ThreadPoolExecutor(1) as pool:
        long_request = pool.submit(v2_binary, server.url, big, name)
        wait_until(lambda: pending(http, name) == 1, 30, "the long request to be in flight")
        refused = predict(http, name, small)
        assert long_request.result().status_code == 200
    assert refused.status_code == 503 and "max_queue_size" in refused.json()["detail"]
    assert predict(http, name, small).json() == predict(http, name, small).json()
    assert cache_counts(http, name)[0] == 1

    reset = http.patch(
        path, json={"max_queue_size": None, "response_cache": None, "preferred_batch_sizes": [4]}
    )
    assert reset.status_code == 200, reset.text
    serving = reset.json()["serving"]
    assert (serving["max_queue_size"], serving["response_cache"]) == (None, False)
    assert serving["preferred_batch_sizes"] == [4]
    assert serving["max_queue_delay_us"] == 1000  # left out: kept
    policy = http.get(f"/v2/models/{name}/config").json()["dynamic_batching"]["default_queue_policy"]
    assert policy["max_queue_size"] == 1024  # KILN_MAX_QUEUE_SIZE
    assert predict(http, name, small).status_code == 200
    assert cache_counts(http, name)[0] == 1  # off: no new hit
    assert http.patch(path, json={}).json()["serving"] == serving  # nothing to change

    for body, message in (
        ({"max_batch_size": 8}, "max_batch_size: fixed at upload, where the variants were compiled"),
        ({"bogus": 1}, "unknown setting(s) ['bogus']; the serving settings are ['dynamic_batching', "),
        (
            {"preferred_batch_sizes": [1024]},
            "preferred_batch_sizes: [1024] must lie in 1..max_batch_size (512)",
        ),
        ({"max_queue_delay_us": -1}, "max_queue_delay_us"),
    ):
        refused = http.patch(path, json=body)
        assert refused.status_code == 422, refused.text
        assert message in refused.json()["detail"], refused.text
    assert http.patch(f"/v1/models/{name}/versions/7/serving", json={"max_queue_size": 3}).status_code == 404

    # The same upload again is the same version, with the upload's serving settings, whatever
    # was changed since; one that differs only in them is the same version too, not a compile.
    again = upload(http, SLOW, name=name, max_batch_size=512, backends=[])
    assert again.status_code == 200 and again.json()["deduplicated"] is True, again.text
    restored = {**serving, "max_queue_delay_us": None, "preferred_batch_sizes": []}
    assert http.get(f"/v1/models/{name}/versions/1").json()["serving"] == restored
    tuned = upload(http, SLOW, name=name, max_batch_size=512, backends=[], max_queue_delay_us=5000)
    assert tuned.status_code == 200 and tuned.json()["version"] == 1, tuned.text
    batching = http.get(f"/v2/models/{name}/config").json()["dynamic_batching"]
    assert batching["max_queue_delay_microseconds"] == 5000
    waits = http.patch(path, json={"adaptive_queue_delay": False})
    assert waits.status_code == 200 and waits.json()["serving"]["adaptive_queue_delay"] is False
    parameters = http.get(f"/v2/models/{name}/config").json()["parameters"]
    assert parameters == {"adaptive_queue_delay": {"string_value": "false"}}
    assert len(http.get(f"/v1/models/{name}").json()["versions"]) == 1


def test_higher_priority_requests_are_batched_first(
    http: httpx.Client, server: KilnServer, triton_clients: TritonClients
) -> None:
    """Triton's priority levels: behind six long batches, requests of priority 1 (tritonclient's
    `priority` over HTTP and gRPC, and /v1's ?priority=) form a batch of their own before a
    request that arrived earlier at the default level, 2: in arrival order the first of them
    would have joined it."""
    name = "slow-priority"
    config = {"max_batch_size": 512, "priority_levels": 2, "backends": []}
    assert upload(http, SLOW, name=name, **config).status_code == 202
    batching = http.get(f"/v2/models/{name}/config").json()["dynamic_batching"]
    assert (batching["priority_levels"], batching["default_priority_level"]) == (2, 2)  # the lowest
    small = sample(SLOW, 1)
    http_client, grpc_client = triton_clients
    tensors = triton_inputs(small)
    v1_body = {"inputs": {"x": small.tolist()}}

    assert predict(http, name, small).status_code == 200  # loaded
    with ThreadPoolExecutor(10) as pool:
        # Each long batch takes 0.1-0.3 s here: the others queue behind them.
        long_requests = [pool.submit(v2_binary, server.url, sample(SLOW, 512), name) for _ in range(6)]
        wait_until(lambda: pending(http, name) == 6, 30, "the long requests to be in flight", 0.01)
        low = pool.submit(v2_binary, server.url, sample(SLOW, 511), name)
        wait_until(lambda: pending(http, name) == 7, 30, "the low-priority request to queue", 0.01)
        high = [
            pool.submit(http_client.infer, name, [tensors[0]], priority=1),
            pool.submit(grpc_client.infer, name, [tensors[1]], priority=1),
        ]
        v1 = pool.submit(http.post, f"/v1/models/{name}/predict", json=v1_body, params={"priority": 1})
        assert all(r.result().status_code == 200 for r in [*long_requests, low, v1])
        for future in high:
            future.result()
    sizes = {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stats(http, name)["batch_stats"]}  # type: ignore[attr-defined]
    # The 511 ran alone: in arrival order the first request of priority 1 would have joined it,
    # a seventh batch of 512. The three of priority 1 ran in one batch or more, as they arrived.
    assert (sizes[512], sizes.get(511)) == (6, 1), sizes

    bad = {"inputs": [{"name": "x", "shape": [1, 256], "datatype": "FP32", "data": small.ravel().tolist()}]}
    refused = http.post(f"/v2/models/{name}/infer", json={**bad, "parameters": {"priority": -1}})
    assert refused.status_code == 400 and "priority must be a non-negative integer" in refused.json()["error"]
    negative = http.post(f"/v1/models/{name}/predict", json=v1_body, params={"priority": -1})
    assert negative.status_code == 422 and "priority" in negative.json()["detail"]
    path = f"/v1/models/{name}/versions/1/serving"
    assert http.patch(path, json={"default_priority_level": 2}).status_code == 200
    fewer = http.patch(path, json={"priority_levels": 1})
    assert fewer.status_code == 422, fewer.text
    assert "default_priority_level: 2 must lie in 1..priority_levels (1)" in fewer.json()["detail"]
    off = http.patch(path, json={"priority_levels": 0})  # as Triton, a default is then ignored
    assert off.status_code == 200, off.text
    assert "priority_levels" not in http.get(f"/v2/models/{name}/config").json()["dynamic_batching"]
    beyond = upload(
        http, SLOW, name="slow-unranked", priority_levels=2, default_priority_level=3, backends=[]
    )
    assert beyond.status_code == 422 and "config.default_priority_level: 3 must lie in" in beyond.text


def test_requests_whose_clients_hung_up_are_not_run(http: httpx.Client, server: KilnServer) -> None:
    """Under overload clients give up: requests that wait behind long batches, whose clients
    close their connections meanwhile (over v2, the native predict and KServe V1), do not run
    when their turn comes; the requests still wanted do."""
    name = "slow-abandoned"
    assert upload(http, SLOW, name=name, max_batch_size=512, backends=[]).status_code == 202
    small = sample(SLOW, 1)
    assert predict(http, name, small).status_code == 200  # loaded
    tensor = {"name": "x", "shape": [1, 256], "datatype": "FP32", "data": small.ravel().tolist()}
    abandoned = {
        f"/v2/models/{name}/infer": {"inputs": [tensor]},
        f"/v1/models/{name}/predict": {"inputs": {"x": small.tolist()}},
        f"/v1/models/{name}:predict": {"instances": small.tolist()},
    }
    with ThreadPoolExecutor(4) as pool:
        long_requests = [pool.submit(v2_binary, server.url, sample(SLOW, 512), name) for _ in range(3)]
        wait_until(lambda: pending(http, name) == 3, 30, "the long requests to be in flight", 0.01)
        for path, body in abandoned.items():
            with pytest.raises(httpx.ReadTimeout):  # the client gives up, and closes its connection
                httpx.post(f"{server.url}{path}", json=body, timeout=httpx.Timeout(30, read=0.1))
        wanted = pool.submit(v2_binary, server.url, small, name)
        assert all(r.result().status_code == 200 for r in [*long_requests, wanted])
    sizes = {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stats(http, name)["batch_stats"]}  # type: ignore[attr-defined]
    # The load's request and the one still wanted ran alone; the three abandoned ones not at all.
    assert sizes == {512: 3, 1: 2}, sizes
    assert stats(http, name)["inference_stats"]["fail"]["count"] == 3  # type: ignore[index]
