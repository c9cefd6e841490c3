"""Integer and float64 arithmetic that OpenVINO's CPU plugin computes otherwise than torch, on values
verification's small random inputs never reach: the OpenVINO backend refuses such a program.

The plugin computes float64 in float32, int64 in int32, and int8/uint8/int16 saturating where
torch wraps; it divides integers in float32 (2**31 - 1 by 3 was off by 22) and answers a zero
divisor where torch raises, saturates integer powers, and shifts past the width otherwise. int32
addition, subtraction and multiplication wrap as torch's do.

int64 that the model's int64 inputs feed is left to the backend's probe of inputs past 2**31
(`_check_wide_ints`); other int64 is accepted only where it holds indices or sizes (argmax,
arange), counts of bools, narrower integers, or constants within int32, moved but not computed
on, but for arithmetic on sizes and such constants (a traced `C // heads`) and the difference of
two indices. Everything else is refused, at the cost of a faster variant for some models (`pred + 1` of
an argmax).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch
from torch import fx
from torch.export.graph_signature import InputKind

from compiler.backends.hazards import integer_division, lifted_constants, op_name, shape_scalar, written_name

# Ops whose int64 result is an index into a dim, or counts along one: int32 holds it.
INDEXES = frozenset({"argmax", "argmin", "arange", "nonzero", "searchsorted", "bucketize", "count_nonzero"})
# Sums that count where they sum bools (`(ids != 0).sum(1)`).
SUMS = frozenset({"sum", "cumsum"})
# Ops that give (values, indices); the indices are item 1.
WITH_INDICES = frozenset(
    {"max", "min", "sort", "topk", "kthvalue", "mode", "median", "nanmedian", "cummax", "cummin"}
)
# Ops whose result holds only values of their tensor arguments, and numbers they are given.
MOVES = WITH_INDICES | {
    "view", "reshape", "_unsafe_view", "unsqueeze", "squeeze", "expand", "expand_as", "slice",
    "select", "narrow", "permute", "transpose", "t", "flatten", "unflatten", "movedim", "clone",
    "contiguous", "alias", "detach", "lift_fresh_copy", "cat", "concat", "stack", "split",
    "split_with_sizes", "chunk", "unbind", "index", "index_select", "gather", "take", "flip",
    "roll", "repeat", "tile", "where", "masked_fill", "constant_pad_nd", "amax", "amin",
    "maximum", "minimum", "clamp", "clamp_min", "clamp_max", "relu", "tril", "triu",
}  # fmt: skip
# MOVES that take no values but their first argument's.
LAYOUT = frozenset({"view", "reshape", "_unsafe_view", "unsqueeze", "squeeze", "expand", "slice",
                    "select", "permute", "transpose", "t", "flatten", "clone", "contiguous", "alias",
                    "detach"})  # fmt: skip
FILLS = frozenset({"scalar_tensor", "full", "full_like", "zeros", "zeros_like", "ones", "ones_like",
                   "new_full", "new_zeros", "new_ones"})  # fmt: skip
# Where the values among the arguments of MOVES and FILLS start, and their names as keywords; the
# other arguments are sizes and dims (a slice's end defaults to 2**63 - 1).
VALUES_FROM = {"scalar_tensor": 0, "full": 1, "full_like": 1, "new_full": 2, "where": 1, "masked_fill": 2,
               "clamp": 1, "clamp_min": 1, "clamp_max": 1, "constant_pad_nd": 2}  # fmt: skip
VALUE_KEYWORDS = frozenset({"value", "fill_value", "min", "max", "other"})
CASTS = frozenset({"to", "_to_copy", "type_as"})
# int32 arithmetic the plugin wraps past int32's range as torch does.
WRAPPING = frozenset({"add", "sub", "rsub", "mul", "neg", "abs"})
POWERS_AND_SHIFTS = frozenset({"pow", "bitwise_left_shift", "bitwise_right_shift", "__lshift__", "__rshift__",
                               "__ilshift__", "__irshift__"})  # fmt: skip
INT32 = torch.iinfo(torch.int32)
# Integers the plugin's float32 division divides exactly: both at most 2**23, a quotient's distance
# from the next integer exceeds half its float32 spacing.
EXACT_IN_FLOAT32 = 2**23
SERVED = "ONNX Runtime or Inductor can serve it"


def numerics_reason(program: Any) -> str | None:
    """Why the plugin would answer `program` otherwise than torch on some input, or None."""
    inputs = {spec.arg.name: spec for spec in program.graph_signature.input_specs}
    probed: set[fx.Node] = set()  # int64 that int64 inputs feed
    # Shape arithmetic (a traced `C // heads`) on constants the plugin holds exactly.
    constants = {name: held for name, held in lifted_constants(program).items() if _within_int32(held)}
    for node in program.graph.nodes:
        value = node.meta.get("val")
        if not isinstance(value, torch.Tensor) or not node.users:
            continue
        dtype, label = value.dtype, _label(node, inputs)
        if dtype == torch.float64:
            return f"float64 {label}: the CPU plugin computes float64 in float32; {SERVED}"
        if dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
            continue
        if node.op == "placeholder":
            spec = inputs[node.name]
            if spec.kind == InputKind.USER_INPUT:
                probed.update([node] if dtype == torch.int64 else [])
            elif dtype == torch.int64 and not _within_int32(_held(program, spec.target)):
                return (
                    f"int64 {label} holds values past int32: the CPU plugin computes int64 in int32; {SERVED}"
                )
            continue
        name, args, item = _producer(node)
        if shape_scalar(node, constants) and (
            integer_division(node) is None
            or max(_magnitude(arg, constants) for arg in node.args[:2]) <= EXACT_IN_FLOAT32
        ):
            continue  # sizes and their arithmetic, as in int32; divided in float32 only where exact
        if (kind := integer_division(node)) is not None:
            return (
                f"integer {kind} ({_name(dtype)}): the CPU plugin divides integers in float32, wrong past "
                "2**24, and answers a zero divisor, where torch raises; ONNX Runtime can serve it"
            )
        if name in POWERS_AND_SHIFTS:
            return (
                f"integer {name} ({_name(dtype)}): the CPU plugin saturates a power past its dtype, and "
                f"shifts past the width otherwise than torch; {SERVED}"
            )
        if dtype == torch.int64 and any(arg in probed for arg in _nodes(args)):
            probed.add(node)
        elif not _exact(node, name, args, item, dtype):
            return f"{_name(dtype)} {label}: {_why(dtype)}; {SERVED}"
    return None


def _exact(node: fx.Node, name: str | None, args: Any, item: object, dtype: torch.dtype) -> bool:
    """Whether the plugin computes this integer result (not int64 that inputs feed) as torch does."""
    if (item == 1 and name in WITH_INDICES) or name in INDEXES:
        return dtype in (torch.int64, torch.int32)
    if name in SUMS:
        return _counts(args[0]) and dtype.itemsize >= 4
    if name == "sub" and dtype in (torch.int64, torch.int32):
        # Two indices' difference (T5's relative positions) is within int32.
        return all(isinstance(arg, fx.Node) and _index(arg) for arg in args[:2])
    if name in MOVES or name in FILLS:
        return dtype != torch.int64 or _values_within_int32(node, name)
    if name in CASTS:
        source = args[0].meta["val"].dtype
        if source == torch.bool or (dtype == torch.int32 and source.is_floating_point):
            return True  # a float past int32 converts as C's does: undefined, in torch too
        return not source.is_floating_point and (dtype.itemsize >= 4 or dtype == source)
    return name in WRAPPING and dtype == torch.int32


def _magnitude(arg: Any, constants: dict[str, torch.Tensor]) -> float:
    """A bound on the absolute value of a shape_scalar's node, or of a size or number it is given."""
    if not isinstance(arg, fx.Node):
        return abs(arg)
    value = arg.meta["val"]
    if isinstance(value, torch.SymInt):
        bounds = value.node.shape_env.bound_sympy(value.node.expr)
        return float(max(abs(bounds.lower), abs(bounds.upper)))
    if arg.op == "placeholder":
        return float(constants[arg.name].abs().max())
    operands = [
        _magnitude(operand, constants) for operand in arg.args[:2] if not isinstance(operand, torch.dtype)
    ]
    return math.prod(operands) if op_name(arg) == "mul" else sum(operands)


