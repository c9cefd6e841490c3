"""Verification compares what a candidate answers with what the reference answers on the same
inputs: integers exactly, float16 as float16 allows, and each runner on inputs of its own."""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping

import numpy as np
import pytest
import torch

from compiler.benchmark import benchmark_batches
from compiler.errors import VerificationError
from compiler.pipeline import CompileOptions, compile_and_check
from compiler.spec import InputSpec
from compiler.verify import verification_batches, verify

HOST = "cpu-x86_64-test-avx2"

SPEC = InputSpec.from_dicts([{"name": "x", "dtype": "float32", "shape": [-1, 4]}], 2)
Arrays = Mapping[str, np.ndarray]


class Stub:
    def __init__(self, run: Callable[[Arrays], dict[str, np.ndarray]]) -> None:
        self.spec = SPEC
        self.run = run


def test_a_reference_that_writes_to_its_inputs_leaves_the_candidates_alone() -> None:
    def writes(inputs: Arrays) -> dict[str, np.ndarray]:
        x = inputs["x"]
        x += 1.0  # as `x.add_(1)` in a TorchScript model does to the array it was given
        return {"y": x.copy()}

    report = verify(Stub(lambda i: {"y": i["x"] + 1.0}), Stub(writes), SPEC, 1e-4, 1e-5)
    assert report.passed, report.reason


def test_integer_outputs_must_be_equal() -> None:
    def ids(offset: int) -> Callable[[Arrays], dict[str, np.ndarray]]:
        return lambda i: {"ids": np.array([31_999 + offset, 2**60 + offset], np.int64)}

    report = verify(Stub(ids(1)), Stub(ids(0)), SPEC, 1e-4, 1e-5)
    assert not report.passed
    assert report.reason == "ids: 2 of 2 integer values differ (by up to 1)"


def test_float16_outputs_are_checked_as_float16_allows() -> None:
    def half(scale: float) -> Callable[[Arrays], dict[str, np.ndarray]]:
        return lambda i: {"y": (i["x"] * scale).astype(np.float16)}

    close = verify(Stub(half(1.0005)), Stub(half(1.0)), SPEC, 1e-4, 1e-5)
    assert close.passed, close.reason
    far = verify(Stub(half(1.05)), Stub(half(1.0)), SPEC, 1e-4, 1e-5)
    assert not far.passed and far.reason is not None and "+ rtol=0.01" in far.reason


def test_small_float16_outputs_are_not_waved_through() -> None:
    """A softmax over thousands of classes: every probability is far below 1e-2, and a build
    that answers all zeros is wrong."""

    def softmax(i: Arrays) -> dict[str, np.ndarray]:
        logits = np.tile(i["x"][:, :1], (1, 8000)) + np.linspace(0.0, 3.0, 8000, dtype=np.float32)
        exp = np.exp(logits - logits.max(axis=1, keepdims=True))
        return {"p": (exp / exp.sum(axis=1, keepdims=True)).astype(np.float16)}

    report = verify(Stub(lambda i: {"p": np.zeros_like(softmax(i)["p"])}), Stub(softmax), SPEC, 1e-4, 1e-5)
    assert not report.passed, report


