"""Triton's system shared-memory extension against a real server: tritonclient's own shared-memory
utilities and its HTTP and gRPC clients, unchanged, and for each misuse Triton's status with a
message that says what to fix."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
import torch
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
import tritonclient.utils.shared_memory as shm
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc
from tritonclient.utils import InferenceServerException

from service import shared_memory
from service.shared_memory import KIND, SharedMemory
from service.store import LocalStore, RedisStore, Store
from service.tensors import SharedSlice
from tests import models
from tests.client import expected, sample, upload
from tests.servers import KilnServer, embedded_server, running
from tests.test_v2 import HEADS

ADMIN, INFER = "admin-secret", "infer-secret"
MLP = models.MODELS["mlp"]  # x: float32[-1, 64] -> output0: float32[-1, 10]
BATCH = 3
IN_BYTES = BATCH * 64 * 4
OUT_BYTES = BATCH * 10 * 4


def bearer(key: str) -> dict[str, str]:
    """A fresh dict per call: tritonclient writes its own headers into the one it gets."""
    return {"authorization": f"Bearer {key}"}  # lower case, as gRPC metadata must be


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KilnServer]:
    root = tmp_path_factory.mktemp("shm")
    env = {
        "KILN_DATA_DIR": str(root / "data"),
        "KILN_API_KEYS": f"{ADMIN}:admin,{INFER}:infer",
        "KILN_SHARED_MEMORY": "true",
    }
    srv = KilnServer(env, root / "kiln.log")
    with running(srv):
        with httpx.Client(base_url=srv.url, timeout=60, headers=bearer(ADMIN)) as admin:
            for model in (MLP, HEADS):
                response = upload(admin, model, backends=[])
                assert response.status_code == 202, response.text
        yield srv


@pytest.fixture
def segments() -> Iterator[dict[str, object]]:
    """An input and an output segment, as a client creates them; destroyed afterwards."""
    tag = f"{os.getpid()}_{os.urandom(4).hex()}"
    handles = {
        "in": shm.create_shared_memory_region(f"in_{tag}", f"/kiln_in_{tag}", IN_BYTES),
        "out": shm.create_shared_memory_region(f"out_{tag}", f"/kiln_out_{tag}", OUT_BYTES + 64),
        "in_key": f"/kiln_in_{tag}",
        "out_key": f"/kiln_out_{tag}",
    }
    yield handles
    for name in ("in", "out"):
        shm.destroy_shared_memory_region(handles[name])


@pytest.fixture
def http_client(server: KilnServer) -> Iterator[triton_http.InferenceServerClient]:
    client = triton_http.InferenceServerClient(url=server.url.removeprefix("http://"))
    yield client
    client.unregister_system_shared_memory(headers=bearer(ADMIN))
    client.close()


@pytest.fixture
def grpc_client(server: KilnServer) -> Iterator[triton_grpc.InferenceServerClient]:
    client = triton_grpc.InferenceServerClient(url=server.grpc_address)
    yield client
    client.unregister_system_shared_memory(headers=bearer(ADMIN))
    client.close()


def test_tritonclient_http_infers_through_shared_memory(
    http_client: triton_http.InferenceServerClient, segments: dict[str, object]
) -> None:
    x = sample(MLP, BATCH)
    shm.set_shared_memory_region(segments["in"], [x])
    http_client.register_system_shared_memory("in", segments["in_key"], IN_BYTES, headers=bearer(ADMIN))
    # The output region starts 64 bytes into its segment.
    http_client.register_system_shared_memory(
        "out", segments["out_key"], OUT_BYTES, 64, headers=bearer(ADMIN)
    )
    status = http_client.get_system_shared_memory_status(headers=bearer(INFER))
    assert status == [
        {"name": "in", "key": segments["in_key"], "offset": 0, "byte_size": IN_BYTES},
        {"name": "out", "key": segments["out_key"], "offset": 64, "byte_size": OUT_BYTES},
    ]
    assert "system_shared_memory" in http_client.get_server_metadata()["extensions"]

    tensor = triton_http.InferInput("x", [BATCH, 64], "FP32")
    tensor.set_shared_memory("in", IN_BYTES)
    wanted = triton_http.InferRequestedOutput("output0", binary_data=True)
    wanted.set_shared_memory("out", OUT_BYTES)
    result = http_client.infer("mlp", [tensor], outputs=[wanted], headers=bearer(INFER))
    described = result.get_output("output0")
    assert described["shape"] == [BATCH, 10] and described["parameters"]["shared_memory_region"] == "out"
    assert described["parameters"]["shared_memory_byte_size"] == OUT_BYTES
    got = shm.get_contents_as_numpy(segments["out"], np.float32, [BATCH, 10], offset=64)
    np.testing.assert_allclose(got, expected(MLP, x), rtol=1e-5, atol=1e-6)

    # An input from shared memory, the output in the response.
    result = http_client.infer("mlp", [tensor], headers=bearer(INFER))
    np.testing.assert_allclose(result.as_numpy("output0"), expected(MLP, x), rtol=1e-5, atol=1e-6)

    http_client.unregister_system_shared_memory("in", headers=bearer(ADMIN))
    assert [r["name"] for r in http_client.get_system_shared_memory_status(headers=bearer(INFER))] == ["out"]
    with pytest.raises(InferenceServerException, match="no shared memory region 'in' is registered"):
        http_client.infer("mlp", [tensor], headers=bearer(INFER))


def test_http_reads_at_an_offset_and_mixes_shared_and_binary_outputs(
    http_client: triton_http.InferenceServerClient, segments: dict[str, object]
) -> None:
    """An input at an offset into its region, one output written to shared memory and two in
    the body, binary: the body's binary part holds only those two."""
    x = sample(HEADS, BATCH)[:, :4].copy()
    k = np.arange(BATCH * 4, dtype=np.int64).reshape(BATCH, 4)
    shm.set_shared_memory_region(segments["in"], [x], offset=100)
    http_client.register_system_shared_memory("x", segments["in_key"], IN_BYTES, headers=bearer(ADMIN))
    http_client.register_system_shared_memory("y", segments["out_key"], OUT_BYTES, headers=bearer(ADMIN))
    x_in = triton_http.InferInput("x", list(x.shape), "FP32")
    x_in.set_shared_memory("x", x.nbytes, offset=100)
    k_in = triton_http.InferInput("k", list(k.shape), "INT64")
    k_in.set_data_from_numpy(k, binary_data=True)
    outputs = [
        triton_http.InferRequestedOutput(name, binary_data=True) for name in ("output0", "output1", "output2")
    ]
    outputs[0].set_shared_memory("y", BATCH * 3 * 4, offset=8)
    result = http_client.infer("heads", [x_in, k_in], outputs=outputs, headers=bearer(INFER))
    y, positive, k_out = heads(x, k)
    got = shm.get_contents_as_numpy(segments["out"], np.float32, [BATCH, 3], offset=8)
    np.testing.assert_allclose(got, y, rtol=1e-5, atol=1e-6)
    assert result.get_output("output0")["parameters"]["shared_memory_offset"] == 8
    np.testing.assert_array_equal(result.as_numpy("output1"), positive)
    np.testing.assert_array_equal(result.as_numpy("output2"), k_out)


