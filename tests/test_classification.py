"""The classification extension's ranking and strings, and their BYTES encoding as tritonclient
reads it."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as triton

from service.classification import check_classified, check_labels, classify_cost, top_classes
from service.errors import BadRequestError, InvalidConfigError
from service.records import OutputInfo, TensorConfig
from service.tensors import encode_response


def strings(array: np.ndarray) -> list[object]:
    return [s.decode() for s in array.ravel()]


def test_highest_first_ties_in_index_order_nan_last() -> None:
    values = np.array([[1.0, np.nan, 5.0, 10.0, 5.0, -np.inf]], np.float32)
    assert strings(top_classes(values, 6, True, ["a", "b", "c"])) == [
        "10.000000:3",
        "5.000000:2:c",
        "5.000000:4",
        "1.000000:0:a",
        "-inf:5",
        "nan:1:b",
    ]


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int64, np.uint64, np.float16, np.float64])
def test_every_numeric_dtype_is_ranked_and_printed_as_triton_prints_it(dtype: type) -> None:
    values = np.array([[3, 7, 1]], dtype)
    want = ["7:1", "3:0"] if np.dtype(dtype).kind in "iu" else ["7.000000:1", "3.000000:0"]
    assert strings(top_classes(values, 2, True, [])) == want


def test_uint64_past_int64_and_large_int64_are_exact() -> None:
    assert strings(top_classes(np.array([[2**64 - 1, 2**63]], np.uint64), 1, True, [])) == [f"{2**64 - 1}:0"]
    signed = np.array([[2**63 - 2, 2**63 - 1, -(2**63)]], np.int64)  # -(2**63) does not negate
    want = [f"{2**63 - 1}:1", f"{2**63 - 2}:0", f"{-(2**63)}:2"]
    assert strings(top_classes(signed, 3, True, [])) == want


def test_shapes() -> None:
    values = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    batched = top_classes(values, 2, True, [])
    assert batched.shape == (2, 2) and strings(batched) == [
        "11.000000:11",
        "10.000000:10",
        "23.000000:11",
        "22.000000:10",
    ]
    whole = top_classes(values, 2, False, [])  # a model that does not batch: the whole output
    assert whole.shape == (2,) and strings(whole) == ["23.000000:23", "22.000000:22"]
    assert top_classes(values, 99, True, []).shape == (2, 12)  # no more than there are
    assert top_classes(np.zeros((0, 4), np.float32), 2, True, []).shape == (0, 2)


@pytest.mark.parametrize("binary", [False, True])
def test_tritonclient_reads_the_strings(binary: bool) -> None:
    classes = top_classes(np.array([[0.5, 2.0], [3.0, -1.0]], np.float32), 1, True, ["ünïcode", "b"])
    body, json_size = encode_response({"model_name": "m", "model_version": "1"}, [("out", classes, binary)])
    result = triton.InferenceServerClient.parse_response_body(body, header_length=json_size)
    assert result.get_output("out")["datatype"] == "BYTES"
    got = result.as_numpy("out")
    assert got.shape == (2, 1)
    assert [v.decode() if isinstance(v, bytes) else v for v in got.ravel()] == [
        "2.000000:1:b",
        "3.000000:0:ünïcode",
    ]


def test_labels_as_triton_uses_them_and_nan_as_glibc_prints_it() -> None:
    values = np.array([[1.0, 2.0, 3.0]], np.float32)
    assert strings(top_classes(values, 3, True, ["", "b"])) == ["3.000000:2", "2.000000:1:b", "1.000000:0"]
    signed = np.array([[1.0, np.copysign(np.nan, -1), np.nan]], np.float32)  # -nan: as 0/0 on x86
    assert strings(top_classes(signed, 3, True, [])) == ["1.000000:0", "-nan:1", "nan:2"]


def test_only_numbers_are_ranked_or_labelled() -> None:
    outputs = [OutputInfo(name="o", dtype="complex64", shape=[-1, 4])]
    with pytest.raises(BadRequestError, match="'o' is complex64: classification ranks integers and floats"):
        check_classified({"o": 2}, outputs)
    check_classified({"o": 0}, outputs)  # 0: the values, as in Triton
    with pytest.raises(InvalidConfigError, match="a complex64 output has no classes to label"):
        check_labels({"o": ["a"]}, outputs, [], "labels")


def test_class_count_is_checked_only_where_the_output_shape_is_fixed() -> None:
    outputs = [OutputInfo(name="o", dtype="float32", shape=[-1, 1])]
    fixed = [TensorConfig(name="x", dtype="float32", shape=[-1, 8])]
    with pytest.raises(InvalidConfigError, match="2 labels, but output 'o' has 1 classes"):
        check_labels({"o": ["a", "b"]}, outputs, fixed, "labels")
    # A dynamic sequence length: the output's shape was seen at one length, and may be longer.
    check_labels(
        {"o": ["a", "b"]}, outputs, [TensorConfig(name="x", dtype="float32", shape=[-1, -1])], "labels"
    )


def test_the_cost_follows_the_rows_classified() -> None:
    array = np.zeros((8, 10), np.float32)
    assert classify_cost([("o", array, True)], {"o": 10}, batched=True) == 80 + 64 * 80
    assert classify_cost([("o", array, True)], {"o": 10}, batched=False) == 80 + 64 * 10
    assert classify_cost([("o", array, True)], {}, batched=True) == 0