def _non_negative(arg: Any) -> bool:
    """An int, or a size, that is at least 0 (an arange's bound: its indices then fit int32)."""
    value = arg.meta.get("val") if isinstance(arg, fx.Node) else arg
    if isinstance(value, torch.SymInt):
        return bool(value.node.shape_env.bound_sympy(value.node.expr).lower >= 0)
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _counts(node: fx.Node) -> bool:
    """Whether `node` holds bools, or bools cast to an integer (`ids.ne(pad).int()`): a sum counts."""
    if node.meta["val"].dtype == torch.bool:
        return True
    name, args, _ = _producer(node)
    return name in CASTS and isinstance(args[0], fx.Node) and _counts(args[0])


def _index(node: fx.Node) -> bool:
    """Whether `node` holds only indices into a dim (an arange, moved without new values)."""
    name, args, item = _producer(node)
    if name == "arange":
        return all(_non_negative(arg) for arg in args)
    if (item == 1 and name in WITH_INDICES) or name in INDEXES:
        return True
    return name in LAYOUT and isinstance(args[0], fx.Node) and _index(args[0])


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _why(dtype: torch.dtype) -> str:
    if dtype == torch.int64:
        return "the CPU plugin computes int64 in int32, and only int64 inputs are tried past 2**31"
    if dtype.itemsize < 4:
        return "the CPU plugin saturates int8, uint8 and int16 arithmetic, where torch wraps"
    return "of the CPU plugin's int32 arithmetic only +, - and * are known to wrap as torch's does"