class WideningSum(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(x, 1)  # torch sums uint8 in int64


def test_a_variant_that_narrows_an_output_is_rejected() -> None:
    """TVM sums uint8 in uint8: equal on the small numbers verification draws, and wrapped past
    255 (100 + 200 gave 44) where the upload answers 300. (OpenVINO, which did too, now refuses
    the int64 sum at conversion: compiler.backends.openvino_numerics.)"""
    spec = InputSpec.from_dicts([{"name": "x", "dtype": "uint8", "shape": [-1, 8]}], 4)
    buffer = io.BytesIO()
    torch.jit.save(torch.jit.script(WideningSum()), buffer)
    with pytest.raises(VerificationError, match="output0: expected int64, got uint8"):
        compile_and_check(buffer.getvalue(), spec, "tvm", HOST, CompileOptions(threads=1))


class EvenRows(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 2:  # the rows the export traces
            return x.flip(0) + y
        return x + y


def test_a_spec_with_a_whole_input_is_verified_and_timed_at_the_rows_it_serves() -> None:
    """y has no batch dimension, so calls never merge; but each may hold up to max_batch_size
    rows of x. Verified and timed at 1 row only, ONNX Runtime's export (traced at 2 rows) served
    3 to 6 rows reversed, and a variant faster at 1 row served 64 rows slower than TorchScript."""
    spec = InputSpec.from_dicts(
        [
            {"name": "x", "dtype": "float32", "shape": [-1, 4]},
            {"name": "y", "dtype": "float32", "shape": [4]},
        ],
        6,
    )
    assert (verification_batches(spec), benchmark_batches(spec), spec.largest_batch) == ([1, 3, 6], [1, 6], 6)
    buffer = io.BytesIO()
    torch.jit.save(torch.jit.script(EvenRows()), buffer)
    with pytest.raises(VerificationError, match="output0: max abs error"):
        compile_and_check(buffer.getvalue(), spec, "onnxruntime", HOST, CompileOptions(threads=1))


@pytest.mark.parametrize(
    ("largest", "batches"), [(1, [1]), (2, [1, 2]), (3, [1, 2, 3]), (4, [1, 3, 4]), (8, [1, 3, 8])]
)
def test_a_batch_between_1_and_the_largest_is_verified(largest: int, batches: list[int]) -> None:
    """A tuned build compiled at 1 and 3 pads a batch of 2 to 3: a model that mixes its rows
    (y - y.mean(0)) then answered wrong at 2 alone, and was verified at 1 and 3 only."""
    spec = InputSpec.from_dicts([{"name": "x", "dtype": "float32", "shape": [-1, 4]}], largest)
    assert verification_batches(spec) == batches

    def centred(inputs: Arrays) -> dict[str, np.ndarray]:
        return {"y": inputs["x"] - inputs["x"].mean(axis=0, keepdims=True)}

    def padded_to_largest(inputs: Arrays) -> dict[str, np.ndarray]:  # built at 1 and the largest
        x = inputs["x"]
        if len(x) == 1:
            return centred(inputs)
        rows = np.zeros((largest, *x.shape[1:]), x.dtype)
        rows[: len(x)] = x
        return {"y": centred({"x": rows})["y"][: len(x)]}

    report = verify(Stub(padded_to_largest), Stub(centred), spec, 1e-4, 1e-5)
    assert report.passed == (largest <= 2), report


FREE = InputSpec.from_dicts(
    [
        {"name": "x", "dtype": "float32", "shape": [-1, -1]},
        {"name": "mask", "dtype": "bool", "shape": [-1, -1]},
    ],
    4,
)


def masked_mean(inputs: Arrays) -> dict[str, np.ndarray]:
    """A mean over the unmasked positions, 0 for a row masked whole, as torch's attention does."""
    keep = ~inputs["mask"]
    total = np.where(keep, inputs["x"], 0.0).sum(axis=1)
    return {"y": (total / np.maximum(keep.sum(axis=1), 1)).astype(np.float32)}


def test_odd_sizes_and_whole_masks_are_verified_where_the_reference_takes_them() -> None:
    """Every random case is of round sizes, and a random mask almost never covers a whole row:
    an Inductor build was wrong at odd sizes, ONNX Runtime answered NaN for a row masked whole."""
    assert verify(Stub(masked_mean), Stub(masked_mean), FREE, 1e-4, 1e-5).passed

    def wrong_when_odd(inputs: Arrays) -> dict[str, np.ndarray]:
        y = masked_mean(inputs)["y"]
        return {"y": y + 1.0 if inputs["x"].shape[1] % 2 else y}

    odd = verify(Stub(wrong_when_odd), Stub(masked_mean), FREE, 1e-4, 1e-5)
    assert not odd.passed and odd.reason is not None and "max abs error 1" in odd.reason

    def nan_when_masked_whole(inputs: Arrays) -> dict[str, np.ndarray]:
        y = masked_mean(inputs)["y"]
        return {"y": np.where(inputs["mask"].all(axis=1), np.float32(np.nan), y)}

    masked = verify(Stub(nan_when_masked_whole), Stub(masked_mean), FREE, 1e-4, 1e-5)
    assert masked.reason == "y: non-finite values where the reference has none"

    def even_only(inputs: Arrays) -> dict[str, np.ndarray]:
        if inputs["x"].shape[1] % 2:
            raise RuntimeError("shape '[3, -1, 2]' is invalid for input of size 27")
        return masked_mean(inputs)

    # A model that refuses odd sizes is never served them: its variants are not asked to.
    assert verify(Stub(wrong_when_odd), Stub(even_only), FREE, 1e-4, 1e-5).passed
