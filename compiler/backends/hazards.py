"""Torch ops that some backends compile into code that goes wrong only on inputs verification never
draws; those backends refuse them by name, and another variant or TorchScript serves the model.

Both checks read an ExportedProgram's graph, where TorchScript's in-place ops keep their names
(`index_put_` for `y[i] = v`).
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch import fx

from compiler.errors import ConversionError

# Ops that write where an index tensor, or a mask, points. TVM's and OpenVINO's compiled code
# writes there unchecked, where torch raises for one out of range: an index of 10**12 wrote
# outside the output and killed the server; one just past the end wrote into the next row.
INDEXED_WRITES = frozenset(
    {
        "scatter",
        "scatter_add",
        "scatter_reduce",
        "index_put",
        "_index_put_impl",
        "_unsafe_index_put",
        "_unsafe_masked_index_put_accumulate",
        "index_add",
        "index_copy",
        "index_fill",
        "index_reduce",
        "masked_scatter",
        "put",
        "max_unpool2d",
        "max_unpool3d",
        "bincount",
    }
)

# Torch's integer divisions and remainders (`div` is one only with a rounding mode, when its
# result is an integer), named as compiler.backends.tvm_convert names TVM's.
INTEGER_DIVISIONS = {
    "div": "division",
    "floor_divide": "floor division",
    "remainder": "remainder",
    "fmod": "fmod",
}


def op_name(node: fx.Node) -> str | None:
    """A call's ATen op without its namespace and overload, and without the trailing `_` of an
    in-place op (`index_put_` -> `index_put`); `getitem` for an item of a call's tuple."""
    target = node.target
    if node.op != "call_function":
        return None
    if target is operator.getitem:
        return "getitem"
    schema = getattr(target, "_schema", None)
    if schema is None:
        return None
    name = str(schema.name).split("::")[-1]
    return name[:-1] if name.endswith("_") and not name.endswith("__") else name


def refuse_indexed_writes(backend: str, graph: fx.Graph) -> None:
    """Refuse the first op that writes by index (INDEXED_WRITES), for a backend that writes there
    unchecked."""
    for node in graph.nodes:
        if op_name(node) in INDEXED_WRITES:
            raise ConversionError(
                f"{backend}: {written_name(node)} writes where an index tensor points, unchecked: an index "
                "out of range, which torch refuses, writes out of bounds (a wrong answer, or a crash of "
                "the server); ONNX Runtime or Inductor can serve it"
            )


def integer_division(node: fx.Node) -> str | None:
    """The kind of integer division or remainder `node` is ("floor division"), else None."""
    kind = INTEGER_DIVISIONS.get(op_name(node) or "")
    value = node.meta.get("val")
    if kind is None or not isinstance(value, torch.Tensor) or value.dtype.is_floating_point:
        return None
    mode = node.kwargs.get("rounding_mode", node.args[2] if len(node.args) > 2 else None)
    return "floor division" if mode == "floor" else kind


def refuse_trapping_divisions(backend: str, graph: fx.Graph) -> None:
    """Refuse an integer division or remainder by anything but a number other than 0 and -1, or a
    size: compiled with the CPU's divide instruction, it traps (SIGFPE) on a zero divisor and on
    the minimum integer by -1, killing the server, where torch raises."""
    for node in graph.nodes:
        kind = integer_division(node)
        if kind is not None and not _safe_divisor(node.args[1]):
            dtype = str(node.meta["val"].dtype).removeprefix("torch.")
            raise ConversionError(
                f"{backend}: integer {kind} ({dtype}) by a divisor that may be 0 or -1, such as a tensor: "
                "its compiled code traps on a zero divisor (and on the minimum integer by -1), which "
                "would kill the server; ONNX Runtime can serve it"
            )


def _safe_divisor(divisor: Any) -> bool:
    """A number other than 0 and -1, or a size that export proved at least 1."""
    if isinstance(divisor, bool):
        return False
    if isinstance(divisor, int | float):
        return divisor not in (0, -1)
    value = divisor.meta.get("val") if isinstance(divisor, fx.Node) else None
    if not isinstance(value, torch.SymInt):
        return False
    bounds = value.node.shape_env.bound_sympy(value.node.expr)
    return bool(bounds.lower >= 1)


def written_name(node: fx.Node) -> str:
    """The op's name as the model calls it (`index_put_`), or the node's."""
    schema = getattr(node.target, "_schema", None)
    return str(schema.name).split("::")[-1] if schema is not None else node.name
