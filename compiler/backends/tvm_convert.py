"""ExportedProgram -> Relax IRModule, with fixes for TVM 0.27's PyTorch importer.

Each entry of `CUSTOM_CONVERT_MAP` replaces or adds one converter; TVM calls it as
`converter(node, importer)` (see ExportedProgramImporter._translate_fx_graph).

- select.int: the stock converter passes a negative index straight to `take`, which reads out of
  bounds, so `out[:, -1]` silently returns garbage.
- div.Scalar_mode (`torch.div(x, 2, rounding_mode="floor")`): no stock converter.
- scalar_tensor and the *.Scalar binary ops: with a symbolic size as the value (`x / x.size(0)`),
  the stock converters crash or mix int64 with the tensor's dtype.

Inference BatchNorm is then folded into the convolution before it, as every inference compiler
does: each conv kernel would otherwise carry a subtract/divide/multiply/add epilogue.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
import tvm
from torch import fx
from tvm import relax, tirx
from tvm.relax.frontend.torch import from_exported_program
from tvm.relax.frontend.torch.exported_program_translator import ExportedProgramImporter

from compiler.errors import ConversionError

Converter = Callable[[fx.Node, Any], relax.Expr]


def import_program(program: Any) -> tvm.IRModule:
    """Decompose to core ATen, check every op has a converter, import with the fixes, and fold
    BatchNorm into the convolutions (constant weights only; folding takes ~2 s on ResNet-18)."""
    program = program.run_decompositions()
    known = _known_ops()
    used = {node.target.__name__ for node in program.graph.nodes if node.op == "call_function"}
    missing = sorted(used - known)
    if missing:
        raise ConversionError(f"tvm: no converter for torch op {', '.join(missing)}")
    mod = from_exported_program(program, custom_convert_map=CUSTOM_CONVERT_MAP, run_ep_decomposition=False)
    return relax.transform.FoldConstant()(relax.transform.FoldBatchnormToConv2D()(mod))


def channels_last_convs(mod: tvm.IRModule) -> tvm.IRModule:
    """Every 2-D convolution as NHWC data and OHWI weights; transposes at the edges, folded
    into constant weights. Both tuned CPU builds and CUDA builds want the channels innermost."""
    return relax.transform.ConvertLayout({"relax.nn.conv2d": ["NHWC", "OHWI"]})(mod)


def dense_channels_last_f32(call: relax.Call) -> bool:
    """Whether a relax.nn.conv2d call is ungrouped float32 in the layouts channels_last_convs gives
    (NHWC data and output, OHWI weights): the convolutions Kiln's own lowerings take over."""
    attrs = call.attrs
    data, weight = (arg.ty for arg in call.args)
    if (str(attrs.data_layout), str(attrs.kernel_layout), str(attrs.out_layout)) != ("NHWC", "OHWI", "NHWC"):
        return False
    return str(data.dtype) == "float32" and str(weight.dtype) == "float32" and int(attrs.groups) == 1


def _known_ops() -> set[str]:
    return {str(name) for name in ExportedProgramImporter().convert_map} | set(CUSTOM_CONVERT_MAP)


def _select_int(node: fx.Node, importer: Any) -> relax.Expr:
    x = importer.env[node.args[0]]
    dim, index = node.args[1], node.args[2]
    if not isinstance(dim, int) or not isinstance(index, int):
        return importer._select(node)
    shape = x.ty.shape
    dim %= len(shape)
    start = index if index >= 0 else shape[dim] + index
    sliced = relax.op.strided_slice(x, axes=[dim], begin=[start], end=[start + 1])
    return importer.block_builder.emit(relax.op.squeeze(sliced, axis=[dim]))


def _div_scalar_mode(node: fx.Node, importer: Any) -> relax.Expr:
    x = importer.env[node.args[0]]
    divisor = _scalar_operand(importer, importer._retrieve_args(node.args[1]), str(x.ty.dtype))
    mode = node.args[2] if len(node.args) > 2 else node.kwargs.get("rounding_mode")
    if mode == "floor":
        return importer.block_builder.emit(relax.op.floor_divide(x, divisor))
    quotient = importer.block_builder.emit(relax.op.divide(x, divisor))
    # Integer divide already truncates towards zero.
    if mode == "trunc" and x.ty.dtype.matches_code(tvm.DataTypeCode.FLOAT):
        return importer.block_builder.emit(relax.op.trunc(quotient))
    return quotient


def _scalar_tensor(node: fx.Node, importer: Any) -> relax.Expr:
    value = importer._retrieve_args(node.args[0])
    if not _is_symbolic(value):
        return importer._scalar_tensor(node)
    dtype = importer._convert_data_type(node.kwargs.get("dtype", torch.get_default_dtype()), importer.env)
    return _scalar_operand(importer, value, dtype)


def _binary_scalar(relax_op: Callable[..., relax.Expr], python_op: Callable[..., Any]) -> Converter:
    """`tensor <op> scalar` where the scalar may be a symbolic size."""

    def convert(node: fx.Node, importer: Any) -> relax.Expr:
        lhs, rhs = importer.retrieve_args(node)
        if not _is_symbolic(rhs):
            return importer._binary_op(relax_op, python_op)(node)
        rhs = _scalar_operand(importer, rhs, str(lhs.ty.dtype))
        return importer.block_builder.emit(relax_op(lhs, rhs))

    return convert


def _slice(node: fx.Node, importer: Any) -> relax.Expr:
    """A slice from 0 of a fixed dim to a symbolic size (a table of positions cut to the
    sequence's length): TVM's own gives a shape of unknown length, which no later op takes.
    Where export found the slice that long, it took the end inside the dim, and the variant
    serves only the sizes where that holds (compiler.dims): the slice ends there."""
    x, dim, start, end, step = (*importer.retrieve_args(node), None, None, None, None)[:5]
    source, end_node = node.args[0], node.args[3] if len(node.args) > 3 else None
    fixed = isinstance(source, fx.Node) and isinstance(source.meta["val"].shape[dim or 0], int)
    length = str(node.meta["val"].shape[dim or 0])
    proved = fixed and isinstance(end_node, fx.Node) and length == str(end_node.meta.get("val"))
    if not (proved and _is_symbolic(end) and start in (None, 0) and step in (None, 1)):
        return importer._slice(node)
    sliced = relax.op.strided_slice(x, [dim or 0], [0], [end], assume_inbound=True)
    return importer.block_builder.emit(sliced)


def _is_symbolic(value: object) -> bool:
    """A scalar expression over symbolic sizes (sym_size.int converts to one)."""
    is_scalar = isinstance(getattr(value, "ty", None), tvm.ir.PrimType)
    return is_scalar and not isinstance(value, tirx.IntImm | tirx.FloatImm)


def _scalar_operand(importer: Any, value: Any, dtype: str) -> relax.Expr:
    """A rank-0 tensor of `dtype` holding a Python number or a symbolic int."""
    if _is_symbolic(value):
        return importer._prim_value_to_scalar_tensor(value, dtype)
    return relax.const(value, dtype)


CUSTOM_CONVERT_MAP: dict[str, Converter] = {
    "select.int": _select_int,
    "slice.Tensor": _slice,
    "div.Scalar_mode": _div_scalar_mode,
    "scalar_tensor.default": _scalar_tensor,
    "add.Scalar": _binary_scalar(relax.op.add, operator.add),
    "sub.Scalar": _binary_scalar(relax.op.subtract, operator.sub),
    "mul.Scalar": _binary_scalar(relax.op.multiply, operator.mul),
    "div.Scalar": _binary_scalar(relax.op.divide, operator.truediv),
}
