"""The Open Inference Protocol frontend against a real server: the official tritonclient unchanged,
the protocol's JSON and binary bodies on the wire, and a 4xx `{"error"}` for every malformed request."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import zlib
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import torch
import tritonclient.http as triton
from torch import nn
from tritonclient.utils import InferenceServerException

from service.api import compression, v2
from tests import models
from tests.client import binary_infer, check_classes, expected, infer_body, sample, upload
from tests.servers import KilnServer

ADMIN, INFER = "admin-secret", "infer-secret"


def auth() -> dict[str, str]:
    """A fresh dict per call: tritonclient writes Inference-Header-Content-Length into the one it gets."""
    return {"Authorization": f"Bearer {INFER}"}


MLP = models.MODELS["mlp"]


class TwoHeads(nn.Module):
    """Two inputs of two dtypes; three outputs of three dtypes."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        y = self.linear(x)
        return y, y.sum(dim=1) > 0, k * 2 + 1


class Sequence(nn.Module):
    """Outputs that follow an input's length (a dynamic dimension past the batch), and one that
    does not."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x + 1, x.sum(dim=1)


class Complex(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.complex(x, x)


SEQUENCE = models.TestModel("sequence", Sequence, [{"name": "x", "dtype": "float32", "shape": [-1, -1, 4]}])
COMPLEX = models.TestModel("complex", Complex, [{"name": "x", "dtype": "float32", "shape": [-1, 4]}])


class Brain(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.bfloat16)


BRAIN = models.TestModel("brain", Brain, [{"name": "x", "dtype": "float32", "shape": [-1, 4]}])
HEADS = models.TestModel(
    "heads",
    TwoHeads,
    [{"name": "x", "dtype": "float32", "shape": [-1, 4]}, {"name": "k", "dtype": "int64", "shape": [-1, 4]}],
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KilnServer]:
    root = tmp_path_factory.mktemp("v2")
    env = {"KILN_DATA_DIR": str(root / "data"), "KILN_API_KEYS": f"{ADMIN}:admin,{INFER}:infer"}
    srv = KilnServer(env, root / "kiln.log")
    srv.start()
    with httpx.Client(base_url=srv.url, timeout=60, headers={"Authorization": f"Bearer {ADMIN}"}) as admin:
        for model in (MLP, HEADS):
            response = upload(admin, model, backends=[])
            assert response.status_code == 202, response.text
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def http(server: KilnServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60, headers=auth()) as client:
        yield client


@pytest.fixture
def client(server: KilnServer) -> Iterator[triton.InferenceServerClient]:
    triton_client = triton.InferenceServerClient(url=server.url.removeprefix("http://"))
    yield triton_client
    triton_client.close()


def fp32_input(x: np.ndarray, binary: bool) -> triton.InferInput:
    tensor = triton.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=binary)
    return tensor


def test_tritonclient_conversation(client: triton.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("mlp", headers=auth())
    assert client.is_model_ready("mlp", "1", headers=auth())
    assert not client.is_model_ready("nope", headers=auth())
    metadata = client.get_model_metadata("mlp", headers=auth())
    assert metadata == {
        "name": "mlp",
        "versions": ["1"],
        "platform": "pytorch_libtorch",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 64]}],
        "outputs": [{"name": "output0", "datatype": "FP32", "shape": [-1, 10]}],
    }
    assert client.get_model_metadata("mlp", "1", headers=auth()) == metadata
    config = client.get_model_config("mlp", headers=auth())
    assert config == {
        "name": "mlp",
        "platform": "pytorch_libtorch",
        "max_batch_size": 8,  # the server default: batched, so dims leave out the batch
        "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [64]}],
        "output": [{"name": "output0", "data_type": "TYPE_FP32", "dims": [10]}],
        "instance_group": [{"name": "mlp", "count": 1}],
        "dynamic_batching": {
            "preferred_batch_size": [],
            "max_queue_delay_microseconds": 0,
            "default_queue_policy": {"max_queue_size": 1024},
        },
        "parameters": {"adaptive_queue_delay": {"string_value": "true"}},  # Kiln's, not Triton's
    }
    assert client.get_model_config("mlp", "1", headers=auth()) == config
    assert "model_configuration" in client.get_server_metadata()["extensions"]

    x = sample(MLP, 3)
    want = expected(MLP, x)
    for binary_in in (False, True):
        for binary_out in (False, True):
            result = client.infer(
                "mlp",
                [fp32_input(x, binary_in)],
                outputs=[triton.InferRequestedOutput("output0", binary_data=binary_out)],
                request_id=f"req-{binary_in}-{binary_out}",
                headers=auth(),
            )
            response = result.get_response()
            assert response["id"] == f"req-{binary_in}-{binary_out}"
            assert response["model_name"] == "mlp" and response["model_version"] == "1"
            got = result.as_numpy("output0")
            assert got.dtype == np.float32 and got.shape == (3, 10)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # No outputs named: the client asks for all of them, as binary.
    result = client.infer("mlp", [fp32_input(x, True)], model_version="1", headers=auth())
    assert result.get_output("output0")["parameters"]["binary_data_size"] == want.nbytes
    np.testing.assert_allclose(result.as_numpy("output0"), want, rtol=1e-5, atol=1e-6)


def test_multiple_inputs_and_outputs(client: triton.InferenceServerClient) -> None:
    metadata = client.get_model_metadata("heads", headers=auth())
    assert metadata["inputs"] == [
        {"name": "x", "datatype": "FP32", "shape": [-1, 4]},
        {"name": "k", "datatype": "INT64", "shape": [-1, 4]},
    ]
    assert metadata["outputs"] == [
        {"name": "output0", "datatype": "FP32", "shape": [-1, 3]},
        {"name": "output1", "datatype": "BOOL", "shape": [-1]},
        {"name": "output2", "datatype": "INT64", "shape": [-1, 4]},
    ]
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 4)).astype(np.float32)
    k = rng.integers(-100, 100, (5, 4))
    k_input = triton.InferInput("k", [5, 4], "INT64")
    k_input.set_data_from_numpy(k, binary_data=False)
    result = client.infer(
        "heads",
        [fp32_input(x, True), k_input],
        outputs=[
            triton.InferRequestedOutput("output2", binary_data=True),
            triton.InferRequestedOutput("output1", binary_data=False),
        ],
        headers=auth(),
    )
    assert [o["name"] for o in result.get_response()["outputs"]] == ["output2", "output1"]
    assert result.as_numpy("output0") is None  # not requested, not returned
    with torch.inference_mode():
        _, positive, k_out = HEADS.module()(torch.from_numpy(x), torch.from_numpy(k))
    np.testing.assert_array_equal(result.as_numpy("output2"), k_out.numpy())
    np.testing.assert_array_equal(result.as_numpy("output1"), positive.numpy())
    assert result.as_numpy("output1").dtype == np.bool_


def test_json_on_the_wire(http: httpx.Client) -> None:
    x = sample(MLP, 2)
    response = http.post("/v2/models/mlp/infer", json=infer_body(x, id="abc"))
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    assert "inference-header-content-length" not in response.headers
    body = response.json()
    assert body["id"] == "abc" and body["model_name"] == "mlp" and body["model_version"] == "1"
    [output] = body["outputs"]
    assert output["name"] == "output0" and output["datatype"] == "FP32" and output["shape"] == [2, 10]
    assert len(output["data"]) == 20  # flat, row-major
    got = np.array(output["data"], np.float32).reshape(2, 10)
    np.testing.assert_allclose(got, expected(MLP, x), rtol=1e-5, atol=1e-6)


def test_binary_on_the_wire(http: httpx.Client) -> None:
    x = sample(MLP, 2)
    response = http.post(
        "/v2/models/mlp/versions/1/infer", **binary_infer(x, parameters={"binary_data_output": True})
    )
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/octet-stream"
    length = int(response.headers["inference-header-content-length"])
    body = json.loads(response.content[:length])
    assert body["outputs"][0]["parameters"] == {"binary_data_size": 2 * 10 * 4}
    got = np.frombuffer(response.content[length:], "<f4").reshape(2, 10)
    np.testing.assert_allclose(got, expected(MLP, x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_tritonclient_compression(client: triton.InferenceServerClient, algorithm: str) -> None:
    """tritonclient's request and response compression, as Triton's HTTP server takes them:
    the body compressed whole, binary tensors included, and the response in the same encoding."""
    x = sample(MLP, 8)
    for binary_out in (False, True):  # JSON outputs of 8x10 floats pass the compression minimum
        result = client.infer(
            "mlp",
            [fp32_input(x, True)],
            outputs=[triton.InferRequestedOutput("output0", binary_data=binary_out)],
            headers=auth(),
            request_compression_algorithm=algorithm,
            response_compression_algorithm=algorithm,
        )
        np.testing.assert_allclose(result.as_numpy("output0"), expected(MLP, x), rtol=1e-5, atol=1e-6)


def test_compression_on_the_wire(http: httpx.Client) -> None:
    """A gzip request is read as its JSON; a response is compressed when the client accepts it
    and it is at least MIN_COMPRESSED_BYTES, in the encoding the client weighs most."""
    x = sample(MLP, 8)
    body = gzip.compress(json.dumps(infer_body(x)).encode())
    accepts = {
        "deflate;q=0.5, gzip": "gzip",
        "gzip;q=0.2, deflate": "deflate",
        "br, identity": None,
        # q need not be the first parameter; x-gzip is gzip; a weight past 1 is none.
        "gzip;level=1;q=0": None,
        "x-gzip": "gzip",
        "gzip;q=inf": None,
    }
    for accept, encoding in accepts.items():
        headers = {"Content-Encoding": "gzip", "Accept-Encoding": accept}
        response = http.post("/v2/models/mlp/infer", content=body, headers=headers)
        assert response.status_code == 200, response.text
        assert response.headers.get("content-encoding") == encoding
        got = np.array(response.json()["outputs"][0]["data"], np.float32).reshape(8, 10)  # httpx decodes it
        np.testing.assert_allclose(got, expected(MLP, x), rtol=1e-5, atol=1e-6)
    small = http.post("/v2/models/mlp/infer", json=infer_body(x[:1]), headers={"Accept-Encoding": "gzip"})
    assert small.status_code == 200 and len(small.content) < compression.MIN_COMPRESSED_BYTES
    assert "content-encoding" not in small.headers


@pytest.mark.parametrize(
    ("encoding", "content", "message"),
    [
        ("br", b"{}", "Content-Encoding 'br' is not supported; send gzip, deflate or none"),
        ("gzip", b"not gzip at all", "not valid gzip data"),
        ("gzip", gzip.compress(b'{"inputs": []}')[:-12], "gzip data ends early"),
        ("deflate", zlib.compress(b'{"inputs": []}') + b"junk", "4 bytes after its deflate data"),
        ("gzip", gzip.compress(b"{}") * 2, "bytes after its gzip data"),  # two members: one is taken
    ],
)
def test_malformed_compressed_request(
    http: httpx.Client, encoding: str, content: bytes, message: str
) -> None:
    response = http.post("/v2/models/mlp/infer", content=content, headers={"Content-Encoding": encoding})
    assert message in error(response, 400)


def test_large_bodies_take_the_threadpool(http: httpx.Client) -> None:
    # Past v2's inline limits, decoding runs in the threadpool: same answers, same errors.
    x = sample(MLP, 8)
    body = infer_body(x)
    assert len(json.dumps(body)) > v2.INLINE_JSON_BYTES
    response = http.post("/v2/models/mlp/infer", json=body)
    assert response.status_code == 200, response.text
    got = np.array(response.json()["outputs"][0]["data"], np.float32).reshape(8, 10)
    np.testing.assert_allclose(got, expected(MLP, x), rtol=1e-5, atol=1e-6)
    content, headers = binary_request(None, 256, b"\0" * (v2.INLINE_BINARY_BYTES + 1024))
    response = http.post("/v2/models/mlp/infer", content=content, headers=headers)
    assert "bytes after the JSON header" in error(response, 400)


def test_server_metadata_and_open_health(server: KilnServer) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as anon:
        metadata = anon.get("/v2")
        assert metadata.status_code == 200
        assert metadata.json()["name"] == "kiln" and "binary_tensor_data" in metadata.json()["extensions"]
        assert anon.get("/v2/health/live").status_code == 200
        assert anon.get("/v2/health/ready").status_code == 200
        for path in ("/v2/models/mlp", "/v2/models/mlp/ready"):
            assert "API key" in error(anon.get(path), 401)
        assert "API key" in error(anon.post("/v2/models/mlp/infer", json=infer_body(sample(MLP, 1))), 401)
        bad_key = anon.get("/v2/models/mlp", headers={"Authorization": "Bearer wrong"})
        assert "not valid" in error(bad_key, 401)


def test_health_in_the_protocol_s_bodies(server: KilnServer, http: httpx.Client) -> None:
    """The Open Inference Protocol's JSON, which kserve's v2 client reads; tritonclient reads
    only the status."""
    with httpx.Client(base_url=server.url, timeout=60) as anon:
        assert anon.get("/v2/health/live").json() == {"live": True}
        assert anon.get("/v2/health/ready").json() == {"ready": True}
    for path in ("/v2/models/mlp/ready", "/v2/models/mlp/versions/1/ready"):
        assert http.get(path).json() == {"name": "mlp", "ready": True}


# kserve's v2 REST client, in a process of its own (see tests/kserve_client.py).
KSERVE_V2 = """
import asyncio, json, sys
from kserve import InferenceRESTClient, RESTConfig

