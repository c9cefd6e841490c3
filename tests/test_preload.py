"""KILN_LOAD_MODELS: a starting server loads and warms up its models before it reports ready."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import tritonclient.grpc as triton_grpc
from torch import nn

from tests.client import predict, sample, scrape, upload, value
from tests.models import MODELS, TestModel
from tests.servers import KilnServer, RedisServer, running, wait_until

MLP = MODELS["mlp"]
# About 1.6 MB of weights: a 2 MB runtime budget holds one of them.
MEDIUM = TestModel("medium", lambda: nn.Linear(64, 6144), MLP.inputs)


def detail(response: httpx.Response) -> str:
    assert response.status_code == 503, response.text
    found: str = response.json()["detail"]
    return found


def ready(http: httpx.Client) -> bool:
    return http.get("/readyz").status_code == 200


def test_a_starting_server_loads_every_model_before_it_is_ready(tmp_path: Path) -> None:
    """With "*", every model but an unloaded one; a store that is down at the start is waited
    for, and readiness says so on every protocol meanwhile."""
    redis_server = RedisServer(tmp_path)
    first = KilnServer({"KILN_REDIS_URL": redis_server.url}, tmp_path / "first.log")
    x = sample(MLP, 2)
    try:
        with running(redis_server, first), httpx.Client(base_url=first.url, timeout=60) as http:
            for name, model in (("mlp", MLP), ("cnn", MODELS["cnn"]), ("idle", MLP)):
                assert upload(http, model, name=name, backends=[]).status_code == 202
            assert http.post("/v2/repository/models/idle/unload").status_code == 200
            want = predict(http, "mlp", x).json()["outputs"]
        # `running` stopped Redis too: the next server starts without its store.
        env = {"KILN_REDIS_URL": redis_server.url, "KILN_LOAD_MODELS": "*"}
        server = KilnServer(env, tmp_path / "kiln.log")
        with running(server), httpx.Client(base_url=server.url, timeout=60) as http:
            wait_until(lambda: "waiting for the store" in detail(http.get("/readyz")), 10, "the wait")
            assert "loading models at startup: " in detail(http.get("/readyz"))
            not_ready = http.get("/v2/health/ready")
            assert not_ready.status_code == 400
            assert "loading models at startup" in not_ready.json()["error"]
            with triton_grpc.InferenceServerClient(server.grpc_address) as grpc_client:
                assert not grpc_client.is_server_ready()
            redis_server.start()
            wait_until(lambda: ready(http), 60, "readiness")
            # Before any request: mlp and cnn, one TorchScript runner each for batch 1 and 8.
            assert value(scrape(http), "kiln_loaded_runners") == 2
            log = server.log.read_text()
            for name in ("mlp", "cnn"):
                assert re.search(rf"model '{name}' is loaded and warmed up in [0-9.]+ s: torchscript", log)
            assert "'idle'" not in log
            assert "loaded 2 of 2 model(s) at startup" in log
            assert predict(http, "mlp", x).json()["outputs"] == want
    finally:
        redis_server.stop()


def test_models_it_cannot_load_do_not_hold_up_readiness(tmp_path: Path) -> None:
    """An unknown name is logged and skipped, and a name given twice loads once. Preloading
    stops at the first model that evicts another from the runtime's budget: the rest load on
    their first request."""
    data = {"KILN_DATA_DIR": str(tmp_path / "data")}
    first = KilnServer(data, tmp_path / "first.log")
    with running(first), httpx.Client(base_url=first.url, timeout=60) as http:
        assert upload(http, MLP, backends=[]).status_code == 202
        for name in "abc":
            assert upload(http, MEDIUM, name=name, backends=[]).status_code == 202
    named = KilnServer({**data, "KILN_LOAD_MODELS": "missing, mlp,mlp"}, tmp_path / "named.log")
    with running(named), httpx.Client(base_url=named.url, timeout=60) as http:
        wait_until(lambda: ready(http), 60, "readiness")
        assert value(scrape(http), "kiln_loaded_runners") == 1
        log = named.log.read_text()
        assert "model 'missing' is not loaded at startup: no model named 'missing'" in log
        assert log.count("model 'mlp' is loaded and warmed up") == 1
        assert "loaded 1 of 2 model(s) at startup" in log
    env = {**data, "KILN_LOAD_MODELS": "a,b,c", "KILN_RUNTIME_MAX_MB": "2"}
    full = KilnServer(env, tmp_path / "full.log")
    with running(full), httpx.Client(base_url=full.url, timeout=60) as http:
        wait_until(lambda: ready(http), 60, "readiness")
        assert value(scrape(http), "kiln_loaded_runners") == 1  # b, which evicted a
        log = full.log.read_text()
        assert "KILN_RUNTIME_MAX_MB filled up with 'b': ['c'] will load on first request" in log
        assert "model 'c' is loaded" not in log
        assert predict(http, "c", sample(MEDIUM, 1)).status_code == 200
