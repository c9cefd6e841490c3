"""The reference backend: the uploaded TorchScript, run as is.

On the CPU (target `any`, or a cpu target) it is always available. A `cuda-smXX` target runs it
on a GPU of that architecture: the baseline that GPU variants must beat, since what was uploaded
would run there too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from compiler.artifact import Artifact
from compiler.errors import BackendUnavailableError, InvalidModelError
from compiler.frontend import load_torchscript
from compiler.hardware import cuda_capability, cuda_devices, torch_cuda_device
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
    def __init__(self, module: torch.nn.Module, spec: InputSpec, device: torch.device | None = None) -> None:
        self.module = module
        self.spec = spec
        self.device = device  # a GPU the module lives on; None: the CPU

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        tensors = [torch.from_numpy(np.ascontiguousarray(inputs[n])) for n in self.spec.names]
        if self.device is not None:
            tensors = [t.to(self.device) for t in tensors]
        with torch.inference_mode():
            outputs = flatten_outputs(self.module(*tensors))
        return {
            name: host_array(name, t) for name, t in zip(output_names(len(outputs)), outputs, strict=True)
        }


def host_array(name: str, tensor: torch.Tensor) -> np.ndarray:
    try:
        return tensor.detach().contiguous().cpu().numpy()
    except TypeError:  # bfloat16 or a float8: numpy has no such dtype, so no answer can hold it
        raise InvalidModelError(
            f"output {name!r} has dtype {tensor.dtype}, which Kiln cannot serve: return it .float()"
        ) from None


class TorchScriptBackend:
    name = "torchscript"

    def version(self) -> str:
        return torch.__version__

    def unavailable_reason(self, target: str) -> str | None:
        if cuda_capability(target) is None:
            return None
        if not torch.version.cuda:
            return f"torchscript: unavailable for {target} (torch {torch.__version__} is a CPU build)"
        found = sorted({d.target for d in cuda_devices()})  # nvidia-smi: no CUDA context here
        if target not in found:
            return f"torchscript: unavailable for {target} (no {target} device on this host; it has {found})"
        return None

    def compile(self, model: bytes, spec: InputSpec, target: str, options: dict[str, Any]) -> Artifact:
        load_torchscript(model)
        return Artifact(self.name, target, spec, model)

    def load(self, artifact: Artifact) -> TorchScriptRunner:
        module = load_torchscript(artifact.payload)
        if cuda_capability(artifact.target) is None:
            return TorchScriptRunner(module, artifact.spec)
        device = torch_cuda_device(artifact.target)
        if device is None:
            raise BackendUnavailableError(f"torchscript: unavailable (CUDA sees no {artifact.target} device)")
        # fp32 on the GPU as on the CPU: it is verified at fp32 tolerances, and TF32 convolutions
        # (cuDNN's default) are about 1e-3 off.
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
        return TorchScriptRunner(module.to(device), artifact.spec, device)


backend = TorchScriptBackend()