async def main(url: str, key: str) -> list[bool]:
    async with InferenceRESTClient(RESTConfig(protocol="v2", timeout=60)) as client:
        auth = {"Authorization": f"Bearer {key}"}
        return [
            await client.is_server_live(url),
            await client.is_server_ready(url),
            await client.is_model_ready(url, "mlp", headers=auth),
        ]

print(json.dumps(asyncio.run(main(*sys.argv[1:]))))
"""


def test_kserve_v2_client_reads_health(server: KilnServer) -> None:
    done = subprocess.run(
        [sys.executable, "-c", KSERVE_V2, server.url, INFER],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [True, True, True]


def error(response: httpx.Response, status: int) -> str:
    """The protocol's error shape: a JSON object with one `error` string, never problem+json."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert list(body) == ["error"] and isinstance(body["error"], str) and body["error"]
    message: str = body["error"]
    return message


def tensor(**fields: object) -> dict[str, object]:
    return {"name": "x", "shape": [1, 64], "datatype": "FP32", "data": [0.5] * 64, **fields}


def test_output_dims_that_follow_an_inputs_length(server: KilnServer, http: httpx.Client) -> None:
    with httpx.Client(base_url=server.url, timeout=60, headers={"Authorization": f"Bearer {ADMIN}"}) as admin:
        assert upload(admin, SEQUENCE, backends=[]).status_code == 202
        refused = upload(admin, COMPLEX, backends=[])
        assert refused.status_code == 400 and "complex64, which no inference protocol carries" in refused.text
        bf16 = upload(admin, BRAIN, backends=[])  # numpy has no bfloat16: it was "the model failed"
        assert (
            bf16.status_code == 400
            and "'output0' has dtype torch.bfloat16, which Kiln cannot serve" in bf16.text
        )
    metadata = http.get("/v2/models/sequence").json()
    assert [o["shape"] for o in metadata["outputs"]] == [[-1, -1, 4], [-1, 4]]
    config = http.get("/v2/models/sequence/config").json()
    assert [o["dims"] for o in config["output"]] == [[-1, 4], [4]]
    x = np.ones((2, 5, 4), np.float32)
    body = {"inputs": [{"name": "x", "shape": [2, 5, 4], "datatype": "FP32", "data": x.ravel().tolist()}]}
    outputs = post(http, body, "/v2/models/sequence/infer").json()["outputs"]
    assert [o["shape"] for o in outputs] == [[2, 5, 4], [2, 4]]
    assert outputs[1]["data"] == [5.0] * 8