def _producer(node: fx.Node) -> tuple[str | None, Any, object]:
    """The op that computed `node`, its arguments, and which item of its result `node` is."""
    name = op_name(node)
    if name == "getitem" and isinstance(parent := node.args[0], fx.Node):
        return op_name(parent), parent.args, node.args[1]
    return name, node.args, None


def _label(node: fx.Node, inputs: dict[str, Any]) -> str:
    if node.op != "placeholder":
        parent = node.args[0] if op_name(node) == "getitem" else None
        return f"result of {written_name(parent if isinstance(parent, fx.Node) else node)}"
    spec = inputs[node.name]
    return "input" if spec.kind == InputKind.USER_INPUT else f"constant {spec.target}"


def _held(program: Any, target: str) -> torch.Tensor | None:
    held = program.state_dict.get(target)
    return held if held is not None else program.constants.get(target)


def _within_int32(held: torch.Tensor | None) -> bool:
    if held is None:
        return False
    return held.numel() == 0 or (INT32.min <= int(held.min()) and int(held.max()) <= INT32.max)


def _values_within_int32(node: fx.Node, name: str | None) -> bool:
    """Whether the values `node` is given (a fill, a clamp's bounds; not its sizes) fit int32."""
    given = [*node.args[VALUES_FROM.get(name or "", len(node.args)) :]]
    given += [value for key, value in node.kwargs.items() if key in VALUE_KEYWORDS]
    return all(INT32.min <= n <= INT32.max for n in _numbers(given))


def _numbers(values: list[Any]) -> Iterator[float]:
    for value in values:
        if isinstance(value, list | tuple):
            yield from _numbers(list(value))
        elif isinstance(value, int | float) and not isinstance(value, bool):
            yield value


def _nodes(args: Any) -> Iterator[fx.Node]:
    for arg in args:
        if isinstance(arg, fx.Node):
            yield arg
        elif isinstance(arg, list | tuple):
            yield from _nodes(arg)
