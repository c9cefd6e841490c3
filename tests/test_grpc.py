"""The Open Inference Protocol over gRPC against a real server: the official tritonclient.grpc
unchanged, typed tensor contents through the protocol's own stub, and each error's status."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc
from tritonclient.utils import InferenceServerException

from tests import models
from tests.client import Samples, check_classes, expected, sample, scrape, upload
from tests.servers import KilnServer, embedded_server, running, wait_until
from tests.test_v2 import HEADS

ADMIN, INFER = "admin-secret", "infer-secret"
MLP = models.MODELS["mlp"]
INFER_KEY = {"authorization": f"Bearer {INFER}"}
ADMIN_KEY = {"authorization": f"Bearer {ADMIN}"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KilnServer]:
    root = tmp_path_factory.mktemp("grpc")
    keys = f"{ADMIN}:admin,{INFER}:infer"
    env = {"KILN_DATA_DIR": str(root / "data"), "KILN_API_KEYS": keys, "KILN_MAX_UPLOAD_MB": "1"}
    srv = KilnServer(env, root / "kiln.log")
    with running(srv):
        with httpx.Client(
            base_url=srv.url, timeout=60, headers={"Authorization": f"Bearer {ADMIN}"}
        ) as admin:
            for model in (MLP, HEADS):
                response = upload(admin, model, backends=[])
                assert response.status_code == 202, response.text
        yield srv


@pytest.fixture
def client(server: KilnServer) -> Iterator[triton.InferenceServerClient]:
    triton_client = triton.InferenceServerClient(url=server.grpc_address)
    yield triton_client
    triton_client.close()


@pytest.fixture
def stub(server: KilnServer) -> Iterator[pb_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(server.grpc_address) as channel:
        yield pb_grpc.GRPCInferenceServiceStub(channel)


def http_doc(server: KilnServer, path: str) -> object:
    return httpx.get(f"{server.url}{path}", headers={"Authorization": f"Bearer {INFER}"}).json()


def fp32(name: str, x: np.ndarray) -> triton.InferInput:
    tensor = triton.InferInput(name, list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return tensor


def test_tritonclient_grpc_conversation(client: triton.InferenceServerClient, server: KilnServer) -> None:
    assert client.is_server_live() and client.is_server_ready()
    assert client.get_server_metadata(as_json=True)["name"] == "kiln"
    assert client.is_model_ready("mlp", headers=INFER_KEY)
    assert client.is_model_ready("mlp", "1", headers=INFER_KEY)
    assert not client.is_model_ready("nope", headers=INFER_KEY)
    # The same documents as over HTTP, in the protobuf's JSON (int64 fields print as strings).
    metadata = client.get_model_metadata("mlp", headers=INFER_KEY, as_json=True)
    assert metadata == {
        "name": "mlp",
        "versions": ["1"],
        "platform": "pytorch_libtorch",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": ["-1", "64"]}],
        "outputs": [{"name": "output0", "datatype": "FP32", "shape": ["-1", "10"]}],
    }
    config = client.get_model_config("mlp", "1", headers=INFER_KEY).config
    want_config = http_doc(server, "/v2/models/mlp/config")
    assert isinstance(want_config, dict)
    assert config.max_batch_size == want_config["max_batch_size"] == 8
    assert [(i.name, list(i.dims)) for i in config.input] == [("x", [64])]
    assert config.dynamic_batching.default_queue_policy.max_queue_size == 1024
    assert config.parameters["adaptive_queue_delay"].string_value == "true"

    x = sample(MLP, 3)
    result = client.infer(
        "mlp",
        [fp32("x", x)],
        outputs=[triton.InferRequestedOutput("output0")],
        request_id="grpc-1",
        headers={**INFER_KEY, "x-request-id": "grpc-first"},
    )
    # The runner's load, in this call, logs under the call's request id.
    loads = [line for line in server.json_lines() if line["message"].startswith("loaded torchscript")]
    assert [line.get("request_id") for line in loads] == ["grpc-first"]
    response = result.get_response()
    assert (response.id, response.model_name, response.model_version) == ("grpc-1", "mlp", "1")
    np.testing.assert_allclose(result.as_numpy("output0"), expected(MLP, x), rtol=1e-5, atol=1e-6)

    # Two inputs and three outputs of three dtypes, and only the outputs asked for.
    k = np.arange(8, dtype=np.int64).reshape(2, 4)
    k_input = triton.InferInput("k", [2, 4], "INT64")
    k_input.set_data_from_numpy(k)
    asked = [triton.InferRequestedOutput("output2"), triton.InferRequestedOutput("output1")]
    result = client.infer("heads", [fp32("x", sample(HEADS, 2)), k_input], outputs=asked, headers=INFER_KEY)
    assert [o.name for o in result.get_response().outputs] == ["output2", "output1"]
    np.testing.assert_array_equal(result.as_numpy("output2"), k * 2 + 1)
    assert result.as_numpy("output1").dtype == np.bool_

    stats = client.get_inference_statistics("mlp", headers=INFER_KEY).model_stats
    assert stats[0].name == "mlp" and stats[0].inference_stats.success.count >= 1
    index = {m.name: m.state for m in client.get_model_repository_index(headers=INFER_KEY).models}
    assert index == {"heads": "READY", "mlp": "READY"}


def test_tritonclient_grpc_classification(client: triton.InferenceServerClient) -> None:
    """The classification extension over gRPC: BYTES strings in the raw output contents, a
    parameter error with its status."""
    x = sample(MLP, 2)
    requested = [triton.InferRequestedOutput("output0", class_count=3)]
    result = client.infer("mlp", [fp32("x", x)], outputs=requested, headers=INFER_KEY)
    assert result.get_output("output0").datatype == "BYTES"
    check_classes(result.as_numpy("output0"), expected(MLP, x), 3)
    with pytest.raises(InferenceServerException, match="'output1' is bool") as caught:
        k = triton.InferInput("k", [1, 4], "INT64")
        k.set_data_from_numpy(np.zeros((1, 4), np.int64))
        requested = [triton.InferRequestedOutput("output1", class_count=2)]
        client.infer("heads", [fp32("x", sample(HEADS, 1)), k], outputs=requested, headers=INFER_KEY)
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_tritonclient_grpc_compression(client: triton.InferenceServerClient, algorithm: str) -> None:
    """tritonclient's `compression_algorithm` compresses the request message; grpc decodes it."""
    x = sample(MLP, 4)
    result = client.infer("mlp", [fp32("x", x)], headers=INFER_KEY, compression_algorithm=algorithm)
    np.testing.assert_allclose(result.as_numpy("output0"), expected(MLP, x), rtol=1e-5, atol=1e-6)