def heads(x: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, ...]:
    with torch.inference_mode():
        return tuple(t.numpy() for t in HEADS.module()(torch.from_numpy(x), torch.from_numpy(k)))


def test_tritonclient_grpc_infers_through_shared_memory(
    grpc_client: triton_grpc.InferenceServerClient, segments: dict[str, object]
) -> None:
    x = sample(MLP, BATCH, seed=2)
    shm.set_shared_memory_region(segments["in"], [x])
    grpc_client.register_system_shared_memory("in", segments["in_key"], IN_BYTES, headers=bearer(ADMIN))
    grpc_client.register_system_shared_memory(
        "out", segments["out_key"], OUT_BYTES, 64, headers=bearer(ADMIN)
    )
    status = grpc_client.get_system_shared_memory_status(headers=bearer(INFER), as_json=True)
    assert status["regions"]["out"] == {
        "name": "out",
        "key": segments["out_key"],
        "offset": "64",  # int64 fields are strings in protobuf's JSON
        "byte_size": str(OUT_BYTES),
    }
    assert "system_shared_memory" in grpc_client.get_server_metadata().extensions

    tensor = triton_grpc.InferInput("x", [BATCH, 64], "FP32")
    tensor.set_shared_memory("in", IN_BYTES)
    wanted = triton_grpc.InferRequestedOutput("output0")
    wanted.set_shared_memory("out", OUT_BYTES)
    result = grpc_client.infer("mlp", [tensor], outputs=[wanted], headers=bearer(INFER))
    described = result.get_output("output0")
    assert list(described.shape) == [BATCH, 10]
    assert described.parameters["shared_memory_region"].string_param == "out"
    got = shm.get_contents_as_numpy(segments["out"], np.float32, [BATCH, 10], offset=64)
    np.testing.assert_allclose(got, expected(MLP, x), rtol=1e-5, atol=1e-6)

    # Registration needs admin; an infer key may read the status and use the regions.
    with pytest.raises(InferenceServerException, match="needs admin"):
        grpc_client.register_system_shared_memory("again", segments["in_key"], 4, headers=bearer(INFER))
    grpc_client.unregister_system_shared_memory(headers=bearer(ADMIN))
    assert not grpc_client.get_system_shared_memory_status(headers=bearer(INFER), as_json=True).get("regions")