def post(http: httpx.Client, body: object, path: str = "/v2/models/mlp/infer") -> httpx.Response:
    return http.post(path, json=body)


MALFORMED = {
    "wrong datatype": ({"inputs": [tensor(datatype="FP64")]}, "expected datatype FP32, received FP64"),
    "unknown datatype": ({"inputs": [tensor(datatype="FP33")]}, "unknown datatype"),
    "bytes": ({"inputs": [tensor(datatype="BYTES", data=["a"] * 64)]}, "BYTES tensors are not supported"),
    "shape vs data length": ({"inputs": [tensor(shape=[1, 65])]}, "holds 65 elements, but `data` has 64"),
    "shape vs model": ({"inputs": [tensor(shape=[2, 32])]}, r"expected shape [-1, 64], received [2, 32]"),
    "strings for FP32": ({"inputs": [tensor(data=["a"] * 64)]}, "FP32 data must be numbers"),
    "unknown input": ({"inputs": [tensor(), tensor(name="y")]}, "unknown input(s) ['y']"),
    "missing input": ({"inputs": [tensor(name="y")]}, "missing input(s) ['x']"),
    "no inputs": ({"inputs": []}, "non-empty list of tensors"),
    "unknown output": ({"inputs": [tensor()], "outputs": [{"name": "nope"}]}, "unknown output(s) ['nope']"),
    "over max batch": ({"inputs": [tensor(shape=[9, 64], data=[0.5] * 576)]}, "max_batch_size"),
    "not an object": ([1, 2], "must be a JSON object"),
    # numpy sizes an empty array by its other dimensions too: no such array exists.
    "huge empty shape": ({"inputs": [tensor(shape=[0, 2**62], data=[])]}, "larger than any array can be"),
}