def test_typed_contents_and_raw_contents_agree(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    """Clients other than tritonclient (KServe's) send typed contents instead of raw bytes;
    a batch of 8 (512 values) decodes off the event loop, a batch of 2 on it."""
    for batch in (2, 8):
        x = sample(MLP, batch)
        tensor = pb.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=list(x.shape))
        tensor.contents.fp32_contents.extend(x.ravel().tolist())
        response = stub.ModelInfer(
            pb.ModelInferRequest(model_name="mlp", inputs=[tensor]), metadata=tuple(INFER_KEY.items())
        )
        [output] = response.outputs
        assert (output.name, output.datatype, list(output.shape)) == ("output0", "FP32", [batch, 10])
        got = np.frombuffer(response.raw_output_contents[0], np.float32).reshape(batch, 10)
        np.testing.assert_allclose(got, expected(MLP, x), rtol=1e-5, atol=1e-6)


def status_of(call: object) -> tuple[object, str]:
    assert isinstance(call, grpc.RpcError)
    return call.code(), call.details()


def test_each_error_has_its_status(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    def infer(
        request: pb.ModelInferRequest, key: dict[str, str] | None = INFER_KEY
    ) -> tuple[grpc.StatusCode, str]:
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelInfer(request, metadata=tuple((key or {}).items()))
        return status_of(caught.value)

    x = sample(MLP, 1)
    raw = pb.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=[1, 64])
    good = pb.ModelInferRequest(model_name="mlp", inputs=[raw], raw_input_contents=[x.tobytes()])

    code, message = infer(good, key=None)
    assert code == grpc.StatusCode.UNAUTHENTICATED and "API key is required" in message
    assert infer(pb.ModelInferRequest(model_name="nope", inputs=[raw], raw_input_contents=[x.tobytes()])) == (
        grpc.StatusCode.NOT_FOUND,
        "no model named 'nope'",
    )
    # Echoed back in the grpc-message trailer, a name of 12,000 characters made the client's
    # status RESOURCE_EXHAUSTED; so did 2,000 characters that percent-encode to 9 bytes each.
    for long_name in ("n" * 12_000, "名" * 2_000):
        request = pb.ModelInferRequest(model_name=long_name, inputs=[raw], raw_input_contents=[x.tobytes()])
        code, message = infer(request)
        assert code == grpc.StatusCode.NOT_FOUND and message.endswith("... (cut short)"), (
            code,
            message[:200],
        )
    # Contents in another type's field: they went unread, and the count was said to be `data`'s.
    as_ints = pb.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=[1, 64])
    as_ints.contents.int_contents.extend([1] * 64)
    code, message = infer(pb.ModelInferRequest(model_name="mlp", inputs=[as_ints]))
    assert (code, message) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "tensor 'x': FP32 contents go in fp32_contents, not int_contents",
    )
    # A malformed region is the error, not the count of raw contents that follows from it.
    in_shared = pb.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=[1, 64])
    in_shared.parameters["shared_memory_region"].int64_param = 7
    request = pb.ModelInferRequest(model_name="mlp", inputs=[in_shared], raw_input_contents=[x.tobytes()])
    code, message = infer(request)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "input 'x': shared_memory_region must name a registered region" in message
    fp64 = pb.ModelInferRequest.InferInputTensor(name="x", datatype="FP64", shape=[1, 64])
    code, message = infer(
        pb.ModelInferRequest(model_name="mlp", inputs=[fp64], raw_input_contents=[bytes(512)])
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "expected datatype FP32, received FP64" in message
    code, message = infer(pb.ModelInferRequest(model_name="mlp", inputs=[raw], raw_input_contents=[bytes(8)]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "tensor 'x': raw_input_contents is 8 bytes, but shape [1, 64] of FP32 needs 256" in message
    # FP16 has no typed contents, but a tensor of no elements needs no bytes: it decodes.
    empty = pb.ModelInferRequest.InferInputTensor(name="x", datatype="FP16", shape=[0, 64])
    code, message = infer(pb.ModelInferRequest(model_name="mlp", inputs=[empty]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "expected datatype FP32, received FP16" in message
    half = pb.ModelInferRequest.InferInputTensor(name="x", datatype="FP16", shape=[1, 64])
    code, message = infer(pb.ModelInferRequest(model_name="mlp", inputs=[half]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "send FP16 in raw_input_contents" in message
    code, message = infer(pb.ModelInferRequest(model_name="mlp", inputs=[raw]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "shape [1, 64] holds 64 elements" in message
    two = pb.ModelInferRequest(model_name="mlp", inputs=[raw, raw], raw_input_contents=[x.tobytes()])
    code, message = infer(two)
    assert (
        code == grpc.StatusCode.INVALID_ARGUMENT
        and "raw_input_contents has 1 entries for 2 inputs" in message
    )
    both = pb.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=[1, 64])
    both.contents.fp32_contents.extend(x.ravel().tolist())
    with_raw = pb.ModelInferRequest(model_name="mlp", inputs=[both], raw_input_contents=[bytes(256)])
    code, message = infer(with_raw)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "has contents, and raw_input_contents" in message
    code, message = infer(pb.ModelInferRequest(model_name="mlp", model_version="x1", inputs=[raw]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "must be an integer" in message
    unknown_output = pb.ModelInferRequest(
        model_name="mlp",
        inputs=[raw],
        raw_input_contents=[x.tobytes()],
        outputs=[pb.ModelInferRequest.InferRequestedOutputTensor(name="logits")],
    )
    code, message = infer(unknown_output)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "unknown output(s) ['logits']" in message
    classified = pb.ModelInferRequest.InferRequestedOutputTensor(name="output0")
    classified.parameters["classification"].string_param = "three"
    unknown_output.outputs[0].CopyFrom(classified)
    code, message = infer(unknown_output)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "classification must be a non-negative" in message
    # Past KILN_MAX_UPLOAD_MB (1 here), as an HTTP body past it gets 413.
    big = pb.ModelInferRequest(model_name="mlp", inputs=[raw], raw_input_contents=[bytes(2 * 1024 * 1024)])
    code, _ = infer(big)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    # Typed contents are held to the elements a JSON body of KILN_MAX_JSON_MB (1 MiB here) holds:
    # packed zeros take a byte each, and each became a Python number (38 MB of them took 1.5 GB).
    zeros = pb.ModelInferRequest.InferInputTensor(name="x", datatype="INT64", shape=[8193, 64])
    zeros.contents.int64_contents.extend(np.zeros(8193 * 64, np.int64))
    code, message = infer(pb.ModelInferRequest(model_name="mlp", inputs=[zeros]))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "typed contents of 524352 elements, past the 524288 that KILN_MAX_JSON_MB allows" in message
    assert stub.ModelInfer(good, metadata=tuple(INFER_KEY.items())).model_name == "mlp"  # nothing stuck
    with pytest.raises(grpc.RpcError) as caught:
        stub.CudaSharedMemoryStatus(pb.CudaSharedMemoryStatusRequest())
    assert status_of(caught.value) == (
        grpc.StatusCode.UNIMPLEMENTED,
        "Kiln does not offer CudaSharedMemoryStatus",
    )
    # System shared memory is offered, but off unless KILN_SHARED_MEMORY says otherwise.
    with pytest.raises(grpc.RpcError) as caught:
        stub.SystemSharedMemoryStatus(pb.SystemSharedMemoryStatusRequest(), metadata=tuple(INFER_KEY.items()))
    code, message = status_of(caught.value)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "KILN_SHARED_MEMORY=true" in message


def test_grpc_errors_are_counted(server: KilnServer, stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    with pytest.raises(grpc.RpcError):
        stub.ModelMetadata(pb.ModelMetadataRequest(name="nope"), metadata=tuple(INFER_KEY.items()))
    with pytest.raises(grpc.RpcError):
        stub.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(model_name="mlp"))
    text = httpx.get(f"{server.url}/metrics").text
    assert 'kiln_grpc_errors_total{code="NOT_FOUND",method="ModelMetadata"} 1.0' in text
    assert 'kiln_grpc_errors_total{code="UNAUTHENTICATED",method="RepositoryModelUnload"} 1.0' in text


def test_a_call_its_client_gave_up_on_is_counted(server: KilnServer) -> None:
    """As HTTP counts a client that hangs up as 499: it was counted nowhere, its CancelledError
    not an Exception."""
    with httpx.Client(base_url=server.url, timeout=60, headers={"Authorization": f"Bearer {ADMIN}"}) as admin:
        # A batch that waits 5 s for more requests: the call's deadline passes while it waits.
        delayed = upload(
            admin, MLP, name="mlp-delayed", max_queue_delay_us=5_000_000, adaptive_queue_delay=False
        )
        assert delayed.status_code == 202, delayed.text
    x = sample(MLP, 1)
    raw = pb.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=[1, 64])
    request = pb.ModelInferRequest(model_name="mlp-delayed", inputs=[raw], raw_input_contents=[x.tobytes()])
    with grpc.insecure_channel(server.grpc_address) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelInfer(request, metadata=tuple(INFER_KEY.items()), timeout=0.5)
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED

    def counted() -> bool:
        text = httpx.get(f"{server.url}/metrics").text
        return 'kiln_grpc_errors_total{code="CANCELLED",method="ModelInfer"} 1.0' in text

    wait_until(counted, 10, "the cancelled call counted")


def refused(samples: Samples) -> dict[str, float]:
    """The UNAUTHENTICATED counts, by method."""
    counts = samples.get("kiln_grpc_errors_total", [])
    return {labels["method"]: n for labels, n in counts if labels["code"] == "UNAUTHENTICATED"}


def test_a_caller_with_no_key_makes_up_no_error_series(server: KilnServer) -> None:
    """Refusals count by method only for the service's own methods: any other path, which a
    caller with no key chooses freely, counts as "unknown", not as a series of its own."""
    paths = ["/made.Up/Method1", "/inference.GRPCInferenceService/Method2", "/other.Service/ModelInfer"]
    with httpx.Client(base_url=server.url) as http, grpc.insecure_channel(server.grpc_address) as channel:
        was = refused(scrape(http))
        for path in paths:
            call = channel.unary_unary(path, request_serializer=bytes, response_deserializer=bytes)
            with pytest.raises(grpc.RpcError) as caught:
                call(b"")
            assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED, caught.value
        now = refused(scrape(http))
    assert set(now) - set(was) <= {"unknown"}
    assert now["unknown"] == was.get("unknown", 0) + len(paths)
    assert now.get("ModelInfer") == was.get("ModelInfer")


def test_unload_and_load_need_admin_and_hold(client: triton.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException, match="needs admin") as caught:
        client.unload_model("heads", headers=INFER_KEY)
    assert caught.value.status() == "StatusCode.PERMISSION_DENIED"
    client.unload_model("heads", headers=ADMIN_KEY)
    try:
        assert not client.is_model_ready("heads", headers=INFER_KEY)
        x = fp32("x", sample(HEADS, 1))
        k = triton.InferInput("k", [1, 4], "INT64")
        k.set_data_from_numpy(np.zeros((1, 4), np.int64))
        with pytest.raises(InferenceServerException, match="heads/load serves it again") as caught:
            client.infer("heads", [x, k], headers=INFER_KEY)
        assert caught.value.status() == "StatusCode.FAILED_PRECONDITION"
    finally:
        client.load_model("heads", headers=ADMIN_KEY)
    assert client.is_model_ready("heads", headers=INFER_KEY)
    assert client.infer("heads", [x, k], headers=INFER_KEY).as_numpy("output2").tolist() == [[1] * 4]


StreamResult = tuple["triton.InferResult | None", "InferenceServerException | None"]


def streamed(
    client: triton.InferenceServerClient, requests: list[tuple[str, str]], key: dict[str, str] | None
) -> list[StreamResult]:
    """What tritonclient's stream callback got for each `(model, request id)`, in the order it got
    them; each request a batch-1 MLP input of its own."""
    got: queue.Queue[StreamResult] = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put((result, error)), headers=key)
    for i, (model, rid) in enumerate(requests):
        client.async_stream_infer(model, [fp32("x", sample(MLP, 1, seed=i))], request_id=rid)
    client.stop_stream()  # closes the request stream and waits for every answer
    return [got.get_nowait() for _ in range(got.qsize())]


def test_stream_answers_each_request_in_order(client: triton.InferenceServerClient) -> None:
    """ModelStreamInfer, as tritonclient streams: the answers come in the order the requests went,
    each equal to its unbatched result, and an error answers its own request only."""
    requests = [("mlp", str(i)) for i in range(24)]
    requests[7] = ("nope", "7")
    answers = streamed(client, requests, INFER_KEY)
    assert len(answers) == len(requests)
    for i, (result, error) in enumerate(answers):
        if i == 7:
            assert result is None and error is not None
            assert "no model named 'nope'" in error.message()
            continue
        assert error is None and result is not None
        response = result.get_response()
        assert response.id == str(i)
        # As Triton marks each answer of a model that is not decoupled: the request's last.
        assert response.parameters["triton_final_response"].bool_param is True
        got = result.as_numpy("output0")
        np.testing.assert_allclose(got, expected(MLP, sample(MLP, 1, seed=i)), rtol=1e-5, atol=1e-6)


def stream_call(
    stub: pb_grpc.GRPCInferenceServiceStub, key: dict[str, str] | None
) -> tuple[grpc.StatusCode, str]:
    """The status that ends a stream of one good MLP request, or of a message that is not one."""
    x = sample(MLP, 1)
    raw = pb.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=[1, 64])
    good = pb.ModelInferRequest(model_name="mlp", inputs=[raw], raw_input_contents=[x.tobytes()])
    with pytest.raises(grpc.RpcError) as caught:
        list(stub.ModelStreamInfer(iter([good]), metadata=tuple((key or {}).items())))
    return status_of(caught.value)


def test_stream_needs_a_key(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    code, message = stream_call(stub, None)
    assert code == grpc.StatusCode.UNAUTHENTICATED and "API key is required" in message


def test_a_malformed_stream_message_is_the_clients_error(server: KilnServer) -> None:
    with grpc.insecure_channel(server.grpc_address) as channel:
        stream = channel.stream_stream(
            "/inference.GRPCInferenceService/ModelStreamInfer",
            request_serializer=lambda raw: raw,
            response_deserializer=pb.ModelStreamInferResponse.FromString,
        )
        with pytest.raises(grpc.RpcError) as caught:
            list(stream(iter([b"\xff\xff\xff"]), metadata=tuple(INFER_KEY.items())))
    code, message = status_of(caught.value)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "malformed" in message, message


@pytest.mark.parametrize("method", ["ModelInfer", "ModelMetadata", "SystemSharedMemoryRegister"])
def test_a_malformed_unary_message_is_the_clients_error(server: KilnServer, method: str) -> None:
    """Not gRPC's UNKNOWN, with a traceback in the server's log as if Kiln had failed."""
    with grpc.insecure_channel(server.grpc_address) as channel:
        call = channel.unary_unary(
            f"/inference.GRPCInferenceService/{method}",
            request_serializer=lambda raw: raw,
            response_deserializer=lambda raw: raw,
        )
        with pytest.raises(grpc.RpcError) as caught:
            call(b"\x0a\xff\xff\xff\xff", metadata=tuple(ADMIN_KEY.items()))
    code, message = status_of(caught.value)
    assert code == grpc.StatusCode.INVALID_ARGUMENT, message
    assert message.startswith("the request message is malformed: "), message
    assert "Unexpected" not in server.tail(200)


def test_an_unknown_method_is_unimplemented(server: KilnServer) -> None:
    """As gRPC answers it: health probes and reflection clients fall back on UNIMPLEMENTED."""
    with grpc.insecure_channel(server.grpc_address) as channel:
        call = channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=lambda raw: raw,
            response_deserializer=lambda raw: raw,
        )
        with pytest.raises(grpc.RpcError) as caught:
            call(b"", metadata=tuple(ADMIN_KEY.items()))
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED, caught.value


def test_a_stream_request_id_cannot_forge_log_lines(tmp_path: Path) -> None:
    """Text logs carry the request id: a stream request's was taken as sent, newline included,
    where HTTP's and unary gRPC's ids must be short and printable."""
    forged = "abc]\nFORGED ERROR kiln.auth admin key rotated"
    with (
        embedded_server(tmp_path, KILN_LOG_FORMAT="text") as server,
        httpx.Client(base_url=server.url, timeout=60) as http,
        triton.InferenceServerClient(server.grpc_address) as client,
    ):
        assert upload(http, MLP, backends=[]).status_code == 202
        traced = {"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "-1"}
        assert http.post("/v2/trace/setting", json=traced).status_code == 200
        [(result, error)] = streamed(client, [("mlp", forged)], None)
        assert error is None and result is not None and result.get_response().id == forged  # echoed
    lines = server.log.read_text().splitlines()
    assert any("kiln.trace" in line for line in lines), server.tail()
    assert not [line for line in lines if line.startswith("FORGED")]
