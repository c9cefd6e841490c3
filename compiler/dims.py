"""The sizes an exported variant was built for: its dynamic dims' ranges, and which are tied.

Where a model ties its inputs' dynamic dims (token ids and their mask share one length, a table
of 512 positions bounds it, `x[:, :y.shape[1]]` ends at y's length or at x's, as traced),
export infers the ties (compiler.frontend), and the variant built from it is right only inside
them: past a bound it may read past its tables, and equal dims given other sizes are not what it
computes. TorchScript answers such a request, as the upload would.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import sympy

from compiler.errors import ConversionError, InputMismatchError
from compiler.guards import Guard
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
    # What else export took to hold (one dim larger than another: compiler.guards).
    guards: list[Guard]

    @classmethod
    def of(cls, program: Any, spec: InputSpec) -> Dims | None:
        """The dynamic dims other than the batch of an ExportedProgram's inputs; None where it
        has none (the batch's bounds, spec.check enforces). Each from 2 up at least: export
        traced them above 1 and took them to stay so (its 0/1 specialisation: `x.shape[1] == 1`
        follows the branch of 8), though a Dim from 1 reports 1; TorchScript serves a dim of 1.
        A dim export derived from others (twice one), or a guard of a form compiler.guards does
        not check, is a ConversionError: traced at sizes of their own, dims rarely lead there."""
        axes: dict[str, dict[int, str]] = {}
        ranges: dict[str, tuple[int, int | None]] = {}
        for (name, axis), expr in dynamic_sizes(program, spec).items():
            if not expr.is_Symbol:
                raise ConversionError(
                    f"input {name!r} dim {axis} must be {expr} in the sizes of other dims; Kiln "
                    "compiles dynamic dims that are free or equal"
                )
            bounds = program.range_constraints[expr]
            # No bound is torch's int_oo, which calls itself finite but is no Integer.
            upper = int(bounds.upper) if bounds.upper.is_Integer else None
            axes.setdefault(name, {})[axis] = str(expr)
            ranges[str(expr)] = (max(int(bounds.lower), 2), upper)
        names = dict(zip(program.graph_signature.user_inputs, spec.names, strict=True))
        traced = {name: tuple(x.shape) for name, x in zip(spec.names, program.example_inputs[0], strict=True)}
        # Export took the batch above 1 too, where a Dim from 1 says 1 serves: verification runs
        # batch 1, so a guard only that rules out is left to it.
        at_1 = {t.name: (1, *traced[t.name][1:]) if t.batched else traced[t.name] for t in spec.inputs}
        guards = []
        for code in program._guards_code:  # private; the unlifted module checks them so
            try:
                guard = Guard(code, names)
                if not guard.holds(traced):
                    raise ValueError(f"guard {code!r} does not hold for the inputs it was traced on")
            except ValueError as exc:
                raise ConversionError(f"export's {exc}") from None
            if guard.holds(at_1):
                guards.append(guard)
        return cls(axes, ranges, guards) if axes or guards else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "axes": {
                name: {str(axis): symbol for axis, symbol in dims.items()} for name, dims in self.axes.items()
            },
            "ranges": {symbol: list(bounds) for symbol, bounds in self.ranges.items()},
            "guards": [{"code": g.code, "inputs": g.names} for g in self.guards],
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> Dims:
        axes = {
            name: {int(axis): symbol for axis, symbol in dims.items()} for name, dims in doc["axes"].items()
        }
        ranges = {symbol: (lower, upper) for symbol, (lower, upper) in doc["ranges"].items()}
        return cls(axes, ranges, [Guard(g["code"], g["inputs"]) for g in doc["guards"]])

    def refusal(self, inputs: Mapping[str, np.ndarray]) -> str | None:
        """Why these inputs are outside the sizes, or None when they fit."""
        seen: dict[str, tuple[int, str]] = {}
        for name, dims in self.axes.items():
            for axis, symbol in dims.items():
                size, where = int(inputs[name].shape[axis]), f"input {name!r} dim {axis}"
                lower, upper = self.ranges[symbol]
                if size < lower or (upper is not None and size > upper):
                    to = " or more" if upper is None else f" to {upper}"
                    return f"{where} is {size}, outside {lower}{to}"
                first = seen.setdefault(symbol, (size, where))
                if first[0] != size:
                    return f"{where} is {size} and {first[1]} is {first[0]}, where they must be equal"
        shapes = {name: array.shape for name, array in inputs.items()}
        for guard in self.guards:
            if not guard.holds(shapes):
                return f"it needs {guard}"
        return None


def dynamic_sizes(program: Any, spec: InputSpec) -> dict[tuple[str, int], sympy.Expr]:
    """The sizes, in export's symbols, of a program's inputs' dynamic dims past the batch, by
    input name and axis."""
    values = {n.name: n.meta["val"] for n in program.graph.nodes if n.op == "placeholder"}
    sizes = {}
    for t, placeholder in zip(spec.inputs, program.graph_signature.user_inputs, strict=True):
        for axis, size in enumerate(values[placeholder].shape):
            if axis > 0 and t.shape[axis] == -1 and not isinstance(size, int):
                sizes[t.name, axis] = size.node.expr
    return sizes


def unverified(inputs: Mapping[str, np.ndarray]) -> str | None:
    """What of the inputs no compiled variant is verified on, if anything: an empty dim (a batch
    of 0 aborts the process in ONNX Runtime's LSTM, and TVM raises on it), or a float that is not
    finite (compilers rewrite relu, max and argmax in ways that agree with torch on numbers only)."""
    for name, x in inputs.items():
        if x.size == 0:
            return f"input {name!r} is empty (shape {list(x.shape)})"
        if x.dtype.kind in "fc" and not np.isfinite(x).all():
            return f"input {name!r} holds NaN or infinity"
    return None


class Bounded:
    """A compiled variant's runner, which refuses the inputs it was not built for (outside its
    dims, if any) or not verified on (`unverified`): TorchScript answers those."""

    def __init__(self, runner: Runner, dims: Dims | None) -> None:
        self.runner = runner
        self.backend = runner.backend
        self.dims = dims

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        refusal = unverified(inputs) or (None if self.dims is None else self.dims.refusal(inputs))
        if refusal is not None:
            raise OutsideDimsError(f"the {self.backend} variant cannot take these inputs: {refusal}")
        return self.runner.run(inputs)


def dims_meta(program: Any, spec: InputSpec) -> dict[str, Any]:
    """An exported variant's artifact metadata on its dims: none where the spec says it all."""
    dims = Dims.of(program, spec)
    return {} if dims is None else {"dims": dims.to_dict()}
