"""Upload-time inspection: the model loads, runs on its input spec, and what it outputs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from compiler.backends.torchscript import TorchScriptRunner
from compiler.backends.torchscript import backend as torchscript
from compiler.errors import InvalidModelError
from compiler.spec import InputSpec
from compiler.threads import set_threads


def inspect_model(
    path: str, spec_doc: dict[str, Any], progress: Callable[[dict[str, Any]], None]
) -> dict[str, Any]:
    """Run the model at batch 1 and at its largest batch; return the order of its inputs
    (`inputs`, their names) and its outputs' name, dtype, shape (`outputs`).

    Inputs all named after forward()'s arguments are taken in its order, as Triton's PyTorch
    backend matches them; others in the order given. An output dimension that follows the
    batch size is reported as -1.
    Meant for a sandboxed child process: a hostile or broken model can only crash the child.
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
    batches = sorted({1, spec.max_batch_size}) if spec.batched else [1]
    runs: list[dict[str, np.ndarray]] = []
    for batch in batches:
        try:
            runs.append(runner.run(spec.random_inputs(batch, rng)))
        except InvalidModelError:
            raise
        except Exception as exc:
            # TorchScript errors end with the real cause after a long interpreter trace.
            lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
            reason = lines[-1] if lines else ""
            shapes = ", ".join(str(t) for t in spec.inputs)
            raise InvalidModelError(
                f"the model failed on inputs {shapes} at batch {batch}: "
                f"{type(exc).__name__}: {reason.strip()[:300]}"
            ) from None
    outputs = []
    for name, first in runs[0].items():
        shape = list(first.shape)
        if len(runs) > 1 and first.ndim and runs[-1][name].shape[0] == batches[-1] != shape[0]:
            shape[0] = -1
        outputs.append({"name": name, "dtype": first.dtype.name, "shape": shape})
    return {"inputs": spec.names, "outputs": outputs}


def forward_arguments(module: Any) -> list[str]:
    """The names of a TorchScript module's forward() arguments, self left out."""
    try:
        return [argument.name for argument in module.forward.schema.arguments[1:]]
    except (AttributeError, RuntimeError):  # not a scripted or traced forward
        return []
