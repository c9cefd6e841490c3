"""Export's guards on its inputs' sizes (`L['y_1'].size()[1] > L['x_1'].size()[1]`): what the
program took to hold when it was traced, beyond each dim's range. A variant built from it is
right only where they hold. Parsed once and evaluated on a request's shapes without eval: the
expressions come with an artifact from the store."""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Callable, Mapping
from typing import Any

_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Div: operator.truediv,
    ast.BitAnd: operator.and_,  # of comparisons: sympy's And
    ast.BitOr: operator.or_,
}
# The functions torch's guard printer writes, by name: min and max of sizes (pooling's output
# size), abs, and floor, ceil and a float of a size (a scale factor's).
_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "max": max,
    "min": min,
    "abs": abs,
    "math.floor": math.floor,
    "math.ceil": math.ceil,
    "torch.sym_float": float,
    "float": float,
}
# A guard's text at most: the store could hand a hostile one, which must not cost much to check.
MAX_CODE = 4096
_COMPARE: dict[type, Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}
_NODES = (
    ast.Expression,
    ast.Compare,
    ast.BoolOp,
    ast.BinOp,
    ast.UnaryOp,
    ast.Constant,
    ast.Subscript,
    ast.Call,
    ast.Attribute,
    ast.Name,
    ast.Load,
    ast.And,
    ast.Or,
    ast.Not,
    ast.USub,
    *_BINARY,
    *_COMPARE,
)
# How export names a dim of the program's argument `x`, in guards and in its errors.
ARGUMENT_DIM = re.compile(r"L\['(\w+)'\]\.size\(\)\[(\d+)\]")


class Guard:
    """One guard, over the inputs that `names` maps the program's placeholders to."""

    def __init__(self, code: str, names: Mapping[str, str]) -> None:
        """ValueError where it is not of the forms export writes: sizes, integers, arithmetic,
        comparisons, and/or/not, _FUNCTIONS."""
        self.code = code
        self.names = dict(names)
        if len(code) > MAX_CODE:
            raise ValueError(f"guard of {len(code)} characters, past {MAX_CODE}")
        try:
            self._tree = ast.parse(code, mode="eval").body
        except (SyntaxError, RecursionError) as exc:
            raise ValueError(f"guard {code!r}: {exc}") from None
        for node in ast.walk(self._tree):
            size_call = (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "size"
            )
            if not isinstance(node, _NODES) or (
                isinstance(node, ast.Call) and not size_call and _function(node) is None
            ):
                raise ValueError(f"guard {code!r}: {ast.unparse(node)} is not a form Kiln checks")
            if (
                isinstance(node, ast.Attribute)
                and node.attr != "size"
                and ast.unparse(node) not in _FUNCTIONS
            ):
                raise ValueError(f"guard {code!r}: {ast.unparse(node)} is not a form Kiln checks")
            if isinstance(node, ast.Name) and node.id not in {"L", "math", "torch", *_FUNCTIONS}:
                raise ValueError(f"guard {code!r}: {node.id} is not a name Kiln knows")
            inner = isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name)  # L['x_1']
            if isinstance(node, ast.Subscript) and not inner and self._size(node) is None:
                raise ValueError(f"guard {code!r}: {ast.unparse(node)} is no input's size")

    def holds(self, shapes: Mapping[str, tuple[int, ...]]) -> bool:
        """Whether the guard holds for inputs of these shapes, by input name; not where it cannot
        be told (a division by a size of 0 in a branch Python would not take): refused."""
        try:
            return bool(self._value(self._tree, shapes))
        except (ArithmeticError, IndexError, KeyError, TypeError, ValueError):
            return False

    def __str__(self) -> str:
        """As the spec names the inputs: y.shape[1] > x.shape[1]."""
        return ARGUMENT_DIM.sub(lambda m: f"{self.names.get(m[1], m[1])}.shape[{m[2]}]", self.code)

    def _size(self, node: ast.Subscript) -> tuple[str, int] | None:
        """The input and axis of `L['x_1'].size()[1]`."""
        call = node.value
        if not (
            isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "size"
        ):
            return None
        of, axis = call.func.value, node.slice
        if not (isinstance(of, ast.Subscript) and isinstance(of.value, ast.Name) and of.value.id == "L"):
            return None
        if not (isinstance(of.slice, ast.Constant) and of.slice.value in self.names):
            return None
        if not (isinstance(axis, ast.Constant) and isinstance(axis.value, int)):
            return None
        return self.names[of.slice.value], axis.value

    def _value(self, node: ast.expr, shapes: Mapping[str, tuple[int, ...]]) -> Any:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Subscript) and (size := self._size(node)) is not None:
            return shapes[size[0]][size[1]]
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            return _BINARY[type(node.op)](self._value(node.left, shapes), self._value(node.right, shapes))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.Not):
            value = self._value(node.operand, shapes)
            return -value if isinstance(node.op, ast.USub) else not value
        # Every operand evaluated, none short-circuited: one check of a guard reaches all its forms.
        if isinstance(node, ast.BoolOp):
            values = [self._value(v, shapes) for v in node.values]
            return all(values) if isinstance(node.op, ast.And) else any(values)
        if isinstance(node, ast.Call) and (function := _function(node)) is not None:
            return function(*(self._value(arg, shapes) for arg in node.args))
        if isinstance(node, ast.Compare) and all(type(op) in _COMPARE for op in node.ops):
            operands = [self._value(v, shapes) for v in (node.left, *node.comparators)]
            pairs = zip(node.ops, operands, operands[1:], strict=False)
            return all(_COMPARE[type(op)](left, right) for op, left, right in pairs)
        raise ValueError(f"guard {self.code!r}: {ast.unparse(node)} is not a form Kiln checks")


def _function(call: ast.Call) -> Callable[..., Any] | None:
    """One of _FUNCTIONS, called with positional arguments only."""
    name = ast.unparse(call.func) if isinstance(call.func, ast.Name | ast.Attribute) else ""
    return None if call.keywords else _FUNCTIONS.get(name)
