"""The sizes an exported variant was built for: its dynamic dims' ranges, and which are tied.

Where a model ties its inputs' dynamic dims (token ids and their mask share one length, a table
of 512 positions bounds it), export infers the ties (compiler.frontend), and the variant built
from it is right only inside them: past a bound it may read past its tables, and equal dims given
other sizes are not what it computes. TorchScript answers such a request, as the upload would.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from compiler.errors import ConversionError, InputMismatchError
from compiler.runner import Runner
from compiler.spec import InputSpec


class OutsideDimsError(InputMismatchError):
    """Inputs of sizes the variant was not built for; TorchScript serves them."""


@dataclass(frozen=True)
class Dims:
    # input -> axis -> the size's symbol; axes of one symbol take one size.
    axes: dict[str, dict[int, str]]
    # symbol -> smallest and largest size (None: no bound).
    ranges: dict[str, tuple[int, int | None]]

    @classmethod
    def of(cls, program: Any, spec: InputSpec) -> Dims | None:
        """The dynamic dims other than the batch of an ExportedProgram's inputs; None where each
        takes any size from 1 up on its own, as the spec says (the batch's bounds, spec.check
        enforces). A dim export derived from others (twice one) is a ConversionError: inputs of
        one size everywhere (TRACE_FILL) rarely lead there, and serving does not follow it."""
        values = {n.name: n.meta["val"] for n in program.graph.nodes if n.op == "placeholder"}
        axes: dict[str, dict[int, str]] = {}
        ranges: dict[str, tuple[int, int | None]] = {}
        for t, placeholder in zip(spec.inputs, program.graph_signature.user_inputs, strict=True):
            for axis, size in enumerate(values[placeholder].shape):
                if t.shape[axis] != -1 or (axis == 0 and t.batched) or isinstance(size, int):
                    continue
                expr = size.node.expr
                if not expr.is_Symbol:
                    raise ConversionError(
                        f"input {t.name!r} dim {axis} must be {expr} in the sizes of other dims; Kiln "
                        "compiles dynamic dims that are free or equal"
                    )
                bounds = program.range_constraints[expr]
                # No bound is torch's int_oo, which calls itself finite but is no Integer.
                upper = int(bounds.upper) if bounds.upper.is_Integer else None
                axes.setdefault(t.name, {})[axis] = str(expr)
                ranges[str(expr)] = (int(bounds.lower), upper)
        count = sum(len(dims) for dims in axes.values())
        if count == len(ranges) and all(r == (1, None) for r in ranges.values()):
            return None
        return cls(axes, ranges)

    def to_dict(self) -> dict[str, Any]:
        return {
            "axes": {
                name: {str(axis): symbol for axis, symbol in dims.items()} for name, dims in self.axes.items()
            },
            "ranges": {symbol: list(bounds) for symbol, bounds in self.ranges.items()},
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> Dims:
        axes = {
            name: {int(axis): symbol for axis, symbol in dims.items()} for name, dims in doc["axes"].items()
        }
        return cls(axes, {symbol: (lower, upper) for symbol, (lower, upper) in doc["ranges"].items()})

    def refusal(self, inputs: Mapping[str, np.ndarray]) -> str | None:
        """Why these inputs are outside the sizes, or None when they fit."""
        seen: dict[str, tuple[int, str]] = {}
        for name, dims in self.axes.items():
            for axis, symbol in dims.items():
                size, where = int(inputs[name].shape[axis]), f"input {name!r} dim {axis}"
                lower, upper = self.ranges[symbol]
                if size < lower or (upper is not None and size > upper):
                    to = " or more" if upper is None else f" to {upper}"
                    return f"{where} is {size}, and this variant takes {lower}{to}"
                first = seen.setdefault(symbol, (size, where))
                if first[0] != size:
                    return f"{where} is {size} and {first[1]} is {first[0]}: this variant takes them equal"
        return None


class Bounded:
    """A runner that refuses inputs outside the sizes its variant was built for."""

    def __init__(self, runner: Runner, dims: Dims) -> None:
        self.runner = runner
        self.backend = runner.backend
        self.dims = dims

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        refusal = self.dims.refusal(inputs)
        if refusal is not None:
            raise OutsideDimsError(f"the {self.backend} variant: {refusal}")
        return self.runner.run(inputs)


def dims_meta(program: Any, spec: InputSpec) -> dict[str, Any]:
    """An exported variant's artifact metadata on its dims: none where the spec says it all."""
    dims = Dims.of(program, spec)
    return {} if dims is None else {"dims": dims.to_dict()}