def test_grpc_mixes_shared_memory_with_raw_contents(
    grpc_client: triton_grpc.InferenceServerClient, segments: dict[str, object]
) -> None:
    """One input in shared memory and one raw; one output in shared memory and two raw: every
    output keeps its index in raw_output_contents, as tritonclient reads them."""
    x = sample(HEADS, BATCH)[:, :4].copy()
    k = np.arange(BATCH * 4, dtype=np.int64).reshape(BATCH, 4)
    shm.set_shared_memory_region(segments["in"], [x])
    grpc_client.register_system_shared_memory("x", segments["in_key"], x.nbytes, headers=bearer(ADMIN))
    grpc_client.register_system_shared_memory("y", segments["out_key"], OUT_BYTES, headers=bearer(ADMIN))
    x_in = triton_grpc.InferInput("x", list(x.shape), "FP32")
    x_in.set_shared_memory("x", x.nbytes)
    k_in = triton_grpc.InferInput("k", list(k.shape), "INT64")
    k_in.set_data_from_numpy(k)
    outputs = [triton_grpc.InferRequestedOutput(name) for name in ("output0", "output1", "output2")]
    outputs[0].set_shared_memory("y", OUT_BYTES)
    result = grpc_client.infer("heads", [x_in, k_in], outputs=outputs, headers=bearer(INFER))
    y, positive, k_out = heads(x, k)
    got = shm.get_contents_as_numpy(segments["out"], np.float32, [BATCH, 3])
    np.testing.assert_allclose(got, y, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(result.as_numpy("output1"), positive)
    np.testing.assert_array_equal(result.as_numpy("output2"), k_out)
    # Only the output in shared memory carries parameters; the others come as Triton sends them.
    assert [len(o.parameters) for o in result.get_response().outputs] == [2, 0, 0]


def test_grpc_refuses_an_input_in_shared_memory_that_sends_contents_too(server: KilnServer) -> None:
    tensor = pb.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=[1, 64])
    tensor.parameters["shared_memory_region"].string_param = "anything"
    tensor.parameters["shared_memory_byte_size"].int64_param = 256
    tensor.contents.fp32_contents.extend([0.0] * 64)
    with grpc.insecure_channel(server.grpc_address) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelInfer(
                pb.ModelInferRequest(model_name="mlp", inputs=[tensor]), metadata=tuple(bearer(INFER).items())
            )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "names a shared memory region and sends contents too" in str(caught.value.details())