def executions(http: httpx.Client) -> int:
    stats = http.get("/v2/models/mlp/stats").json()["model_stats"]
    return sum(int(s["execution_count"]) for s in stats)


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_json_request(http: httpx.Client, case: str) -> None:
    body, message = MALFORMED[case]
    before = executions(http)
    assert message in error(post(http, body), 400)
    assert executions(http) == before  # refused before the model ran, not after


def binary_request(header_length: int | None, size: int, payload: bytes) -> tuple[bytes, dict[str, str]]:
    header = json.dumps(
        {
            "inputs": [
                {"name": "x", "shape": [1, 64], "datatype": "FP32", "parameters": {"binary_data_size": size}}
            ]
        }
    ).encode()
    length = len(header) if header_length is None else header_length
    return header + payload, {"Inference-Header-Content-Length": str(length)}


@pytest.mark.parametrize(
    ("header_length", "size", "payload", "message"),
    [
        (None, 256, b"\0" * 128, "runs past the end of the body"),
        (None, 256, b"\0" * 384, "128 bytes after the JSON header"),
        (None, 128, b"\0" * 128, "binary_data_size is 128 bytes, but shape [1, 64] of FP32 needs 256"),
        (10**6, 256, b"\0" * 256, "Inference-Header-Content-Length is 1000000"),
        (5, 256, b"\0" * 256, "not valid JSON"),
    ],
)
def test_malformed_binary_request(
    http: httpx.Client, header_length: int | None, size: int, payload: bytes, message: str
) -> None:
    content, headers = binary_request(header_length, size, payload)
    response = http.post("/v2/models/mlp/infer", content=content, headers=headers)
    assert message in error(response, 400)


