"""Input specs: parsing, checking and JSON coercion."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.errors import InputMismatchError, InvalidSpecError
from compiler.spec import InputSpec, TensorSpec, to_array


def test_parse_cli_form() -> None:
    spec = TensorSpec.parse("x:float32[-1,3,32,32]")
    assert spec == TensorSpec("x", "float32", (-1, 3, 32, 32))
    assert str(spec) == "x:float32[-1,3,32,32]"
    assert spec.batched and spec.concrete_shape(5) == (5, 3, 32, 32)


@pytest.mark.parametrize(
    "text", ["x", "x:float32", "x:float32[a]", "x:complex64[1]", "x:float32[0,2]", "x:f[]"]
)
def test_parse_rejects(text: str) -> None:
    with pytest.raises(InvalidSpecError):
        TensorSpec.parse(text)


def test_duplicate_names_rejected() -> None:
    with pytest.raises(InvalidSpecError, match="unique"):
        InputSpec.parse(["x:float32[-1,2]", "x:float32[-1,2]"])


def test_check_reports_name_and_shapes() -> None:
    spec = InputSpec.parse(["x:float32[-1,4]"], max_batch_size=4)
    assert spec.check({"x": np.zeros((3, 4), np.float32)}) == 3
    with pytest.raises(InputMismatchError, match=r"'x'.*\[-1, 4\].*\[3, 5\]"):
        spec.check({"x": np.zeros((3, 5), np.float32)})
    with pytest.raises(InputMismatchError, match=r"max_batch_size 4"):
        spec.check({"x": np.zeros((5, 4), np.float32)})
    with pytest.raises(InputMismatchError, match="missing"):
        spec.check({})


def test_coerce_never_changes_values_silently() -> None:
    spec = InputSpec.parse(["x:float32[-1,2]", "i:int64[-1,2]"], max_batch_size=2)
    arrays = spec.coerce({"x": [[1, 2]], "i": [[3, 4]]})
    assert arrays["x"].dtype == np.float32 and arrays["i"].dtype == np.int64
    with pytest.raises(InputMismatchError, match=r"'i'.*int64"):
        spec.coerce({"x": [[1, 2]], "i": [[3.5, 4]]})
    with pytest.raises(InputMismatchError, match="ragged"):
        spec.coerce({"x": [[1, 2], [3]], "i": [[3, 4]]})
    small = InputSpec.parse(["k:int32[-1,1]", "u:uint8[-1,1]"], max_batch_size=2)
    for k, u in (([[2**40]], [[1]]), ([[1]], [[-1]]), ([[1]], [[256]])):  # would wrap around
        with pytest.raises(InputMismatchError, match="out of the range"):
            small.coerce({"k": k, "u": u})
    assert small.coerce({"k": [[-(2**31)]], "u": [[255]]})["u"].tolist() == [[255]]


def test_random_inputs_follow_the_spec() -> None:
    spec = InputSpec.parse(["x:float32[-1,2]", "i:int64[-1,3]"], max_batch_size=8)
    arrays = spec.random_inputs(5, np.random.default_rng(0))
    assert spec.check(arrays) == 5


def test_no_values_for_an_integer_input_are_an_empty_array() -> None:
    """numpy makes floats of `[]`: no values, which v2 takes too, are not refused as fractions."""
    assert to_array([], "int64", "k").dtype == np.int64
    assert to_array([[]], "int64", "k").shape == (1, 0)
    with pytest.raises(InputMismatchError, match=r"received numbers written with a decimal point"):
        to_array([0.5], "int64", "k")
    # 1.0 has no fraction: the message says what is wrong with it, its writing.
    with pytest.raises(InputMismatchError, match=r"\(1\.0, 1e3\)"):
        to_array([1.0, 2, 3], "int64", "k")


def test_true_and_false_are_only_for_bool_inputs() -> None:
    """As in v2: true/false for a number, alone or among numbers, is refused, not taken as 1/0."""
    with pytest.raises(InputMismatchError, match="expected dtype float32, received true/false"):
        to_array([True, False], "float32", "x")
    with pytest.raises(InputMismatchError, match="received true/false among numbers"):
        to_array([[True, 2]], "int64", "x")
    with pytest.raises(InputMismatchError, match="expected dtype bool, received integers"):
        to_array([1, 0], "bool", "x")
    assert to_array([True, False], "bool", "x").tolist() == [True, False]
