"""KServe's V1 protocol, TensorFlow Serving's REST predict API, against a real server: kserve's
own InferenceRESTClient unchanged, instances in and predictions out, the columnar form, strict
JSON for NaN, and a 4xx `{"error"}` for every malformed request."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from torch import nn

from tests import models
from tests.client import expected, sample, upload
from tests.servers import ROOT, KilnServer
from tests.test_v2 import HEADS

ADMIN, INFER = "admin-secret", "infer-secret"
AUTH = {"Authorization": f"Bearer {INFER}"}
MLP = models.MODELS["mlp"]


class Log(nn.Module):
    """NaN for a negative input, -inf for zero: values that JSON has no numbers for."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x)


class Total(nn.Module):
    """One number for the whole batch: an output with no row per instance."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum()


class ColumnSums(nn.Module):
    """Three sums over the batch: a row of values per instance only when three instances come."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum(0)


class Prefix(nn.Module):
    """As many columns as the first value says: an output whose shape follows the values."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, : int(x[0, 0].item())]


LOG = models.TestModel("log", Log, [{"name": "x", "dtype": "float32", "shape": [-1, 3]}])
TOTAL = models.TestModel("total", Total, [{"name": "x", "dtype": "float32", "shape": [-1, 3]}])
# A fixed shape: no batch dimension to stack instances on.
FIXED = models.TestModel("fixed", Log, [{"name": "x", "dtype": "float32", "shape": [2, 3]}])
SUMS = models.TestModel("sums", ColumnSums, [{"name": "x", "dtype": "float32", "shape": [-1, 3]}])
PREFIX = models.TestModel("prefix", Prefix, [{"name": "x", "dtype": "float32", "shape": [-1, 3]}])
# Rows of any length, two to a batch.
ROWS = models.TestModel("rows", Log, [{"name": "x", "dtype": "float32", "shape": [-1, -1]}])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KilnServer]:
    root = tmp_path_factory.mktemp("kserve_v1")
    env = {
        "KILN_DATA_DIR": str(root / "data"),
        "KILN_API_KEYS": f"{ADMIN}:admin,{INFER}:infer",
        "KILN_MAX_UPLOAD_MB": "1",
    }
    srv = KilnServer(env, root / "kiln.log")
    srv.start()
    with httpx.Client(base_url=srv.url, timeout=60, headers={"Authorization": f"Bearer {ADMIN}"}) as admin:
        for model, config in (
            (MLP, {}),
            (HEADS, {}),
            (LOG, {}),
            (TOTAL, {"max_batch_size": 1}),
            (MLP, {"name": "single", "max_batch_size": 1}),
            (FIXED, {}),
            (SUMS, {}),
            (PREFIX, {"max_batch_size": 1}),
            (ROWS, {"max_batch_size": 2}),
        ):
            response = upload(admin, model, backends=[], **config)
            assert response.status_code == 202, response.text
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def http(server: KilnServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60, headers={"Authorization": f"Bearer {INFER}"}) as c:
        yield c


def heads(x: np.ndarray, k: np.ndarray) -> list[np.ndarray]:
    with torch.inference_mode():
        return [t.numpy() for t in HEADS.module()(torch.from_numpy(x), torch.from_numpy(k))]


def kserve(server: KilnServer, *calls: tuple[str, dict[str, Any]]) -> list[Any]:
    """The results of kserve's client calls (tests/kserve_client.py), in order."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.kserve_client", server.url],
        input=json.dumps(calls),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    results: list[Any] = json.loads(done.stdout)
    return results


def test_kserve_client_checks_liveness_and_readiness_and_predicts(server: KilnServer) -> None:
    x = sample(MLP, 3)
    xh, k = sample(HEADS, 2), np.arange(8, dtype=np.int64).reshape(2, 4)
    rows = [{"x": xh[i].tolist(), "k": k[i].tolist()} for i in range(2)]
    live, ready, mlp, two_heads, missing = kserve(
        server,
        ("is_server_live", {}),
        ("is_model_ready", {"model_name": "mlp", "headers": AUTH}),
        ("infer", {"data": {"instances": x.tolist()}, "model_name": "mlp", "headers": AUTH}),
        ("infer", {"data": {"instances": rows}, "model_name": "heads", "headers": AUTH}),
        ("infer", {"data": {"instances": x.tolist()}, "model_name": "nope", "headers": AUTH}),
    )
    assert live is True
    assert ready is True
    assert list(mlp) == ["predictions"]
    np.testing.assert_allclose(np.array(mlp["predictions"]), expected(MLP, x), rtol=1e-5, atol=1e-6)
    # A model of several outputs: one object of output name -> value per instance.
    y, positive, k_out = heads(xh, k)
    predictions = two_heads["predictions"]
    assert [sorted(p) for p in predictions] == [["output0", "output1", "output2"]] * 2
    for i, row in enumerate(predictions):
        np.testing.assert_allclose(row["output0"], y[i], rtol=1e-5, atol=1e-6)
        assert row["output1"] is bool(positive[i])
        assert row["output2"] == k_out[i].tolist()
    assert missing["status"] == 404
    assert "no model named 'nope'" in missing["message"]  # kserve's client shows the server's {"error"}