def test_invalid_json(http: httpx.Client) -> None:
    response = http.post("/v2/models/mlp/infer", content=b'{"inputs": [', headers={"content-type": "x"})
    assert "not valid JSON" in error(response, 400)
    # A digit to str.isdigit, not to int(): "²".
    content = json.dumps({"inputs": [tensor()]}).encode()
    response = http.post("/v2/models/mlp/infer", content=content, headers={v2.HEADER_LENGTH: b"\xb2"})
    assert "must be a byte count in digits" in error(response, 400)
    # int() takes "+N": the JSON limit's check skipped it, and the whole body was parsed as JSON.
    response = http.post(
        "/v2/models/mlp/infer", content=content, headers={v2.HEADER_LENGTH: f"+{len(content)}"}
    )
    assert f"must be a byte count in digits, not '+{len(content)}'" in error(response, 400)


def test_no_requested_outputs_is_every_output(http: httpx.Client) -> None:
    response = post(http, {"inputs": [tensor()], "outputs": []})
    assert response.status_code == 200, response.text
    assert [o["name"] for o in response.json()["outputs"]] == ["output0"]


def test_unknown_names_and_versions(http: httpx.Client) -> None:
    body = {"inputs": [tensor()]}
    assert "'nope'" in error(post(http, body, "/v2/models/nope/infer"), 404)
    assert "no version 9" in error(post(http, body, "/v2/models/mlp/versions/9/infer"), 404)
    assert "integer" in error(post(http, body, "/v2/models/mlp/versions/one/infer"), 400)
    assert "'nope'" in error(http.get("/v2/models/nope"), 404)
    assert "no version 9" in error(http.get("/v2/models/mlp/versions/9"), 404)
    assert "integer" in error(http.get("/v2/models/mlp/versions/1.5/ready"), 400)
    assert "'nope'" in error(http.get("/v2/models/nope/ready"), 404)
    assert "no v2 endpoint GET /v2/models/mlp/infer" in error(http.get("/v2/models/mlp/infer"), 404)
    assert "no v2 endpoint" in error(http.get("/v2/repository/index"), 404)


