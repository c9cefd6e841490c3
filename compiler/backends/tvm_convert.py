"""ExportedProgram -> Relax IRModule, with fixes for TVM 0.27's PyTorch importer.

Each entry of `CUSTOM_CONVERT_MAP` replaces or adds one converter; TVM calls it as
`converter(node, importer)` (see ExportedProgramImporter._translate_fx_graph).

- select.int: the stock converter passes a negative index straight to `take`, which reads out of
  bounds, so `out[:, -1]` silently returns garbage.
- div.Scalar_mode (`torch.div(x, 2, rounding_mode="floor")`): no stock converter; div.Tensor_mode
  by a number (`a // 3`): the stock converter's constant is int32 or float32 whatever the tensor's
  dtype, which failed the build of an int64 `a // 3`.
- scalar_tensor and the *.Scalar binary ops: with a symbolic size as the value (`x / x.size(0)`),
  the stock converters crash or mix int64 with the tensor's dtype.

- gather and index.Tensor: TVM's gather_elements and index_tensor, as every `take`
  (`_takes_within_bounds`), read out of bounds for an index out of range: indices are first
  taken into their dim.

TVM's scatter_elements and index_put write unchecked, as its gathers read: ops that write by
index are refused before import (compiler.backends.hazards).

Inference BatchNorm is then folded into the convolution before it, as every inference compiler
does: each conv kernel would otherwise carry a subtract/divide/multiply/add epilogue. Last, an
integer division or remainder whose divisor may be 0 (or -1) is refused
(`_no_trapping_divisions`): its compiled code traps there and kills the process.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any, cast

import torch
import tvm
from torch import fx
from tvm import relax, tirx
from tvm.relax.dpl import is_op, rewrite_call, wildcard
from tvm.relax.frontend.torch.exported_program_translator import ExportedProgramImporter

from compiler.backends.hazards import refuse_indexed_writes
from compiler.errors import ConversionError

Converter = Callable[[fx.Node, Any], relax.Expr]


def import_program(program: Any) -> tvm.IRModule:
    """Refuse a write by index (compiler.backends.hazards), decompose to core ATen, check every op
    has a converter, import with the fixes, fold BatchNorm into the convolutions (constant weights
    only; folding takes ~2 s on ResNet-18), and refuse an integer division that can trap."""
    refuse_indexed_writes("tvm", program.graph)
    program = program.run_decompositions()
    refuse_indexed_writes("tvm", program.graph)  # as it decomposes to, and TVM converts
    known = _known_ops()
    used = {node.target.__name__ for node in program.graph.nodes if node.op == "call_function"}
    missing = sorted(used - known)
    if missing:
        raise ConversionError(f"tvm: no converter for torch op {', '.join(missing)}")
    importer = ExportedProgramImporter()
    # TVM calls a custom converter as (node, importer) in the graph, and as (node) alone in the
    # branches of torch.cond (a data-dependent `if`), which failed every such model's build.
    bound = {op: _bound(convert, importer) for op, convert in CUSTOM_CONVERT_MAP.items()}
    mod = importer.from_exported_program(
        program,
        keep_params_as_input=False,
        unwrap_unit_return_tuple=False,
        no_bind_return_tuple=False,
        custom_convert_map=bound,
    )
    mod = relax.transform.FoldConstant()(relax.transform.FoldBatchnormToConv2D()(_takes_within_bounds(mod)))
    _no_trapping_divisions(mod)
    return mod


def _bound(convert: Converter, importer: Any) -> Callable[..., relax.Expr]:
    return lambda node, *_: convert(node, importer)


TAKE = is_op("relax.take")(wildcard(), wildcard())


def _takes_within_bounds(mod: tvm.IRModule) -> tvm.IRModule:
    """Every `take` in TVM's default mode, "fast", which reads past its table for an index out
    of range (an embedding's ids, `table[i]`), in mode "wrap": torch's meaning for -n..-1, where
    "fast" returned garbage, and no read out of bounds for any other (10**12 crashed the server;
    torch raises, and the variant answers a row of the table)."""

    def within_bounds(call: relax.Call, _: object) -> relax.Expr:
        if call.attrs.mode != "fast":
            return call
        return relax.op.take(call.args[0], call.args[1], call.attrs.axis, mode="wrap")

    for gv, func in list(mod.functions.items()):
        if isinstance(func, relax.Function):
            mod[gv] = rewrite_call(TAKE, within_bounds, func)
    return mod


# Relax's integer divisions and remainders, as torch names them.
DIVISIONS = {
    "relax.divide": "division",
    "relax.floor_divide": "floor division",
    "relax.floor_mod": "remainder",
    "relax.mod": "fmod",
}


def _no_trapping_divisions(mod: tvm.IRModule) -> None:
    """Refuse an integer division or remainder by anything but a constant without 0 and -1, or
    a size. Its compiled code divides with the CPU's instruction, which traps (SIGFPE on x86) on
    a zero divisor and on the minimum integer by -1, killing the server, where torch and ONNX
    Runtime raise an exception that Kiln answers from TorchScript."""
    for func in mod.functions.values():
        if not isinstance(func, relax.Function):
            continue
        values, sizes = relax.analysis.get_var2val(func), _sizes_analyzer(func)
        for call in _division_calls(func):
            divisor = call.args[1]
            ty = divisor.ty
            dtype = ty.dtype.dtype if isinstance(ty, relax.TensorType) else ty.dtype
            if dtype.is_integer and not _safe_divisor(divisor, values, sizes):
                kind = DIVISIONS[str(call.op.name)]
                raise ConversionError(
                    f"tvm: integer {kind} ({dtype}) by a divisor that may be 0 or -1, such as a tensor: "
                    "TVM's compiled code traps on a zero divisor (and on the minimum integer by -1), "
                    "which would kill the server; ONNX Runtime can serve it"
                )


def _division_calls(func: relax.Function) -> list[relax.Call]:
    calls: list[relax.Call] = []

    def visit(expr: relax.Expr) -> None:
        if isinstance(expr, relax.Call) and _op_name(expr) in DIVISIONS:
            calls.append(expr)

    relax.analysis.post_order_visit(func, visit)
    return calls


def _op_name(call: relax.Call) -> str | None:
    return str(call.op.name) if isinstance(call.op, tvm.ir.Op) else None


def _sizes_analyzer(func: relax.Function) -> tvm.sym.Analyzer:
    """An analyzer that knows the lower bounds export gave the function's sizes."""
    analyzer = tvm.sym.Analyzer()
    lower = func.attrs.get("tir_var_lower_bound", {}) if func.attrs else {}
    for var in relax.analysis.defined_symbolic_vars(func):
        if str(var.name) in lower:
            bound = tvm.sym.ConstIntBound(int(lower[str(var.name)]), tvm.sym.ConstIntBound.POS_INF)
            analyzer.update(var, bound)
    return analyzer


def _safe_divisor(divisor: relax.Expr, values: Any, sizes: tvm.sym.Analyzer) -> bool:
    """A constant without 0 and -1, or a size proved at least 1: a scalar (`x % x.size(0)`), or
    the tensor `_prim_value_to_scalar_tensor` makes of one (`_within` a symbolic dim), of at
    least 32 bits, which hold any size."""
    if isinstance(divisor, tvm.ir.GenericConst):
        held = divisor.value.numpy()
        return bool((held != 0).all() and not (held.dtype.kind == "i" and (held == -1).any()))
    if isinstance(divisor.ty, tvm.ir.PrimType):
        return bool(sizes.can_prove(divisor >= 1))
    if divisor.ty.dtype.dtype.bits < 32:
        return False
    value = values.get(divisor) if isinstance(divisor, relax.Var) else None
    while isinstance(value, relax.Call) and _op_name(value) in ("relax.squeeze", "relax.astype"):
        value = values.get(value.args[0]) if isinstance(value.args[0], relax.Var) else None
    if not (isinstance(value, relax.Call) and _op_name(value) == "relax.shape_to_tensor"):
        return False
    shape = value.args[0]
    return isinstance(shape, relax.ShapeExpr) and all(sizes.can_prove(dim >= 1) for dim in shape.values)


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


def _div_mode(node: fx.Node, importer: Any) -> relax.Expr:
    x = importer.env[node.args[0]]
    divisor = importer._retrieve_args(node.args[1])
    if not isinstance(getattr(divisor, "ty", None), relax.TensorType):
        x, divisor = _of_result_dtype(node, importer, x, divisor)
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
        lhs, rhs = _of_result_dtype(node, importer, lhs, rhs)
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


def _gather(node: fx.Node, importer: Any) -> relax.Expr:
    """torch.gather: TVM's gather_elements reads out of bounds (garbage for -1, a crash past
    the end), so the indices are first taken into the dim, as `_takes_within_bounds` does."""
    x, dim, index = importer.retrieve_args(node)[:3]
    return importer.block_builder.emit(
        relax.op.gather_elements(x, _within(importer, index, x, dim), axis=dim)
    )


def _index_tensor(node: fx.Node, importer: Any) -> relax.Expr:
    """`x[i, j]` by integer tensors: TVM's index_tensor reads out of bounds as gather_elements
    does. TVM's own converter, given each index taken into its dim."""
    x, index_nodes = importer.env[node.args[0]], cast(list[fx.Node | None], node.args[1])
    axes: dict[fx.Node, list[int]] = {}
    for axis, index_node in enumerate(index_nodes):
        if isinstance(index_node, fx.Node):
            axes.setdefault(index_node, []).append(axis)
    saved = {}
    for index_node, its_axes in axes.items():
        # One tensor for several dims (`t[i, i]`) is taken into them all where they are one size.
        if len({str(x.ty.shape[axis]) for axis in its_axes}) > 1:
            raise ConversionError("tvm: one tensor indexes dims of different sizes (`x[i, i]`)")
        saved[index_node] = importer.env[index_node]
        importer.env[index_node] = _within(importer, saved[index_node], x, its_axes[0])
    try:
        return importer._index_tensor(node)
    finally:
        importer.env.update(saved)


def _within(importer: Any, index: relax.Expr, x: relax.Expr, axis: int) -> relax.Expr:
    """Integer indices into `x`'s dim `axis`, taken into it: torch's meaning for -n..-1, and
    some row for any index torch would refuse (which the variant answers, not raises on)."""
    dtype = str(index.ty.dtype)
    if dtype == "bool":  # a mask: export made its nonzero() indices already
        return index
    size = x.ty.shape[axis]
    n = (
        relax.const(int(size), dtype)
        if isinstance(size, tirx.IntImm)
        else importer._prim_value_to_scalar_tensor(size, dtype)
    )
    return importer.block_builder.emit(relax.op.floor_mod(index, n))


def _is_symbolic(value: object) -> bool:
    """A scalar expression over symbolic sizes (sym_size.int converts to one)."""
    is_scalar = isinstance(getattr(value, "ty", None), tvm.ir.PrimType)
    return is_scalar and not isinstance(value, tirx.IntImm | tirx.FloatImm)


def _of_result_dtype(
    node: fx.Node, importer: Any, x: relax.Expr, scalar: Any
) -> tuple[relax.Expr, relax.Expr]:
    """`x`, and a number or a size made a tensor, both of the result's dtype: torch's `a // 2.5`
    and `a / a.size(1)` of int64 `a` are float32 (in `a`'s dtype, the first dropped the .5 and
    the second divided integers)."""
    dtype = str(importer._convert_data_type(node.meta["val"].dtype))
    if dtype != str(x.ty.dtype):
        x = importer.block_builder.emit(relax.op.astype(x, dtype))
    return x, _scalar_operand(importer, scalar, dtype)


def _scalar_operand(importer: Any, value: Any, dtype: str) -> relax.Expr:
    """A rank-0 tensor of `dtype` holding a Python number or a symbolic int."""
    if _is_symbolic(value):
        return importer._prim_value_to_scalar_tensor(value, dtype)
    return relax.const(value, dtype)


CUSTOM_CONVERT_MAP: dict[str, Converter] = {
    "gather.default": _gather,
    "index.Tensor": _index_tensor,
    "select.int": _select_int,
    "slice.Tensor": _slice,
    "div.Scalar_mode": _div_mode,
    "div.Tensor_mode": _div_mode,
    "scalar_tensor.default": _scalar_tensor,
    "add.Scalar": _binary_scalar(relax.op.add, operator.add),
    "sub.Scalar": _binary_scalar(relax.op.subtract, operator.sub),
    "mul.Scalar": _binary_scalar(relax.op.multiply, operator.mul),
    "div.Scalar": _binary_scalar(relax.op.divide, operator.truediv),
}
