"""Frontend: TorchScript bytes -> ScriptModule -> ExportedProgram with a symbolic batch dimension."""

from __future__ import annotations

import io
import re
import zipfile
from typing import Any

import numpy as np
import torch

from compiler.errors import ConversionError, InvalidModelError
from compiler.spec import DTYPES, InputSpec

# The usual mistake is a file that torch wrote some other way: it says how to write the right one.
_TO_TORCHSCRIPT = (
    "save the model as TorchScript: torch.jit.save(torch.jit.script(model), path), or "
    "torch.jit.trace(model, example_inputs) where it does not script"
)

# How torch.save's legacy (non-zip) format begins: pickle protocol 2, then torch's magic number.
_LEGACY_TORCH_SAVE = b"\x80\x02\x8a\nl\xfc\x9cF\xf9 j\xa8P\x19"


def load_torchscript(data: bytes) -> torch.jit.ScriptModule:
    """Load a TorchScript archive from bytes, on CPU, in eval mode; reject anything else clearly."""
    try:
        names = zipfile.ZipFile(io.BytesIO(data)).namelist()
    except Exception as exc:  # BadZipFile, and for damaged ones OSError, NotImplementedError, ...
        if data.startswith(_LEGACY_TORCH_SAVE):
            raise InvalidModelError(
                f"the file is a pickle (torch.save), not TorchScript: {_TO_TORCHSCRIPT}"
            ) from exc
        raise InvalidModelError(
            "the file is not a TorchScript archive (expected the zip file written by torch.jit.save)"
        ) from exc
    other = _other_torch_archive(names)
    if other:
        raise InvalidModelError(f"the file is {other}, not TorchScript: {_TO_TORCHSCRIPT}")
    try:
        module = torch.jit.load(io.BytesIO(data), map_location="cpu")
    except Exception as exc:  # torch raises RuntimeError and friends with long C++ traces
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InvalidModelError(f"the file is not a TorchScript archive: {first_line}") from exc
    module.eval()
    return module


def _other_torch_archive(names: list[str]) -> str | None:
    """What a zip that torch wrote, but not torch.jit.save, holds; None for anything else. Names
    are compared without their folders: each format puts its files in one of its own."""
    files = {name.rpartition("/")[2] for name in names}
    if files & {"archive_format", "serialized_exported_program.json"}:  # torch.export, 2.6+ and older
        return "a torch.export archive (.pt2)"
    if "data.pkl" in files and "constants.pkl" not in files:
        return "a torch.save checkpoint (a state_dict or a pickled module)"
    return None


def export_program(module: torch.jit.ScriptModule, spec: InputSpec) -> Any:
    """TorchScript -> ExportedProgram where only the dynamic (-1) dims stay symbolic.

    TS2EPConverter marks every dimension symbolic and specialises the ones the model compares,
    recording guards for them; re-exporting its module (without those guards) with explicit
    dynamic_shapes pins the static dims and fails loudly if the model fixes a dynamic one.
    """
    from compiler import ts_export

    # export specialises a dimension traced at size 1, so trace dynamic dims above 1.
    batch = 2 if spec.max_batch_size > 1 else 1
    sample = tuple(
        torch.from_numpy(np.ones(t.concrete_shape(batch, fill=TRACE_FILL), DTYPES[t.dtype]))
        for t in spec.inputs
    )
    try:
        converted = ts_export.convert(module, sample)
        return torch.export.export(
            converted.module(check_guards=False),
            sample,
            dynamic_shapes=_dynamic_shapes(spec),
            strict=False,
        )
    except Exception as exc:
        raise ConversionError(f"TorchScript export failed: {_export_reason(exc)}") from exc


def _export_reason(exc: BaseException) -> str:
    fixed = re.search(r"Constraints violated \(([^)]*)\)", str(exc))
    if fixed is None:
        return _first_line(exc)
    # Dims are named "batch" or "input<i>_d<axis>" by _dynamic_shapes.
    return f"the model only runs with fixed sizes for dims the input spec marks dynamic ({fixed[1]})"


# Size used to trace dynamic non-batch dims (sequence lengths, image sizes).
TRACE_FILL = 8


def _dynamic_shapes(spec: InputSpec) -> tuple[dict[int, Any] | None, ...]:
    """One shared batch Dim (spec.check makes inputs agree on it); one Dim per other -1 dim.

    With max_batch_size 1 the batch is traced static: a Dim cannot have min == max.
    """
    batch = torch.export.Dim("batch", min=1, max=spec.max_batch_size) if spec.max_batch_size > 1 else None
    shapes: list[dict[int, Any] | None] = []
    for index, t in enumerate(spec.inputs):
        dims: dict[int, Any] = {}
        for axis, size in enumerate(t.shape):
            if size == -1 and axis == 0 and batch is not None:
                dims[axis] = batch
            elif size == -1 and axis > 0:
                # Dim names must be identifiers; spec names may contain dots.
                dims[axis] = torch.export.Dim(f"input{index}_d{axis}", min=1)
        shapes.append(dims or None)
    return tuple(shapes)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__