def test_grpc_answers_tritons_status_codes(
    server: KilnServer, grpc_client: triton_grpc.InferenceServerClient, segments: dict[str, object]
) -> None:
    """ALREADY_EXISTS for a name registered already and NOT_FOUND for one that is not, as Triton's
    shared memory manager answers; unregistering an unknown name is no error there either."""
    admin, infer = tuple(bearer(ADMIN).items()), tuple(bearer(INFER).items())
    grpc_client.register_system_shared_memory("r", segments["in_key"], IN_BYTES, headers=bearer(ADMIN))
    tensor = pb.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=[BATCH, 64])
    tensor.parameters["shared_memory_region"].string_param = "nope"
    tensor.parameters["shared_memory_byte_size"].int64_param = IN_BYTES
    with grpc.insecure_channel(server.grpc_address) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)

        def refused(
            method: str, request: object, metadata: tuple[tuple[str, str], ...]
        ) -> tuple[object, str]:
            with pytest.raises(grpc.RpcError) as caught:
                getattr(stub, method)(request, metadata=metadata)
            return caught.value.code(), str(caught.value.details())

        again = pb.SystemSharedMemoryRegisterRequest(
            name="r", key=str(segments["in_key"]), byte_size=IN_BYTES
        )
        code, message = refused("SystemSharedMemoryRegister", again, admin)
        assert code == grpc.StatusCode.ALREADY_EXISTS and "region 'r' is registered already" in message
        unknown = "no shared memory region 'nope' is registered"
        code, message = refused(
            "SystemSharedMemoryStatus", pb.SystemSharedMemoryStatusRequest(name="nope"), infer
        )
        assert code == grpc.StatusCode.NOT_FOUND and unknown in message
        code, message = refused("ModelInfer", pb.ModelInferRequest(model_name="mlp", inputs=[tensor]), infer)
        assert code == grpc.StatusCode.NOT_FOUND and unknown in message
        stub.SystemSharedMemoryUnregister(pb.SystemSharedMemoryUnregisterRequest(name="nope"), metadata=admin)


def test_a_region_an_older_kiln_stored_is_dropped(server: KilnServer, segments: dict[str, object]) -> None:
    """A record without the segment's identity (an older Kiln's) cannot be used: the status
    leaves it out, a request that names it finds no region, and each is deleted, and logged
    once; unregistering every region removes such records too."""
    store = LocalStore(Path(server.env["KILN_DATA_DIR"]))
    prefix = f"{shared_memory._this_host()}/"
    admin = httpx.Client(base_url=server.url, headers=bearer(ADMIN), timeout=30)
    base = "/v2/systemsharedmemory"

    def store_old(name: str) -> None:
        store.put_doc(
            KIND, prefix + name, {"name": name, "key": segments["in_key"], "offset": 0, "byte_size": 16}
        )

    def dropped() -> list[str]:
        return [
            line["message"] for line in server.json_lines() if "stored record is not valid" in line["message"]
        ]

    try:
        store_old("old")
        body = {"key": segments["in_key"], "offset": 0, "byte_size": IN_BYTES}
        assert admin.post(f"{base}/region/new/register", json=body).status_code == 200
        for _ in range(2):
            response = admin.get(f"{base}/status")
            assert response.status_code == 200, response.text
            assert [r["name"] for r in response.json()] == ["new"]
        assert store.get_doc(KIND, prefix + "old") is None
        assert len(dropped()) == 1 and "'old'" in dropped()[0]

        store_old("old")
        response = admin.get(f"{base}/region/old/status")
        assert response.status_code == 404, response.text
        assert "no shared memory region 'old' is registered" in response.json()["error"]
        assert store.get_doc(KIND, prefix + "old") is None

        store_old("old")
        assert admin.post(f"{base}/unregister").status_code == 200
        assert store.list_docs(KIND, prefix) == []
    finally:
        admin.post(f"{base}/unregister")
        admin.close()
        store.close()


