"""Export's guards on its inputs' sizes (`L['y_1'].size()[1] > L['x_1'].size()[1]`): what the
program took to hold when it was traced, beyond each dim's range. A variant built from it is
right only where they hold. Parsed once and evaluated on a request's shapes without eval: the
expressions come with an artifact from the store."""

from __future__ import annotations

import ast
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
}
_COMPARE: dict[type, Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}
_SIZE = re.compile(r"L\['(\w+)'\]\.size\(\)\[(\d+)\]")


class Guard:
    """One guard, over the inputs that `names` maps the program's placeholders to."""

    def __init__(self, code: str, names: Mapping[str, str]) -> None:
        """ValueError where it is not of the forms export writes: sizes, integers, arithmetic,
        comparisons, and/or/not."""
        self.code = code
        self.names = dict(names)
        try:
            self._tree = ast.parse(code, mode="eval").body
        except SyntaxError as exc:
            raise ValueError(f"guard {code!r}: {exc}") from None
        for node in ast.walk(self._tree):
            inner = isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name)  # L['x_1']
            if isinstance(node, ast.Subscript) and not inner and self._size(node) is None:
                raise ValueError(f"guard {code!r}: {ast.unparse(node)} is no input's size")

    def holds(self, shapes: Mapping[str, tuple[int, ...]]) -> bool:
        """Whether the guard holds for inputs of these shapes, by input name."""
        return bool(self._value(self._tree, shapes))

    def __str__(self) -> str:
        """As the spec names the inputs: y.shape[1] > x.shape[1]."""
        return _SIZE.sub(lambda m: f"{self.names.get(m[1], m[1])}.shape[{m[2]}]", self.code)

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
        if isinstance(node, ast.Compare) and all(type(op) in _COMPARE for op in node.ops):
            operands = [self._value(v, shapes) for v in (node.left, *node.comparators)]
            pairs = zip(node.ops, operands, operands[1:], strict=False)
            return all(_COMPARE[type(op)](left, right) for op, left, right in pairs)
        raise ValueError(f"guard {self.code!r}: {ast.unparse(node)} is not a form Kiln checks")