def test_tritonclient_unloads_and_loads(client: triton.InferenceServerClient) -> None:
    """As on Triton: an unloaded model is not ready and refuses inference until it is loaded
    again; its metadata still answers. Both calls need the admin scope."""
    admin = {"Authorization": f"Bearer {ADMIN}"}
    with pytest.raises(InferenceServerException, match="admin"):
        client.unload_model("heads", headers=auth())
    client.unload_model("heads", headers=admin)
    try:
        assert not client.is_model_ready("heads", headers=auth())
        assert client.get_model_metadata("heads", headers=auth())["name"] == "heads"
        k = np.arange(8).reshape(2, 4)
        inputs = [fp32_input(sample(HEADS, 2), binary=True), triton.InferInput("k", [2, 4], "INT64")]
        inputs[1].set_data_from_numpy(k)
        with pytest.raises(
            InferenceServerException, match=r"unloaded: POST /v2/repository/models/heads/load"
        ) as caught:
            client.infer("heads", inputs, headers=auth())
        assert caught.value.status() == "409"
        index = {m["name"]: m for m in client.get_model_repository_index(headers=auth())}
        assert (index["heads"]["state"], index["heads"]["reason"]) == ("UNAVAILABLE", "unloaded")
        assert index["mlp"]["state"] == "READY"  # only the model unloaded
        with pytest.raises(InferenceServerException, match="no model named 'nope'"):
            client.unload_model("nope", headers=admin)
    finally:
        client.load_model("heads", headers=admin)  # the module's other tests use it
    assert client.is_model_ready("heads", headers=auth())
    result = client.infer("heads", inputs, headers=auth())
    np.testing.assert_array_equal(result.as_numpy("output2"), k * 2 + 1)


def test_tritonclient_sees_errors(client: triton.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException, match="expected datatype FP32, received FP64") as caught:
        tensor64 = triton.InferInput("x", [1, 64], "FP64")
        tensor64.set_data_from_numpy(np.zeros((1, 64)), binary_data=True)
        client.infer("mlp", [tensor64], headers=auth())
    assert caught.value.status() == "400"


LABELS = [f"class {i}: of ten" for i in range(7)]  # three classes without one; colons in a label


@pytest.fixture(scope="module")
def admin(server: KilnServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60, headers={"Authorization": f"Bearer {ADMIN}"}) as c:
        yield c


def test_tritonclient_classification(client: triton.InferenceServerClient, admin: httpx.Client) -> None:
    """Triton's classification extension: an output's top classes as BYTES "<value>:<index>:<label>",
    per batch item of a batching model, over the whole output of one that is not."""
    response = upload(admin, MLP, "classifier", backends=[], labels={"output0": LABELS})
    assert response.status_code == 202, response.text
    assert "classification" in client.get_server_metadata()["extensions"]
    x = sample(MLP, 4)
    want = expected(MLP, x)
    for binary in (False, True):
        for count in (3, 50):  # 50: all ten classes, ranked off the event loop (INLINE_CLASSIFY_COST)
            result = client.infer(
                "classifier",
                [fp32_input(x, True)],
                outputs=[triton.InferRequestedOutput("output0", binary_data=binary, class_count=count)],
                headers=auth(),
            )
            assert result.get_output("output0")["datatype"] == "BYTES"
            check_classes(result.as_numpy("output0"), want, count, LABELS)
    # New labels apply at once, without a recompile.
    relabelled = ["first", "second"]
    path = "/v1/models/classifier/versions/1/serving"
    changed = admin.patch(path, json={"labels": {"output0": relabelled}})
    assert changed.status_code == 200, changed.text
    assert changed.json()["serving"]["labels"] == {"output0": relabelled}
    requested = [triton.InferRequestedOutput("output0", class_count=10)]
    result = client.infer("classifier", [fp32_input(x, True)], outputs=requested, headers=auth())
    check_classes(result.as_numpy("output0"), want, 10, relabelled)
    # The model without labels answers indices alone; an INT64 output prints its integers.
    result = client.infer("mlp", [fp32_input(x, False)], outputs=requested, headers=auth())
    check_classes(result.as_numpy("output0"), want, 10)
    k = np.array([[3, -7, 3, 9]])
    k_input = triton.InferInput("k", [1, 4], "INT64")
    k_input.set_data_from_numpy(k)
    result = client.infer(
        "heads",
        [fp32_input(sample(HEADS, 1), True), k_input],
        outputs=[triton.InferRequestedOutput("output2", class_count=3)],
        headers=auth(),
    )
    assert result.as_numpy("output2").tolist() == [[b"19:3", b"7:0", b"7:2"]]  # ties in index order


