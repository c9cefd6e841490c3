"""The v2 tensor codec, checked against itself and against the official tritonclient's encoder/decoder."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tritonclient.http as triton

from service.errors import BadRequestError
from service.tensors import (
    DATATYPES,
    InferRequest,
    decode_request,
    decode_tensors,
    encode_response,
    encode_tensor,
)


def sample(datatype: str, shape: tuple[int, ...] = (2, 3)) -> np.ndarray:
    """Values that stress each datatype: its extremes for integers, fractions and signs for floats."""
    dtype = DATATYPES[datatype]
    count = int(np.prod(shape))
    if dtype.kind == "b":
        values = np.arange(count) % 2 == 0
    elif dtype.kind in "iu":
        info = np.iinfo(dtype)
        values = np.resize(np.array([info.min, info.max, 0, 1, info.max - 1, info.min + 1], dtype), count)
    else:
        values = np.resize(np.array([-1.5, 0.0, 0.25, 3.0e3, -7.125, 1.0], dtype), count)
    return values.astype(dtype).reshape(shape)


def request_body(tensors: list[dict[str, object]], **extra: object) -> bytes:
    return json.dumps({"inputs": tensors, **extra}).encode()


@pytest.mark.parametrize("datatype", list(DATATYPES))
@pytest.mark.parametrize("binary", [False, True])
def test_round_trip(datatype: str, binary: bool) -> None:
    array = sample(datatype)
    doc, raw = encode_tensor("t", array, binary)
    assert doc["datatype"] == datatype and doc["shape"] == [2, 3]
    assert ("data" in doc) is not binary
    decoded = decode_tensors([doc], raw)["t"]
    assert decoded.dtype == array.dtype
    np.testing.assert_array_equal(decoded, array)


@pytest.mark.parametrize("datatype", list(DATATYPES))
def test_nested_and_flat_data_agree(datatype: str) -> None:
    array = sample(datatype)
    flat = {"name": "t", "datatype": datatype, "shape": [2, 3], "data": array.ravel().tolist()}
    nested = {**flat, "data": array.tolist()}
    regrouped = {**flat, "data": array.reshape(3, 2).tolist()}  # nesting is notation; shape rules
    for doc in (flat, nested, regrouped):
        np.testing.assert_array_equal(decode_tensors([doc])["t"], array)


@pytest.mark.parametrize("datatype", list(DATATYPES))
@pytest.mark.parametrize("binary", [False, True])
def test_decodes_what_tritonclient_sends(datatype: str, binary: bool) -> None:
    array = sample(datatype, (3, 2))
    tensor = triton.InferInput("x", list(array.shape), datatype)
    tensor.set_data_from_numpy(array, binary_data=binary)
    body, json_size = triton.InferenceServerClient.generate_request_body(
        [tensor], outputs=[triton.InferRequestedOutput("y", binary_data=False)], request_id="r1"
    )
    request = decode_request(body, None if json_size is None else str(json_size))
    assert request.id == "r1"
    assert request.outputs == {"y": False}
    assert request.inputs["x"].dtype == array.dtype
    np.testing.assert_array_equal(request.inputs["x"], array)


@pytest.mark.parametrize("binary", [False, True])
def test_tritonclient_reads_what_we_encode(binary: bool) -> None:
    arrays = {dt: sample(dt, (2, 2)) for dt in DATATYPES}
    body, json_size = encode_response(
        {"model_name": "m", "model_version": "1", "id": "r1"},
        [(dt, array, binary) for dt, array in arrays.items()],
    )
    assert (json_size is not None) is binary
    result = triton.InferenceServerClient.parse_response_body(body, header_length=json_size)
    assert result.get_response()["id"] == "r1"
    for datatype, array in arrays.items():
        got = result.as_numpy(datatype)
        assert got.dtype == array.dtype, datatype
        np.testing.assert_array_equal(got, array)


def test_binary_and_json_inputs_mix_in_order() -> None:
    a, b, c = sample("FP32"), sample("INT64"), sample("BOOL")
    docs, chunks = [], []
    for name, array, binary in [("a", a, True), ("b", b, False), ("c", c, True)]:
        doc, raw = encode_tensor(name, array, binary)
        docs.append(doc)
        chunks.append(raw)
    header = request_body(docs)
    request = decode_request(header + b"".join(chunks), str(len(header)))
    for name, array in [("a", a), ("b", b), ("c", c)]:
        np.testing.assert_array_equal(request.inputs[name], array)


def test_empty_tensor() -> None:
    doc = {"name": "t", "datatype": "INT32", "shape": [0, 4], "data": []}
    assert decode_tensors([doc])["t"].shape == (0, 4)


def test_output_selection() -> None:
    outputs = {"a": np.zeros(1), "b": np.ones(1)}
    everything = InferRequest(None, {}, None, binary_output=True)
    assert [(n, binary) for n, _, binary in everything.select(outputs)] == [("a", True), ("b", True)]
    request = decode_request(
        request_body(
            [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}],
            outputs=[{"name": "b"}, {"name": "a", "parameters": {"binary_data": True}}],
            parameters={"binary_data_output": False},
        ),
        None,
    )
    assert [(n, binary) for n, _, binary in request.select(outputs)] == [("b", False), ("a", True)]
    with pytest.raises(BadRequestError, match=r"unknown output\(s\) \['c'\]"):
        InferRequest(None, {}, {"c": False}, binary_output=False).select(outputs)


def tensor(**fields: object) -> dict[str, object]:
    return {"name": "x", "datatype": "FP32", "shape": [2], "data": [1.0, 2.0], **fields}


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (tensor(datatype="FP33"), "unknown datatype"),
        (tensor(datatype="BYTES"), "BYTES tensors are not supported"),
        (tensor(shape=[3]), r"shape \[3\] holds 3 elements, but `data` has 2"),
        (tensor(shape=[2, -1]), "non-negative integers"),
        (tensor(shape="2"), "non-negative integers"),
        (tensor(shape=[1] * 100, data=[1.0]), "at most 32 are supported"),
        (tensor(data=[[1.0, 2.0], [3.0]]), "not a regular array"),
        (tensor(data=["a", "b"]), "FP32 data must be numbers"),
        (tensor(data=[1.0, None]), "FP32 data must be numbers"),
        (tensor(datatype="INT32", data=[1.5, 2]), "INT32 data must be integers"),
        (tensor(datatype="INT8", data=[1, 300]), "out of the range of INT8"),
        (tensor(datatype="UINT8", data=[-1, 0]), "out of the range of UINT8"),
        (tensor(datatype="BOOL", data=[0, 1]), "BOOL data must be true/false"),
        # numpy takes true for 1 and false for 0 beside numbers: refused, as a list of them is.
        (tensor(data=[True, False]), "FP32 data must be numbers"),
        (tensor(data=[True, 0.0]), "FP32 data must be numbers, not true/false"),
        (tensor(shape=[2, 2], data=[[0.5, 2.0], [3.0, False]]), "FP32 data must be numbers, not true/false"),
        (
            tensor(datatype="INT64", shape=[4], data=[True, 1, 1, 1]),
            "INT64 data must be integers, not true/false",
        ),
        (tensor(datatype="UINT64", data=[True, 2**64 - 1]), "UINT64 data must be integers, not true/false"),
        (tensor(datatype="UINT64", data=[False, 2**70]), "UINT64 data must be integers, not true/false"),
        ({"datatype": "FP32", "shape": [1], "data": [1]}, "needs a string `name`"),
        ({"name": "x", "datatype": "FP32", "shape": [1]}, "neither `data` nor"),
        (tensor(parameters={"binary_data_size": 8}), "both `data` and binary_data_size"),
        (tensor(parameters={"binary_data_size": -1}), "non-negative integer"),
        ("x", "must be a JSON object"),
    ],
)
def test_malformed_tensor(doc: object, message: str) -> None:
    with pytest.raises(BadRequestError, match=message):
        decode_tensors([doc])


def test_binary_sizes_must_match() -> None:
    doc = {"name": "x", "datatype": "FP32", "shape": [2], "parameters": {"binary_data_size": 8}}
    two = np.array([1, 2], np.float32).tobytes()
    np.testing.assert_array_equal(decode_tensors([doc], two)["x"], [1, 2])
    with pytest.raises(BadRequestError, match="runs past the end of the body"):
        decode_tensors([doc], two[:4])
    with pytest.raises(BadRequestError, match="4 bytes after the JSON header"):
        decode_tensors([doc], two + b"\0" * 4)
    short = {**doc, "parameters": {"binary_data_size": 4}}
    with pytest.raises(
        BadRequestError, match=r"binary_data_size is 4 bytes, but shape \[2\] of FP32 needs 8"
    ):
        decode_tensors([short], two[:4])
    with pytest.raises(BadRequestError, match="given twice"):
        decode_tensors([doc, doc], two + two)


@pytest.mark.parametrize(
    ("body", "header_length", "message"),
    [
        (b"{not json", None, "not valid JSON"),
        (b"\xff\xfe\x00", None, "not valid JSON"),
        (b"[" * 100_000 + b"]" * 100_000, None, "not valid JSON"),
        (b"[1, 2]", None, "must be a JSON object"),
        (b"{}", None, "non-empty list of tensors"),
        (request_body([tensor()]), "9999", "Inference-Header-Content-Length is 9999, but the body has"),
        (request_body([tensor()]), "-1", "must be a byte count in digits, not '-1'"),
        (request_body([tensor()]), "ten", "must be a byte count in digits, not 'ten'"),
        # int() takes these, past the JSON limit's check of the text.
        (request_body([tensor()]), "+5", r"must be a byte count in digits, not '\+5'"),
        (request_body([tensor()]), "1_0", "must be a byte count in digits, not '1_0'"),
        (request_body([tensor()]), " 10", "must be a byte count in digits"),
        (request_body([tensor()], id=7), None, "`id` must be a string"),
        (request_body([tensor(data=[1.5, True])]), None, "FP32 data must be numbers, not true/false"),
        (request_body([tensor()], parameters={"binary_data_output": "yes"}), None, "true or false"),
        (request_body([tensor()], outputs=[{"parameters": {}}]), None, "needs a string `name`"),
        (
            request_body([tensor()], outputs=[{"name": "y", "parameters": {"classification": -3}}]),
            None,
            "output 'y': classification must be a non-negative integer",
        ),
    ],
)
def test_malformed_request(body: bytes, header_length: str | None, message: str) -> None:
    with pytest.raises(BadRequestError, match=message):
        decode_request(body, header_length)
