"""Torch ops that some backends compile into code that goes wrong only on inputs verification never
draws; those backends refuse them by name, and another variant or TorchScript serves the model.

Both checks read an ExportedProgram's graph, where TorchScript's in-place ops keep their names
(`index_put_` for `y[i] = v`).
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import Any

import torch
from torch import fx
from torch.export.graph_signature import InputKind

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

# Index writes whose only index is a bool mask of the target's shape (`y[y < 0] = 0`): in range.
MASKABLE_WRITES = frozenset({"index_put", "_index_put_impl", "_unsafe_index_put"})
# Integer arithmetic that, on sizes and constants, is shape arithmetic (a traced `C // heads`).
SHAPE_ARITHMETIC = frozenset({"add", "sub", "rsub", "mul", "neg", "div", "floor_divide", "remainder", "fmod",
                              "to", "_to_copy"})  # fmt: skip

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
        if op_name(node) in INDEXED_WRITES and not _in_range_write(node):
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


def _in_range_write(node: fx.Node) -> bool:
    """An index write whose one index is a bool mask of the target's shape, or that torch's col2im
    (F.fold) decomposed into with indices of its own arange: it writes in range."""
    if str(node.meta.get("original_aten")) == "aten.col2im.default":  # not the registry's object
        return True
    if op_name(node) not in MASKABLE_WRITES or len(node.args) < 2 or not isinstance(node.args[0], fx.Node):
        return False
    indices, target = node.args[1], node.args[0].meta.get("val")
    if not isinstance(indices, list | tuple) or len(indices) != 1 or not isinstance(indices[0], fx.Node):
        return False
    mask = indices[0].meta.get("val")
    return (
        isinstance(mask, torch.Tensor)
        and isinstance(target, torch.Tensor)
        and mask.dtype == torch.bool
        and mask.shape == target.shape
    )


def lifted_constants(program: Any) -> dict[str, torch.Tensor]:
    """The values of a program's placeholders that are not inputs (parameters, buffers, lifted
    constants), by placeholder name: the graph alone holds none of them. A buffer the program
    writes is left out: the next run reads another value."""
    held = {**program.state_dict, **program.constants}
    written = set(program.graph_signature.buffers_to_mutate.values())
    return {
        spec.arg.name: held[spec.target]
        for spec in program.graph_signature.input_specs
        if spec.kind != InputKind.USER_INPUT and spec.target in held and spec.target not in written
    }


def shape_scalar(node: Any, constants: Mapping[str, torch.Tensor]) -> bool:
    """Whether `node` is a 0-dim integer tensor computed only from sizes, numbers and `constants`
    (a traced `C // heads` is a floor_divide of a scalar_tensor by a lifted constant), by no
    division whose divisor may be 0 or -1: exact arithmetic on no input's data."""
    value = node.meta.get("val") if isinstance(node, fx.Node) else None
    if not isinstance(value, torch.Tensor) or value.dim() != 0 or value.dtype.is_floating_point:
        return False
    if value.dtype in (torch.bool, torch.complex64, torch.complex128):
        return False
    if node.op == "placeholder":
        return node.name in constants
    name = op_name(node)
    if name == "scalar_tensor":
        return _size_or_number(node.args[0])
    if name not in SHAPE_ARITHMETIC or any(key != "rounding_mode" and key != "dtype" for key in node.kwargs):
        return False
    if integer_division(node) is not None and not safe_divisor(node.args[1], constants):
        return False
    return all(
        shape_scalar(arg, constants) if isinstance(arg, fx.Node) else _size_or_number(arg)
        for arg in node.args[:2]
    )


def _size_or_number(arg: Any) -> bool:
    if isinstance(arg, fx.Node):
        return isinstance(arg.meta.get("val"), torch.SymInt)
    return isinstance(arg, int | float) and not isinstance(arg, bool)


def refuse_trapping_divisions(
    backend: str, graph: fx.Graph, constants: Mapping[str, torch.Tensor] | None = None
) -> None:
    """Refuse an integer division or remainder by anything but a number other than 0 and -1, a
    size, or a constant (`constants`, from lifted_constants) that holds neither: compiled with the
    CPU's divide instruction, it traps (SIGFPE) on a zero divisor and on the minimum integer by -1,
    killing the server, where torch raises."""
    for node in graph.nodes:
        kind = integer_division(node)
        if kind is not None and not safe_divisor(node.args[1], constants or {}):
            dtype = str(node.meta["val"].dtype).removeprefix("torch.")
            raise ConversionError(
                f"{backend}: integer {kind} ({dtype}) by a divisor that may be 0 or -1, such as a tensor: "
                "its compiled code traps on a zero divisor (and on the minimum integer by -1), which "
                "would kill the server; ONNX Runtime can serve it"
            )


def safe_divisor(divisor: Any, constants: Mapping[str, torch.Tensor]) -> bool:
    """A number other than 0 and -1, a size that export proved at least 1, a constant that holds
    neither, or a scalar_tensor of one of these."""
    if isinstance(divisor, bool):
        return False
    if isinstance(divisor, int | float):
        return divisor not in (0, -1)
    if not isinstance(divisor, fx.Node):
        return False
    if divisor.op == "placeholder" and (held := constants.get(divisor.name)) is not None:
        return not bool(((held == 0) | (held == -1)).any())
    if op_name(divisor) == "scalar_tensor":
        return safe_divisor(divisor.args[0], constants)
    value = divisor.meta.get("val")
    if not isinstance(value, torch.SymInt):
        return False
    bounds = value.node.shape_env.bound_sympy(value.node.expr)
    return bool(bounds.lower >= 1)


def written_name(node: fx.Node) -> str:
    """The op's name as the model calls it (`index_put_`), or the node's."""
    schema = getattr(node.target, "_schema", None)
    return str(schema.name).split("::")[-1] if schema is not None else node.name
