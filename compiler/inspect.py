"""Upload-time inspection: the model loads, runs on its input spec, and what it outputs."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np

from compiler.backends.torchscript import TorchScriptRunner
from compiler.backends.torchscript import backend as torchscript
from compiler.errors import InvalidModelError, raised_as
from compiler.spec import CARRIED, VARIED_FILL, InputSpec
from compiler.threads import set_threads

# Every row of a batch is checked against every other in bit_length(rows) runs more: a larger
# batch is probed at this many rows, which a model whose rows mix shows as well.
PROBE_ROWS = 16


def inspect_model(
    path: str,
    spec_doc: dict[str, Any],
    samples: Sequence[Mapping[str, Any]],
    progress: Callable[[dict[str, Any]], None],
) -> dict[str, Any]:
    """Run the model at batch 1 and at its largest batch, and on the upload's `samples`; return
    the order of its inputs (`inputs`, their names) and its outputs' name, dtype, shape
    (`outputs`). A run that fails is an InvalidModelError that says which.

    Inputs all named after forward()'s arguments are taken in its order, as Triton's PyTorch
    backend matches them; others in the order given. An output dimension that follows the
    batch size is reported as -1 (the first: `batched`), as is one that follows the inputs'
    other dynamic dimensions (a sequence's length, say: those are at TRACE_FILL, and the model
    runs once more with them at VARIED_FILL). An output of which a row in the largest batch
    (probed at PROBE_ROWS rows at most) changes with the batch's other rows, its own unchanged,
    depends on them: `rows_apart` false. An output of a dtype no protocol carries (complex, say)
    is an InvalidModelError.
    Meant for a child process with a time and a memory limit (service.sandbox), which a broken model
    can only crash or stall. That child shares the server's files and network: load_torchscript
    refuses models that call the ops known to reach them, a check of the code, not a sandbox.
    """
    set_threads(1)
    spec = InputSpec.from_dicts(spec_doc["inputs"], spec_doc["max_batch_size"])
    runner = torchscript.load(torchscript.compile(Path(path).read_bytes(), spec, "any", {}))
    arguments = forward_arguments(runner.module)
    if set(spec.names) <= set(arguments):
        leading = arguments[: len(spec.names)]
        if set(spec.names) != set(leading):  # inputs are passed by position
            raise InvalidModelError(
                f"inputs {spec.names} are arguments of forward({', '.join(arguments)}), but not its "
                f"first {len(leading)}: give {leading}, which Kiln passes by position"
            )
        spec = InputSpec(tuple(sorted(spec.inputs, key=lambda t: leading.index(t.name))), spec.max_batch_size)
        runner = TorchScriptRunner(runner.module, spec)
    rng = np.random.default_rng(0)
    batches = sorted({1, spec.largest_batch})
    shapes = ", ".join(str(t) for t in spec.inputs)
    inputs = [spec.random_inputs(b, rng) for b in batches]
    # Whether rows stand apart is probed at the largest batch, or at PROBE_ROWS rows for a larger
    # one: its inputs again, then with rows changed, from inputs copied before a run may write
    # to them. Probed at fewer rows, a batch of them is run twice first, for its reference.
    probing = len(batches) > 1 and spec.batched  # else no calls merge, and whole inputs have no rows
    probe = min(batches[-1], PROBE_ROWS)
    whole = probe == batches[-1]
    changed = _changed_rows(probe) if probing else np.zeros((0, 1), bool)
    base = {k: v.copy() for k, v in inputs[-1].items()} if whole else spec.random_inputs(probe, rng)
    fresh = spec.random_inputs(probe, rng) if probing else {}
    runs = [_run(runner, x, f"inputs {shapes} at batch {b}") for b, x in zip(batches, inputs, strict=True)]
    at_probe = f"inputs {shapes} at batch {probe}"
    each = changed if whole else np.vstack([changed[:1], changed])  # the reference, unchanged
    probed = [_run(runner, _mix(base, fresh, rows), at_probe) for rows in each]
    reference, repeated, *mixed = ([runs[-1]] if whole else []) + probed if probing else [{}, {}]
    for i, sample in enumerate(samples):  # what verification will run every variant on
        _run(runner, spec.coerce(sample), f"samples[{i}]")
    varied = _varied(runner, spec, rng)
    outputs = []
    for name, first in runs[0].items():
        if first.dtype not in CARRIED:
            raise InvalidModelError(
                f"output {name!r} has dtype {first.dtype}, which no inference protocol carries: "
                "return real tensors (torch.view_as_real, for a complex one)"
            )
        shape = list(first.shape)
        batched = bool(first.ndim) and (
            runs[-1][name].shape[0] == batches[-1] != shape[0]
            if len(runs) > 1
            # max_batch_size 1: every run is of batch 1, and a leading 1 is the batch's, as
            # Triton has every output of a batching model lead with it.
            else spec.batched and shape[0] == 1
        )
        if batched:
            shape[0] = -1
        last = runs[-1][name].shape
        if len(last) == len(shape):
            # A dimension past the first that grows with the batch (x.t()) is dynamic too: its
            # size at batch 1 told clients to size an output region for one row.
            shape[1:] = [-1 if d != other else d for d, other in zip(shape[1:], last[1:], strict=True)]
        if name in varied and len(varied[name]) == len(shape):
            # The batch's dimension stays as the batch run found it; a first dimension that
            # follows another instead is -1 too, and not `batched`: never split as the batch.
            free = 1 if batched else 0
            pairs = zip(shape[free:], varied[name][free:], strict=True)
            shape[free:] = [-1 if other != d else d for d, other in pairs]
        # Kernels do the same sums for a batch of the same size, so a row that follows the
        # others depends on them; unless the model answers otherwise each time (it samples
        # noise), where merging leaks nothing.
        apart = (
            not batched
            or not repeated
            or not _same(repeated[name], reference[name])
            or _rows_kept(name, [reference, *mixed], changed)
        )
        outputs.append(
            {"name": name, "dtype": first.dtype.name, "shape": shape, "batched": batched, "rows_apart": apart}
        )
    return {"inputs": spec.names, "outputs": outputs}


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal to the bit, NaN where NaN is."""
    return a.shape == b.shape and bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))