def test_each_misuse_says_what_to_fix(server: KilnServer, segments: dict[str, object]) -> None:
    """A 400, or as in Triton a 404 for a region that is not registered; `{"error"}` either way."""
    admin = httpx.Client(base_url=server.url, headers=bearer(ADMIN), timeout=30)
    base = "/v2/systemsharedmemory"

    def register(name: str, key: object, byte_size: object, offset: object = 0) -> httpx.Response:
        body = {"key": key, "offset": offset, "byte_size": byte_size}
        return admin.post(f"{base}/region/{name}/register", json=body)

    def infer(params: dict[str, object], outputs: list[dict[str, object]] | None = None) -> httpx.Response:
        doc: dict[str, object] = {
            "inputs": [{"name": "x", "shape": [BATCH, 64], "datatype": "FP32", "parameters": params}]
        }
        if outputs is not None:
            doc["outputs"] = outputs
        return admin.post("/v2/models/mlp/infer", json=doc)

    def refused(response: httpx.Response, message: str, status: int = 400) -> None:
        assert response.status_code == status, response.text
        assert message in response.json()["error"]

    try:
        refused(
            register("r", "/kiln_no_such_segment", 16),
            "cannot open shared memory segment '/kiln_no_such_segment'",
        )
        refused(register("r", "../etc/passwd", 16), "key must be a shm_open name")
        refused(register("r", "/..", 16), "key must be a shm_open name")
        refused(register("r", segments["in_key"], True), "byte_size")  # strict: not a number
        refused(register("r", segments["in_key"], 16, offset="8"), "offset")
        refused(register("r", segments["in_key"], IN_BYTES, offset=8), f"which is {IN_BYTES} bytes")
        assert register("r", segments["in_key"], IN_BYTES).status_code == 200
        refused(register("r", segments["in_key"], 8), "region 'r' is registered already")
        unknown = "no shared memory region 'nope' is registered"
        refused(admin.get(f"{base}/region/nope/status"), unknown, 404)
        assert admin.post(f"{base}/region/nope/unregister").status_code == 200  # as in Triton

        x = sample(MLP, BATCH)
        shm.set_shared_memory_region(segments["in"], [x])
        full = {"shared_memory_region": "r", "shared_memory_byte_size": IN_BYTES}
        refused(infer({**full, "shared_memory_region": "nope"}), unknown, 404)
        nope = {"shared_memory_region": "nope", "shared_memory_byte_size": OUT_BYTES}
        refused(infer(full, [{"name": "output0", "parameters": nope}]), unknown, 404)
        refused(infer({**full, "shared_memory_byte_size": IN_BYTES - 4}), "shared_memory_byte_size is")
        refused(infer({**full, "shared_memory_offset": 4}), "runs past the end of shared memory region 'r'")
        refused(infer({"shared_memory_region": "r"}), "shared_memory_byte_size is missing")
        refused(
            infer({**full, "binary_data_size": IN_BYTES}), "names a shared memory region and sends data too"
        )
        small = {"shared_memory_region": "r", "shared_memory_byte_size": 16}
        refused(infer(full, [{"name": "output0", "parameters": small}]), f"give it at least {OUT_BYTES}")
        classes = {**small, "classification": 2}  # tritonclient refuses it before sending, too
        refused(infer(full, [{"name": "output0", "parameters": classes}]), "classification is answered")
        assert infer(full).status_code == 200

        # A client that shrinks its segment, or puts something else in its place, gets a 400,
        # not a crashed or hung server, and nothing is read or written elsewhere.
        path = Path("/dev/shm") / str(segments["in_key"])[1:]
        os.truncate(path, 16)
        refused(infer(full), "is shorter than when it was registered")
        os.truncate(path, IN_BYTES)
        assert infer(full).status_code == 200
        saved = path.read_bytes()
        path.unlink()
        path.write_bytes(saved)  # the same name and size, but another segment
        refused(infer(full), "is not the one region 'r' was registered on")
        path.unlink()
        os.mkfifo(path)
        refused(infer(full), "is not a shm_open segment")
        path.unlink()
        path.symlink_to("/etc/hostname")
        refused(infer(full), "cannot open shared memory segment")
        path.unlink()
        path.write_bytes(saved)  # back for the fixture to remove
        assert admin.get("/v2/health/live").status_code == 200

        infer_only = httpx.post(f"{server.url}{base}/unregister", headers=bearer(INFER))
        assert infer_only.status_code == 403, infer_only.text
    finally:
        admin.post(f"{base}/unregister")
        admin.close()


