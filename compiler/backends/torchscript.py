"""The reference backend: the uploaded TorchScript, run as is. Always available."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from compiler.artifact import Artifact
from compiler.errors import InvalidModelError
from compiler.frontend import load_torchscript
from compiler.runner import output_names
from compiler.spec import InputSpec


def flatten_outputs(value: Any) -> list[torch.Tensor]:
    """A model may return a tensor or a (nested) tuple/list of tensors; flatten in order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, list | tuple):
        return [t for item in value for t in flatten_outputs(item)]
    raise InvalidModelError(f"model outputs must be tensors or tuples of tensors; got {type(value).__name__}")


class TorchScriptRunner:
    backend = "torchscript"

    # Any nn.Module runs the same way; benchmarks/compilers.py times eager PyTorch with it.
    def __init__(self, module: torch.nn.Module, spec: InputSpec) -> None:
        self.module = module
        self.spec = spec

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        tensors = [torch.from_numpy(np.ascontiguousarray(inputs[n])) for n in self.spec.names]
        with torch.inference_mode():
            outputs = flatten_outputs(self.module(*tensors))
        return {
            name: t.detach().contiguous().numpy()
            for name, t in zip(output_names(len(outputs)), outputs, strict=True)
        }


class TorchScriptBackend:
    name = "torchscript"

    def version(self) -> str:
        return torch.__version__

    def unavailable_reason(self, target: str) -> str | None:
        return None

    def compile(self, model: bytes, spec: InputSpec, target: str, options: dict[str, Any]) -> Artifact:
        load_torchscript(model)
        return Artifact(self.name, target, spec, model)

    def load(self, artifact: Artifact) -> TorchScriptRunner:
        return TorchScriptRunner(load_torchscript(artifact.payload), artifact.spec)


backend = TorchScriptBackend()
