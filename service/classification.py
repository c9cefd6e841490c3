"""Triton's classification extension: an output answered with its top classes instead of its
values, each the BYTES string "<value>:<index>[:<label>]", as Triton formats it."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from service.errors import BadRequestError, InvalidConfigError
from service.records import OutputInfo, TensorConfig
from service.tensors import Output

RANKED = "iuf"  # numpy kinds that can be ranked: integers and floating point


def check_classified(counts: Mapping[str, int], outputs: Sequence[OutputInfo]) -> None:
    """Before inference: only numbers can be ranked."""
    for output in outputs:
        if counts.get(output.name) and np.dtype(output.dtype).kind not in RANKED:
            raise BadRequestError(
                f"output {output.name!r} is {output.dtype}: classification ranks integers and floats"
            )


# The version record carries its labels, and every process reads it again each KILN_ROUTE_TTL_S:
# ImageNet's 1,000 labels take about 20 KiB.
MAX_LABEL_BYTES = 1024 * 1024


def check_labels(
    labels: Mapping[str, Sequence[str]],
    outputs: Sequence[OutputInfo],
    inputs: Sequence[TensorConfig],
    field: str,
) -> None:
    """Labels name outputs that can be classified and, where every input but its batch is of
    fixed shape, no more classes than an item of the output has."""
    size = sum(len(label.encode()) + 1 for names in labels.values() for label in names)
    if size > MAX_LABEL_BYTES:
        raise InvalidConfigError(f"{field}: the labels take {size} bytes; {MAX_LABEL_BYTES} at most")
    # The output shapes were seen on one input shape (compiler.inspect): with another, they may differ.
    fixed = all(d >= 0 for t in inputs for d in t.shape[1:])
    by_name = {o.name: o for o in outputs}
    for name, names in labels.items():
        output = by_name.get(name)
        if output is None:
            raise InvalidConfigError(f"{field}: the model has no output {name!r}; it outputs {list(by_name)}")
        if np.dtype(output.dtype).kind not in RANKED:
            raise InvalidConfigError(f"{field}.{name}: a {output.dtype} output has no classes to label")
        classes = math.prod(output.shape[1:] if output.batched else output.shape)
        if fixed and len(names) > classes:
            raise InvalidConfigError(
                f"{field}.{name}: {len(names)} labels, but output {name!r} has {classes} classes "
                f"(shape {output.shape})"
            )


def _rows(array: np.ndarray, batched: bool) -> np.ndarray:
    """One row per batch item, or one row of the whole output."""
    if batched and array.ndim:
        return array.reshape(array.shape[0], math.prod(array.shape[1:]))
    return array.reshape(1, array.size)


def _text(value: float | int) -> str:
    """C++'s std::to_string, which Triton prints values with: "%f" for floating point (glibc
    writes a NaN whose sign bit is set, as 0/0 makes on x86, as -nan), the integer itself."""
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "-nan" if math.copysign(1, value) < 0 else "nan"
    return f"{value:f}"


def top_classes(array: np.ndarray, count: int, batched: bool, labels: Sequence[str]) -> np.ndarray:
    """The `count` highest values of each batch item (of the whole output when not `batched`),
    highest first, equal values in index order, NaN last; shape [batch, k] or [k], k at most
    the classes there are. An empty label is none, as in Triton."""
    rows = _rows(array, batched)
    if rows.dtype.kind == "f":  # numpy sorts NaN last
        order = np.argsort(-rows, axis=1, kind="stable")[:, :count]
    else:  # integers may not negate (the lowest int64, unsigned): reversed, and read backwards
        last = rows.shape[1] - 1
        order = (last - np.argsort(rows[:, ::-1], axis=1, kind="stable"))[:, ::-1][:, :count]
    values = np.take_along_axis(rows, order, axis=1).tolist()  # only those printed, as Python's
    result = np.empty(order.shape, dtype=object)
    for i, (indices, row) in enumerate(zip(order.tolist(), values, strict=True)):
        for j, (index, value) in enumerate(zip(indices, row, strict=True)):
            text = f"{_text(value)}:{index}"
            label = labels[index] if index < len(labels) else ""
            result[i, j] = (f"{text}:{label}" if label else text).encode()
    return result if batched and array.ndim else result[0]


def classify_cost(outputs: list[Output], counts: Mapping[str, int], batched: bool) -> int:
    """The work of classifying these outputs: values ranked, plus 64 per string written (about
    50 ns and 3 us each here)."""
    cost = 0
    for name, array, _ in outputs:
        if name in counts:
            rows = _rows(array, batched)
            cost += rows.size + 64 * rows.shape[0] * min(counts[name], rows.shape[1])
    return cost


def classified(
    outputs: list[Output], counts: Mapping[str, int], batched: bool, labels: Mapping[str, Sequence[str]]
) -> list[Output]:
    """The outputs, those in `counts` as their top classes."""
    return [
        (name, top_classes(array, counts[name], batched, labels.get(name, ())), binary)
        if name in counts
        else (name, array, binary)
        for name, array, binary in outputs
    ]