def test_shared_memory_is_off_unless_asked_for(tmp_path: Path) -> None:
    with embedded_server(tmp_path) as srv:
        body = {"key": "/kiln_any", "offset": 0, "byte_size": 4}
        response = httpx.post(f"{srv.url}/v2/systemsharedmemory/region/r/register", json=body)
        assert response.status_code == 400
        assert "KILN_SHARED_MEMORY=true" in response.json()["error"]
        doc = {
            "inputs": [
                {
                    "name": "x",
                    "shape": [1, 64],
                    "datatype": "FP32",
                    "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 256},
                }
            ]
        }
        response = httpx.post(
            f"{srv.url}/v2/models/mlp/infer", json=doc
        )  # read before the model is looked up
        assert response.status_code == 400, response.text
        assert "KILN_SHARED_MEMORY=true" in response.json()["error"]
        assert "system_shared_memory" not in httpx.get(f"{srv.url}/v2").json()["extensions"]


@pytest.mark.parametrize("kind", ["local", "redis"])
def test_every_process_on_a_host_sees_the_same_regions(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path, segments: dict[str, object]
) -> None:
    """Registrations live in the store, per host: one worker registers, another serves, each
    with its own connection to the store, in embedded and in Redis mode."""

    def opened() -> Store:
        return RedisStore(request.getfixturevalue("redis_url")) if kind == "redis" else LocalStore(tmp_path)

    stores = [opened(), opened()]
    one, other = SharedMemory(stores[0], True, "host-a"), SharedMemory(stores[1], True, "host-a")
    elsewhere = SharedMemory(stores[1], True, "host-b")
    x = sample(MLP, BATCH)
    shm.set_shared_memory_region(segments["in"], [x])
    one.register("r", str(segments["in_key"]), 0, IN_BYTES)
    assert other.read(SharedSlice("r", IN_BYTES), "x") == x.tobytes()
    assert [r.name for r in other.status()] == ["r"] and elsewhere.status() == []
    other.unregister("r")
    assert one.status() == []
    for store in stores:
        store.close()


def test_reads_and_writes_go_in_chunks_to_the_segment_registered_then(
    tmp_path: Path, segments: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Linux moves at most about 2 GiB per call: big tensors are read and written in chunks. An
    output bound before its region is registered anew still goes where the request saw it."""
    monkeypatch.setattr(shared_memory, "CHUNK_BYTES", 100)
    store = LocalStore(tmp_path)
    regions = SharedMemory(store, True, "host-a")
    x = sample(MLP, BATCH)
    shm.set_shared_memory_region(segments["in"], [x])
    regions.register("in", str(segments["in_key"]), 0, IN_BYTES)
    assert regions.read(SharedSlice("in", IN_BYTES), "x") == x.tobytes()
    regions.register("out", str(segments["out_key"]), 0, OUT_BYTES)
    bound = regions.bind(SharedSlice("out", OUT_BYTES), "y")
    regions.unregister("out")
    regions.register("out", str(segments["in_key"]), 0, IN_BYTES)  # the name, elsewhere now
    y = np.arange(BATCH * 10, dtype=np.float32)
    regions.write(bound, y.tobytes(), "y")
    np.testing.assert_array_equal(shm.get_contents_as_numpy(segments["out"], np.float32, [BATCH * 10]), y)
    assert regions.read(SharedSlice("in", IN_BYTES), "x") == x.tobytes()  # untouched
    store.close()