def _changed_rows(batch: int) -> np.ndarray:
    """Which rows of a batch each run changes: none in the first, and row i in those after it
    of the bits of i + 1. For rows i and j, two runs give i the same inputs and j others: the
    first and one that changes j but not i; or, where every run that changes j changes i, one
    of those and one that changes i but not j. So every row is checked against every other,
    in batch.bit_length() runs more."""
    bits = (np.arange(1, batch + 1) & (1 << np.arange(batch.bit_length())[:, None])) > 0
    return np.vstack([np.zeros((1, batch), bool), bits])


def _mix(
    base: dict[str, np.ndarray], fresh: dict[str, np.ndarray], rows: np.ndarray
) -> dict[str, np.ndarray]:
    """`base` with `rows` (a mask over the batch) taken from `fresh`, in new arrays."""
    mixed = {k: v.copy() for k, v in base.items()}
    for k, v in mixed.items():
        v[rows] = fresh[k][rows]
    return mixed


def _rows_kept(name: str, runs: Sequence[dict[str, np.ndarray]], changed: np.ndarray) -> bool:
    """Whether output `name` is, in every two runs, the same to the bit in the rows whose inputs
    were the same."""
    for (a, in_a), (b, in_b) in combinations(zip(runs, changed, strict=True), 2):
        same = in_a == in_b
        if a[name].shape != b[name].shape or not _same(a[name][same], b[name][same]):
            return False
    return True


def _run(runner: TorchScriptRunner, inputs: dict[str, np.ndarray], what: str) -> dict[str, np.ndarray]:
    with raised_as(InvalidModelError, f"the model failed on {what}:"):
        return runner.run(inputs)


def _varied(runner: TorchScriptRunner, spec: InputSpec, rng: np.random.Generator) -> dict[str, list[int]]:
    """The outputs' shapes at batch 1 with the inputs' other dynamic dimensions at VARIED_FILL
    (none if they have none): where they differ from those at TRACE_FILL, the output follows
    them. A model that cannot run so shows its outputs' dimensions as they were at TRACE_FILL."""
    if not spec.free_dims:
        return {}
    try:
        outputs = runner.run(spec.random_inputs(1, rng, VARIED_FILL))
    except Exception:  # as the model's at a size it cannot take: its requests will say so
        return {}
    return {name: list(array.shape) for name, array in outputs.items()}


def forward_arguments(module: Any) -> list[str]:
    """The names of a TorchScript module's forward() arguments, self left out."""
    try:
        return [argument.name for argument in module.forward.schema.arguments[1:]]
    except (AttributeError, RuntimeError):  # not a scripted or traced forward
        return []
