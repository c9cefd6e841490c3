"""Input specs: tensor names, dtypes and shapes, where -1 marks a dynamic dimension."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any, Literal, get_args

import numpy as np

from compiler.errors import InputMismatchError, InvalidSpecError

DType = Literal["float32", "float64", "float16", "int64", "int32", "int16", "int8", "uint8", "bool"]
DTYPES: dict[str, np.dtype] = {name: np.dtype(name) for name in get_args(DType)}
# What the inference protocols carry (Triton's BOOL to FP64): an output of another dtype could
# never be answered.
CARRIED = frozenset(DTYPES.values()) | {np.dtype(name) for name in ("uint16", "uint32", "uint64")}

_SPEC_RE = re.compile(r"^(?P<name>[A-Za-z_][\w.]*):(?P<dtype>\w+)\[(?P<shape>[-\d,\s]*)\]$")


# The size Kiln gives a dynamic dim other than the batch in inputs of its own making: to trace
# the export, inspect the upload, verify and time its variants. Above 1, which export
# specialises and a convolution's window may not fit; and one size for all, inside the sizes an
# exported variant was built for (compiler.dims).
TRACE_FILL = 8
# Twice that, where inspection runs the model again to tell which output dims follow them.
VARIED_FILL = 2 * TRACE_FILL


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise InvalidSpecError(
                f"input {self.name!r}: unknown dtype {self.dtype!r}; use one of {sorted(DTYPES)}"
            )
        if not self.shape:
            raise InvalidSpecError(f"input {self.name!r}: shape must have at least one dimension")
        if any(d == 0 or d < -1 for d in self.shape):
            raise InvalidSpecError(
                f"input {self.name!r}: dimensions must be positive, or -1 for dynamic; got {list(self.shape)}"
            )

    @classmethod
    def parse(cls, text: str) -> TensorSpec:
        """Parse the CLI form `x:float32[-1,3,32,32]`."""
        match = _SPEC_RE.match(text.strip())
        if match is None:
            raise InvalidSpecError(f"cannot parse input spec {text!r}; expected NAME:DTYPE[D0,D1,...]")
        dims = [d.strip() for d in match["shape"].split(",") if d.strip()]
        try:
            shape = tuple(int(d) for d in dims)
        except ValueError as exc:
            raise InvalidSpecError(f"input spec {text!r}: dimensions must be integers") from exc
        return cls(match["name"], match["dtype"], shape)

    def __str__(self) -> str:
        return f"{self.name}:{self.dtype}[{','.join(map(str, self.shape))}]"

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}

    @property
    def batched(self) -> bool:
        """The first dimension is dynamic and is the batch dimension."""
        return self.shape[0] == -1

    def concrete_shape(self, batch: int, fill: int = TRACE_FILL) -> tuple[int, ...]:
        """The shape with the batch dim set to `batch` and other dynamic dims set to `fill`."""
        dims = list(self.shape)
        if self.batched:
            dims[0] = batch
        return tuple(fill if d == -1 else d for d in dims)

    def check(self, array: np.ndarray) -> None:
        """Raise InputMismatchError when `array` does not fit this spec."""
        expected = DTYPES[self.dtype]
        if array.dtype != expected:
            raise InputMismatchError(
                f"input {self.name!r}: expected dtype {self.dtype}, received {array.dtype}"
            )
        ok = array.ndim == len(self.shape) and all(
            want in (-1, got) for want, got in zip(self.shape, array.shape, strict=False)
        )
        if not ok:
            raise InputMismatchError(
                f"input {self.name!r}: expected shape {list(self.shape)}, received {list(array.shape)}"
            )


@dataclass(frozen=True)
class InputSpec:
    """The ordered inputs of a model and the largest batch it accepts."""

    inputs: tuple[TensorSpec, ...]
    max_batch_size: int = 1

    def __post_init__(self) -> None:
        if not self.inputs:
            raise InvalidSpecError("a model needs at least one input")
        names = [t.name for t in self.inputs]
        if len(set(names)) != len(names):
            raise InvalidSpecError(f"input names must be unique; got {names}")
        if self.max_batch_size < 1:
            raise InvalidSpecError("max_batch_size must be at least 1")

    @classmethod
    def parse(cls, texts: Sequence[str], max_batch_size: int = 1) -> InputSpec:
        return cls(tuple(TensorSpec.parse(t) for t in texts), max_batch_size)

    @classmethod
    def from_dicts(cls, items: Sequence[Mapping[str, object]], max_batch_size: int = 1) -> InputSpec:
        specs = []
        for item in items:
            shape = item["shape"]
            if not isinstance(shape, Sequence):
                raise InvalidSpecError(f"input {item.get('name')!r}: shape must be a list")
            specs.append(TensorSpec(str(item["name"]), str(item["dtype"]), tuple(int(d) for d in shape)))
        return cls(tuple(specs), max_batch_size)

    def to_dict(self) -> dict[str, object]:
        return {"inputs": [t.to_dict() for t in self.inputs], "max_batch_size": self.max_batch_size}

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.inputs]

    @property
    def batched(self) -> bool:
        return all(t.batched for t in self.inputs)

    @property
    def free_dims(self) -> bool:
        """Whether an input has a dynamic dim besides the batch (a sequence's length)."""
        return any(-1 in t.shape[1 if t.batched else 0 :] for t in self.inputs)

    @property
    def largest_batch(self) -> int:
        """The largest batch one call may have: as check() takes them, up to max_batch_size rows
        wherever an input's first dimension is the batch, though only a `batched` spec's calls
        merge (the others' whole inputs differ)."""
        return self.max_batch_size if any(t.batched for t in self.inputs) else 1

    def nbytes(self, batch: int, fill: int = TRACE_FILL) -> int:
        """The bytes of its inputs at `batch`, other dynamic dims of size `fill`."""
        return sum(math.prod(t.concrete_shape(batch, fill)) * DTYPES[t.dtype].itemsize for t in self.inputs)

    def random_inputs(
        self, batch: int, rng: np.random.Generator, fill: int = TRACE_FILL
    ) -> dict[str, np.ndarray]:
        """Random inputs for verification and benchmarking, other dynamic dims of size `fill`.
        Integers are small: they are often indices."""
        out: dict[str, np.ndarray] = {}
        for t in self.inputs:
            shape = t.concrete_shape(batch, fill)
            dtype = DTYPES[t.dtype]
            if dtype.kind == "f":
                out[t.name] = rng.standard_normal(shape).astype(dtype)
            elif dtype.kind == "b":
                out[t.name] = rng.integers(0, 2, shape).astype(dtype)
            else:
                out[t.name] = rng.integers(0, 10, shape).astype(dtype)
        return out

    def coerce(self, values: Mapping[str, object]) -> dict[str, np.ndarray]:
        """Nested lists (JSON) -> arrays of each input's dtype; raise InputMismatchError if unfit."""
        arrays: dict[str, np.ndarray] = {}
        for name, value in values.items():
            spec = next((t for t in self.inputs if t.name == name), None)
            arrays[name] = to_array(value, spec.dtype if spec else None, name)
        self.check(arrays)
        return arrays

    def check(self, inputs: Mapping[str, np.ndarray]) -> int:
        """Validate a full set of inputs and return its batch size."""
        missing = [n for n in self.names if n not in inputs]
        if missing:
            raise InputMismatchError(f"missing input(s) {missing}; the model takes {self.names}")
        unknown = [n for n in inputs if n not in self.names]
        if unknown:
            raise InputMismatchError(f"unknown input(s) {unknown}; the model takes {self.names}")
        for t in self.inputs:
            t.check(inputs[t.name])
        batches = {int(inputs[t.name].shape[0]) for t in self.inputs if t.batched}
        if len(batches) > 1:
            raise InputMismatchError(f"inputs disagree on the batch size: {sorted(batches)}")
        batch = batches.pop() if batches else 1
        if batch > self.max_batch_size:
            raise InputMismatchError(
                f"batch size {batch} is over this model's max_batch_size {self.max_batch_size}: send "
                f"at most {self.max_batch_size} along the first dimension, or upload a version with "
                "a larger max_batch_size"
            )
        return batch


def to_array(value: object, dtype: str | None, name: str) -> np.ndarray:
    """Convert JSON data to `dtype` without silently changing values (no float -> int)."""
    try:
        raw = np.asarray(value)
    except ValueError as exc:  # ragged nested lists
        raise InputMismatchError(f"input {name!r}: nested lists are ragged: {exc}") from exc
    if dtype is None:
        return raw
    want = DTYPES[dtype]
    if raw.size and raw.dtype.kind not in _ACCEPTS[want.kind]:  # numpy makes floats of []
        received = _JSON_KINDS.get(raw.dtype.kind, f"values of kind {raw.dtype.name}")
        raise InputMismatchError(f"input {name!r}: expected dtype {dtype}, received {received}")
    if raw.size and want.kind != "b" and bool_among_numbers(value, raw):
        raise InputMismatchError(f"input {name!r}: expected dtype {dtype}, received true/false among numbers")
    if raw.size and want.kind in "iu":  # an int past the dtype's range would wrap around
        info = np.iinfo(want)
        if int(raw.min()) < info.min or int(raw.max()) > info.max:
            raise InputMismatchError(
                f"input {name!r}: values out of the range of {dtype} ({info.min}..{info.max})"
            )
    return raw.astype(want)


# Which JSON-derived array kinds each dtype kind accepts: int < float, never downwards; true/false
# only for BOOL, as in v2.
_ACCEPTS = {"f": "iuf", "i": "iu", "u": "iu", "b": "b"}
# What JSON values numpy made an array of each kind from, in the words of JSON.
_JSON_KINDS = {
    "b": "true/false",
    "i": "integers",
    "u": "integers",
    "f": "numbers written with a decimal point or exponent (1.0, 1e3), or integers too large for int64",
    "U": "strings",
    "O": "values that are not all numbers (null, objects, mixed kinds), or integers too large for int64",
}


def bool_among_numbers(data: object, parsed: np.ndarray) -> bool:
    """Whether JSON `data` holds a true or false that numpy took for a 1 or a 0 among numbers.
    On the hot path: a look at every element costs about as much as numpy's parse, so numbers
    are looked at only where they are 0 or 1."""
    kind = parsed.dtype.kind
    # A scalar, or gRPC's typed contents (an array of their type), holds no JSON true or false.
    if not isinstance(data, list) or kind not in "iufO":
        return False
    leaves: Iterable[Any] = data  # a regular array: nested as deep as it has dims
    for _ in range(parsed.ndim - 1):
        leaves = chain.from_iterable(leaves)
    if kind != "O":
        at = np.flatnonzero((parsed == 0) | (parsed == 1))
        if not at.size:
            return False
        if at.size * 2 <= parsed.size:  # a few: each by its index rather than all in turn
            flat = data if parsed.ndim == 1 else list(leaves)
            leaves = map(flat.__getitem__, at.tolist())
    return bool in map(type, leaves)