def test_classification_of_a_model_that_does_not_batch(
    client: triton.InferenceServerClient, admin: httpx.Client
) -> None:
    """max_batch_size 1: Triton's clients see a config without a batch, and the classes of the
    whole output come back as [count]."""
    response = upload(admin, MLP, "unbatched", backends=[], max_batch_size=1, labels={"output0": LABELS})
    assert response.status_code == 202, response.text
    assert client.get_model_config("unbatched", headers=auth())["max_batch_size"] == 0
    x = sample(MLP, 1)
    requested = [triton.InferRequestedOutput("output0", class_count=4)]
    result = client.infer("unbatched", [fp32_input(x, True)], outputs=requested, headers=auth())
    got = result.as_numpy("output0")
    assert got.shape == (4,)
    check_classes(got[None], expected(MLP, x), 4, LABELS)


def test_classification_on_the_wire(http: httpx.Client) -> None:
    x = sample(MLP, 2)
    want = expected(MLP, x)
    outputs = [{"name": "output0", "parameters": {"classification": 2}}]
    response = http.post("/v2/models/mlp/infer", json=infer_body(x, outputs=outputs))
    assert response.status_code == 200, response.text
    [output] = response.json()["outputs"]
    assert (output["datatype"], output["shape"]) == ("BYTES", [2, 2])
    check_classes(np.array(output["data"]).reshape(2, 2), want, 2)
    # Binary: each string its little-endian uint32 length, then its bytes.
    outputs[0]["parameters"]["binary_data"] = True
    response = http.post("/v2/models/mlp/infer", json=infer_body(x, outputs=outputs))
    assert response.status_code == 200, response.text
    length = int(response.headers["Inference-Header-Content-Length"])
    [output] = json.loads(response.content[:length])["outputs"]
    raw = response.content[length:]
    assert output["parameters"]["binary_data_size"] == len(raw)
    strings = []
    while raw:
        size = int.from_bytes(raw[:4], "little")
        strings.append(raw[4 : 4 + size])
        raw = raw[4 + size :]
    check_classes(np.array(strings, dtype=object).reshape(2, 2), want, 2)
    # The request's binary_data_output applies to the strings too.
    outputs = [{"name": "output0", "parameters": {"classification": 1}}]
    body = infer_body(x, outputs=outputs, parameters={"binary_data_output": True})
    response = http.post("/v2/models/mlp/infer", json=body)
    length = int(response.headers["Inference-Header-Content-Length"])
    assert json.loads(response.content[:length])["outputs"][0]["parameters"]["binary_data_size"] > 0
    # 0 asks for the values themselves, as in Triton.
    outputs = [{"name": "output0", "parameters": {"classification": 0}}]
    response = http.post("/v2/models/mlp/infer", json=infer_body(x, outputs=outputs))
    np.testing.assert_allclose(
        np.array(response.json()["outputs"][0]["data"]).reshape(2, 10), want, rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize(
    ("path", "output", "count", "message"),
    [
        ("mlp", "output0", -1, "classification must be a non-negative integer"),
        ("mlp", "output0", "3", "classification must be a non-negative integer"),
        ("mlp", "output0", True, "classification must be a non-negative integer"),
        ("heads", "output1", 2, "output 'output1' is bool: classification ranks integers and floats"),
    ],
)
def test_malformed_classification(
    http: httpx.Client, path: str, output: str, count: object, message: str
) -> None:
    k = tensor(name="k", shape=[1, 4], datatype="INT64", data=[1] * 4)
    heads = [tensor(shape=[1, 4], data=[0.5] * 4), k]
    body = {
        "inputs": heads if path == "heads" else [tensor()],
        "outputs": [{"name": output, "parameters": {"classification": count}}],
    }
    assert message in error(post(http, body, f"/v2/models/{path}/infer"), 400)


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        ({"nope": ["a"]}, "config.labels: the model has no output 'nope'; it outputs ['output0']"),
        ({"output0": [str(i) for i in range(11)]}, "labels.output0: 11 labels, but output 'output0' has 10"),
        ({"output0": ["x" * 257]}, "at most 256 characters"),
    ],
)
def test_labels_are_checked_at_upload(admin: httpx.Client, labels: object, message: str) -> None:
    response = upload(admin, MLP, "mislabelled", backends=[], labels=labels)
    assert response.status_code == 422, response.text
    assert message in response.json()["detail"]
    assert admin.get("/v1/models/mislabelled").status_code == 404  # nothing stored