def test_readiness_follows_unload_and_load(server: KilnServer, http: httpx.Client) -> None:
    admin = {"Authorization": f"Bearer {ADMIN}"}
    ready = ("is_model_ready", {"model_name": "log", "headers": AUTH})
    assert http.get("/v1/models/log").json()["ready"] is True
    assert http.post("/v2/repository/models/log/unload", headers=admin).status_code == 200
    try:
        assert kserve(server, ready) == [False]
        response = http.post("/v1/models/log:predict", json={"instances": [[1.0, 2.0, 3.0]]})
        assert response.status_code == 409
        assert "/v2/repository/models/log/load" in response.json()["error"]
    finally:
        assert http.post("/v2/repository/models/log/load", headers=admin).status_code == 200
    assert kserve(server, ready) == [True]


def test_columnar_form_and_versions(http: httpx.Client) -> None:
    x = sample(MLP, 2)
    for path in ("/v1/models/mlp:predict", "/v1/models/mlp/versions/1:predict"):
        response = http.post(path, json={"inputs": x.tolist(), "signature_name": "serving_default"})
        assert response.status_code == 200, response.text
        assert list(response.json()) == ["outputs"]
        np.testing.assert_allclose(response.json()["outputs"], expected(MLP, x), rtol=1e-5, atol=1e-6)
    # A single-input model's instances may name their input too.
    named = http.post("/v1/models/mlp:predict", json={"instances": [{"x": row} for row in x.tolist()]})
    np.testing.assert_allclose(named.json()["predictions"], expected(MLP, x), rtol=1e-5, atol=1e-6)

    xh, k = sample(HEADS, 3), np.ones((3, 4), dtype=np.int64)
    response = http.post("/v1/models/heads:predict", json={"inputs": {"x": xh.tolist(), "k": k.tolist()}})
    assert response.status_code == 200, response.text
    outputs = response.json()["outputs"]
    y, positive, k_out = heads(xh, k)
    np.testing.assert_allclose(outputs["output0"], y, rtol=1e-5, atol=1e-6)
    assert outputs["output1"] == positive.tolist()
    assert outputs["output2"] == k_out.tolist()

    # An output with no row per instance, and inputs with no batch: the columnar form serves both.
    total = http.post("/v1/models/total:predict", json={"inputs": [[1.0, 2.0, 3.0]]})
    assert total.json() == {"outputs": 6.0}
    fixed = http.post("/v1/models/fixed:predict", json={"inputs": [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]})
    assert fixed.json() == {"outputs": [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]}


def test_instances_past_max_batch_size_run_in_batches(http: httpx.Client) -> None:
    """TensorFlow Serving's clients send any number of instances: past max_batch_size (8) they
    run as several batches, and come back as one list, in order."""
    x = sample(MLP, 20)
    body = {"instances": x.tolist(), "signature_name": "", "parameters": {"confidence": 0.5}}
    response = http.post("/v1/models/mlp:predict", json=body)
    assert response.status_code == 200, response.text
    np.testing.assert_allclose(response.json()["predictions"], expected(MLP, x), rtol=1e-5, atol=1e-6)
    bad = http.post("/v1/models/mlp:predict", json={"instances": [ROW] * 8 + [ROW[:5]] * 5})
    assert bad.status_code == 400 and "received [5, 5]" in bad.json()["error"]  # checked, not run


def test_instances_of_a_model_that_takes_one_at_a_time(http: httpx.Client) -> None:
    """max_batch_size 1: each instance runs alone, and its outputs' rows come back; the
    metadata shows their leading 1 as the batch's dimension, as Triton does."""
    x = sample(MLP, 3)
    response = http.post("/v1/models/single:predict", json={"instances": x.tolist()})
    assert response.status_code == 200, response.text
    np.testing.assert_allclose(response.json()["predictions"], expected(MLP, x), rtol=1e-5, atol=1e-6)
    [output] = http.get("/v2/models/single").json()["outputs"]
    assert output["shape"] == [-1, 10]


