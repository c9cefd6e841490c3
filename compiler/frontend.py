"""Frontend: TorchScript bytes -> ScriptModule -> ExportedProgram with a symbolic batch dimension."""

from __future__ import annotations

import io
import zipfile
from typing import Any

import torch

from compiler.errors import ConversionError, InvalidModelError
from compiler.spec import InputSpec


def load_torchscript(data: bytes) -> torch.jit.ScriptModule:
    """Load a TorchScript archive from bytes, on CPU, in eval mode; reject anything else clearly."""
    if not zipfile.is_zipfile(io.BytesIO(data)):
        raise InvalidModelError(
            "the file is not a TorchScript archive (expected the zip file written by torch.jit.save)"
        )
    try:
        module = torch.jit.load(io.BytesIO(data), map_location="cpu")
    except Exception as exc:  # torch raises RuntimeError and friends with long C++ traces
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InvalidModelError(f"the file is not a TorchScript archive: {first_line}") from exc
    module.eval()
    return module


def sample_tensors(spec: InputSpec, batch: int) -> tuple[torch.Tensor, ...]:
    import numpy as np

    arrays = spec.random_inputs(batch, np.random.default_rng(0))
    return tuple(torch.from_numpy(arrays[name]) for name in spec.names)


def export_program(module: torch.jit.ScriptModule, spec: InputSpec) -> Any:
    """TorchScript -> ExportedProgram where only the dynamic (-1) dims stay symbolic.

    TS2EPConverter marks every dimension symbolic; re-exporting its module with explicit
    dynamic_shapes pins the static ones, which both TVM's importer and tuning need.
    """
    from torch._export.converter import TS2EPConverter

    # Trace at batch 2: export specialises a dimension of size 1.
    sample = sample_tensors(spec, 2 if spec.batched else 1)
    try:
        converted = TS2EPConverter(module, sample).convert()
        dynamic_shapes = []
        for t in spec.inputs:
            dims: dict[int, Any] = {}
            for axis, size in enumerate(t.shape):
                if size == -1:
                    upper = spec.max_batch_size if axis == 0 else None
                    dims[axis] = torch.export.Dim(f"{t.name}_d{axis}", min=1, max=upper)
            dynamic_shapes.append(dims or None)
        return torch.export.export(
            converted.module(), sample, dynamic_shapes=tuple(dynamic_shapes), strict=False
        )
    except Exception as exc:
        raise ConversionError(f"TorchScript export failed: {_first_line(exc)}") from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__