def test_an_upload_config_past_starlette_s_1_mib_is_read_and_past_32_mib_refused(admin: httpx.Client) -> None:
    """Labels and samples up to their own limits make a config larger than Starlette's default
    1 MiB for a form field, which refused them with a 400 that named nothing."""
    config = json.dumps(MLP.config(name="padded", backends=[]))

    def post(padding: int) -> httpx.Response:
        body = {"config": config + " " * padding}  # JSON's whitespace: as large as labels can be
        return admin.post("/v1/models", files={"file": ("m.pt", MLP.torchscript())}, data=body)

    assert post(3 << 19).status_code == 202
    refused = post(33 << 20)
    assert refused.status_code == 413, refused.text
    assert "the form field config is over 32 MiB" in refused.json()["detail"]


def test_labels_are_checked_when_changed(admin: httpx.Client) -> None:
    path = "/v1/models/heads/versions/1/serving"
    for labels, message in [
        ({"output1": ["no", "yes"]}, "labels.output1: a bool output has no classes to label"),
        ({"output9": []}, "labels: the model has no output 'output9'"),
        ({"output0": ["x" * 200] * 6000}, "labels: the labels take 1206000 bytes; 1048576 at most"),
    ]:
        response = admin.patch(path, json={"labels": labels})
        assert response.status_code == 422, response.text
        assert message in response.json()["detail"]
    assert admin.get("/v1/models/heads/versions/1").json()["serving"]["labels"] == {}


def test_statistics_list_a_ready_version_before_its_first_request(
    client: triton.InferenceServerClient, admin: httpx.Client
) -> None:
    """As Triton lists every version it has loaded: a client such as perf_analyzer reads a
    model's statistics before its first request, and finds the version at 0; not once unloaded."""
    assert upload(admin, MLP, "unasked", backends=[]).status_code == 202
    [stats] = client.get_inference_statistics("unasked", headers=auth())["model_stats"]
    assert (stats["name"], stats["version"], stats["inference_count"]) == ("unasked", "1", 0)
    assert stats["inference_stats"]["success"] == {"count": 0, "ns": 0}
    assert client.get_inference_statistics("unasked", "1", headers=auth())["model_stats"] == [stats]
    every = client.get_inference_statistics(headers=auth())["model_stats"]
    assert ("unasked", "1") in {(s["name"], s["version"]) for s in every}
    assert admin.post("/v2/repository/models/unasked/unload").status_code == 200
    assert client.get_inference_statistics("unasked", headers=auth())["model_stats"] == []


def test_the_repository_index_lists_each_version_as_tritonserver_does(
    http: httpx.Client, admin: httpx.Client
) -> None:
    """Each version that serves here is its own entry; the body is JSON whatever the request's
    content type says (Triton's documented `curl -d`), and `ready` is a JSON boolean."""
    assert upload(admin, MLP, "twice", backends=[]).status_code == 202
    assert upload(admin, MLP, "twice", backends=[], max_batch_size=4).status_code == 202
    form = {"content-type": "application/x-www-form-urlencoded"}
    response = http.post("/v2/repository/index", content=b'{"ready": true}', headers=form)
    assert response.status_code == 200, response.text
    entries = [(e["version"], e["state"]) for e in response.json() if e["name"] == "twice"]
    assert entries == [("1", "READY"), ("2", "READY")]
    assert admin.post("/v2/repository/models/twice/unload").status_code == 200
    assert "twice" not in {e["name"] for e in http.post("/v2/repository/index", json={"ready": True}).json()}
    index = http.post("/v2/repository/index").json()
    unloaded = [(e["version"], e["state"], e["reason"]) for e in index if e["name"] == "twice"]
    assert unloaded == [("1", "UNAVAILABLE", "unloaded"), ("2", "UNAVAILABLE", "unloaded")]
    assert "ready" in error(http.post("/v2/repository/index", json={"ready": "yes"}), 400)