def test_instances_of_more_batches_than_the_queue_holds(server: KilnServer, http: httpx.Client) -> None:
    """A request's batches queue a few at a time: 13 of them pass a queue of 4, and leave room
    in it for other clients."""
    with httpx.Client(base_url=server.url, timeout=60, headers={"Authorization": f"Bearer {ADMIN}"}) as admin:
        response = upload(admin, MLP, "short-queue", backends=[], max_queue_size=4)
        assert response.status_code == 202, response.text
    x = sample(MLP, 100)
    response = http.post("/v1/models/short-queue:predict", json={"instances": x.tolist()})
    assert response.status_code == 200, response.text
    np.testing.assert_allclose(response.json()["predictions"], expected(MLP, x), rtol=1e-5, atol=1e-6)


def test_nan_and_infinity_are_null_in_strict_json(http: httpx.Client) -> None:
    response = http.post("/v1/models/log:predict", json={"instances": [[-1.0, 0.0, 1.0]]})
    assert response.status_code == 200, response.text

    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} is not JSON")

    assert json.loads(response.text, parse_constant=refuse) == {"predictions": [[None, None, 0.0]]}


def test_large_answers_are_compressed_when_asked(http: httpx.Client) -> None:
    x = sample(MLP, 8)
    response = http.post(
        "/v1/models/mlp:predict", json={"instances": x.tolist()}, headers={"Accept-Encoding": "gzip"}
    )
    assert response.headers["content-encoding"] == "gzip"
    np.testing.assert_allclose(response.json()["predictions"], expected(MLP, x), rtol=1e-5, atol=1e-6)


ROW = [0.5] * 64
BAD_REQUESTS: dict[str, tuple[str, Any, int, str]] = {
    "not JSON": ("mlp", b"{", 400, "the body must be an object of"),
    "both forms": ("mlp", {"instances": [ROW], "inputs": [ROW]}, 400, 'either "instances"'),
    "neither form": ("mlp", {}, 400, 'either "instances"'),
    "unknown key": ("mlp", {"instances": [ROW], "signature": "x"}, 400, "signature"),
    "other signature": ("mlp", {"instances": [ROW], "signature_name": "predict"}, 400, "serving_default"),
    "no instances": ("mlp", {"instances": []}, 400, '"instances" is empty'),
    "instances not a list": ("mlp", {"instances": ROW[0]}, 400, "valid array"),
    "ragged instances": ("mlp", {"instances": [ROW, ROW[:63]]}, 400, "ragged"),
    "wrong row shape": ("mlp", {"instances": [ROW[:5]]}, 400, "expected shape [-1, 64], received [1, 5]"),
    "columnar over max batch": ("mlp", {"inputs": [ROW] * 9}, 400, "max_batch_size 8"),
    "binary strings": ("mlp", {"instances": [{"b64": "AAAA"}]}, 400, 'binary {"b64": ...} values are not'),
    "unknown input name": ("mlp", {"instances": [{"y": ROW}]}, 400, "instance 0 has inputs ['y']"),
    "values for several inputs": ("heads", {"instances": [[0.5] * 4]}, 400, "give an object of input name"),
    "missing input": ("heads", {"instances": [{"x": [0.5] * 4}]}, 400, "the model takes ['x', 'k']"),
    "float for an integer": (
        "heads",
        {"inputs": {"x": [[0.5] * 4], "k": [[0.5] * 4]}},
        400,
        "expected dtype int64",
    ),
    "true among integers": (
        "heads",
        {"inputs": {"x": [[0.5] * 4], "k": [[True, 1, 1, 1]]}},
        400,
        "input 'k': expected dtype int64, received true/false among numbers",
    ),
    "a string among numbers": ("mlp", {"instances": [[*ROW[:63], "a"]]}, 400, "float32, received strings"),
    "an integer past uint64": (
        "heads",
        {"inputs": {"x": [[0.5] * 4], "k": [[2**65, 1, 1, 1]]}},
        400,
        "int64, received values that are not all numbers (null, objects, mixed kinds), or integers too large",
    ),
    "columnar values for several inputs": (
        "heads",
        {"inputs": [[0.5] * 4]},
        400,
        '"inputs": the model takes',
    ),
    "instances of fixed inputs": ("fixed", {"instances": [[1.0] * 3]}, 400, "no batch dimension"),
    "no row per instance": ("total", {"instances": [[1.0] * 3]}, 400, "send the columnar"),
    # Three instances would get the three sums as if one were each's: refused before it runs.
    "no row per instance, by chance": (
        "sums",
        {"instances": [[1.0] * 3] * 3},
        400,
        "output(s) ['output0[3]']",
    ),
    # Each batch of two takes its rows, but the batches make no one tensor: refused before any runs.
    "rows of two lengths in two batches": (
        "rows",
        {"instances": [[1.0, 2.0], [3.0, 4.0], [1.0, 2.0, 3.0]]},
        400,
        "input 'x': instances of one request make one tensor, but theirs have shapes [[2], [3]]",
    ),
    "outputs of two shapes in two batches": (
        "prefix",
        {"instances": [[1.0, 0.0, 0.0], [2.0, 0.0, 0.0]]},
        400,
        "output 'output0' has shapes [[1], [2]] in the batches the instances ran in",
    ),
    "unknown model": ("nope", {"instances": [ROW]}, 404, "'nope'"),
    "too large": ("mlp", b"[" + b"0.5," * 300_000 + b"0.5]", 413, "KILN_MAX_JSON_MB"),
}


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_malformed_requests_get_a_4xx_that_says_what_to_fix(http: httpx.Client, case: str) -> None:
    model, body, status, message = BAD_REQUESTS[case]
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = http.post(f"/v1/models/{model}:predict", content=content)
    assert response.status_code == status, response.text
    assert message in response.json()["error"]


