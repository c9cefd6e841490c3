"""Verification compares what a candidate answers with what the reference answers on the same
inputs: integers exactly, float16 as float16 allows, and each runner on inputs of its own."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from compiler.spec import InputSpec
from compiler.verify import verify

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