def test_versions_and_keys_are_checked(http: httpx.Client, server: KilnServer) -> None:
    body = {"instances": [ROW]}
    assert (
        http.post("/v1/models/mlp/versions/x:predict", json=body)
        .json()["error"]
        .startswith("model version must be an integer")
    )
    assert http.post("/v1/models/mlp/versions/7:predict", json=body).status_code == 404
    anonymous = httpx.post(f"{server.url}/v1/models/mlp:predict", json=body)
    assert anonymous.status_code == 401
    assert "error" in anonymous.json()


def test_tensorflow_serving_metadata_describes_the_signature(http: httpx.Client) -> None:
    """TensorFlow Serving's GetModelMetadata as JSON: the serving_default signature's inputs and
    outputs with their TensorFlow data types and shapes."""
    for path in ("/v1/models/heads/metadata", "/v1/models/heads/versions/1/metadata"):
        response = http.get(path)
        assert response.status_code == 200, response.text
        doc = response.json()
        assert doc["model_spec"] == {"name": "heads", "signature_name": "", "version": "1"}
        signature = doc["metadata"]["signature_def"]["signature_def"]["serving_default"]
        assert sorted(signature) == ["defaults", "inputs", "method_name", "outputs"]
        assert (signature["method_name"], signature["defaults"]) == ("tensorflow/serving/predict", {})
        assert signature["inputs"]["x"] == {
            "dtype": "DT_FLOAT",
            "tensor_shape": {
                "dim": [{"size": "-1", "name": ""}, {"size": "4", "name": ""}],
                "unknown_rank": False,
            },
            "name": "x",
        }
        assert signature["inputs"]["k"]["dtype"] == "DT_INT64"
        outputs = signature["outputs"]
        assert [outputs[o]["dtype"] for o in ("output0", "output1", "output2")] == [
            "DT_FLOAT",
            "DT_BOOL",
            "DT_INT64",
        ]
        assert [d["size"] for d in outputs["output0"]["tensor_shape"]["dim"]] == ["-1", "3"]
    fixed = http.get("/v1/models/fixed/metadata").json()["metadata"]["signature_def"]["signature_def"]
    assert [d["size"] for d in fixed["serving_default"]["inputs"]["x"]["tensor_shape"]["dim"]] == ["2", "3"]
    for path, status, message in [
        ("/v1/models/nope/metadata", 404, "'nope'"),
        ("/v1/models/heads/versions/9/metadata", 404, "no version 9"),
        ("/v1/models/heads/versions/one/metadata", 400, "integer"),
    ]:
        response = http.get(path)
        assert response.status_code == status and message in response.json()["error"], response.text
    assert httpx.get(f"{http.base_url}/v1/models/heads/metadata").status_code == 401  # no key
