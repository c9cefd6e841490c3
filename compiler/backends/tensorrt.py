"""The TensorRT backend: TorchScript -> ExportedProgram -> Torch-TensorRT engines for one GPU architecture.

The artifact is the compiled ExportedProgram as `torch.export.save` writes it; the engines ride
inside it. torch_tensorrt is imported inside the methods, so that a CPU host (where it must never
be installed) still gets a readable `unavailable_reason` instead of an ImportError.

Options: `precision` is "fp32" (the default; TF32 off, so results match TorchScript's tolerance)
or "fp16" (Torch-TensorRT autocast: lower precision where it is numerically safe, FP32 elsewhere);
`opt_batch_size` is the batch TensorRT tunes its kernels for (default: half the largest batch).
"""

from __future__ import annotations

import importlib.metadata
import io
import os
import re
import tempfile
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from compiler.artifact import Artifact
from compiler.backends import option_problems
from compiler.backends.base import export_for
from compiler.backends.torchscript import flatten_outputs
from compiler.errors import BackendUnavailableError, ConversionError
from compiler.hardware import cuda_devices, torch_cuda_device
from compiler.runner import output_names
from compiler.spec import DTYPES, InputSpec

_TARGET_RE = re.compile(r"^cuda-sm\d+$")


class TensorRTRunner:
    backend = "tensorrt"

    def __init__(self, module: Any, spec: InputSpec, device: torch.device, output_dtypes: list[str]) -> None:
        self._module = module
        self.spec = spec
        self.device = device
        # An fp16 engine may hand back fp16; callers get the dtypes the model itself returns.
        self._dtypes = [getattr(torch, d) for d in output_dtypes]
        # One TensorRT execution context must not run two calls at once.
        self._lock = threading.Lock()

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        tensors = [torch.from_numpy(np.ascontiguousarray(inputs[n])).to(self.device) for n in self.spec.names]
        with self._lock, torch.inference_mode():
            outputs = flatten_outputs(self._module(*tensors))
            # .cpu() waits for the GPU, so the lock covers the whole call.
            arrays = [t.to(dtype).cpu().numpy() for t, dtype in zip(outputs, self._dtypes, strict=True)]
        return dict(zip(output_names(len(arrays)), arrays, strict=True))


class TensorRTBackend:
    name = "tensorrt"

    def version(self) -> str:
        try:
            return f"torch-tensorrt-{importlib.metadata.version('torch-tensorrt')}"
        except importlib.metadata.PackageNotFoundError:
            return "torch-tensorrt-not-installed"

    def unavailable_reason(self, target: str) -> str | None:
        devices = cuda_devices()
        if not devices:
            return "tensorrt: unavailable (no CUDA device)"
        if not _TARGET_RE.match(target):
            return f"tensorrt: unavailable (targets only cuda-smXX; got {target!r})"
        if not any(d.target == target for d in devices):
            found = sorted({d.target for d in devices})
            return f"tensorrt: unavailable (no {target} device on this host; it has {found})"
        if not torch.version.cuda:
            return f"tensorrt: unavailable (torch {torch.__version__} is a CPU build)"
        try:
            import torch_tensorrt  # noqa: F401
        except ModuleNotFoundError:
            return "tensorrt: unavailable (torch_tensorrt is not installed)"
        except Exception as exc:  # a broken install (TensorRT libraries) raises more than ImportError
            return f"tensorrt: unavailable (cannot import torch_tensorrt: {_first_line(exc)})"
        return None

    def compile(self, model: bytes, spec: InputSpec, target: str, options: dict[str, Any]) -> Artifact:
        precision, opt_batch = _check_options(options, spec)
        program = export_for(self, model, spec, self.unavailable_reason(target))
        import torch_tensorrt
        from torch.export.passes import move_to_device_pass

        device = _device(target)
        output_dtypes = _output_dtypes(program)
        # Parameters and any tensors the graph creates must live where the engines run.
        program = move_to_device_pass(program, device)
        with tempfile.TemporaryDirectory(prefix="kiln-tensorrt-") as tmp:
            path = os.path.join(tmp, "model.ep")
            try:
                compiled = torch_tensorrt.dynamo.compile(
                    program,
                    arg_inputs=_trt_inputs(torch_tensorrt, spec, opt_batch),
                    device=device,
                    use_explicit_typing=True,
                    # fp32 means FP32: TF32 matmuls would miss TorchScript's default tolerance.
                    disable_tf32=precision == "fp32",
                    **_precision_settings(precision),
                )
                torch_tensorrt.save(
                    compiled,
                    path,
                    output_format="exported_program",
                    arg_inputs=_examples(spec, device),
                    dynamic_shapes=_dynamic_shapes(spec),
                    retrace=True,
                )
            except Exception as exc:  # TensorRT raises many types, with long builder logs
                raise ConversionError(f"tensorrt: {_first_line(exc)}") from exc
            with open(path, "rb") as f:
                payload = f.read()
        meta = {
            "num_outputs": len(output_dtypes),
            "output_dtypes": output_dtypes,
            "precision": precision,
            "opt_batch_size": opt_batch,
            "torch_tensorrt_version": self.version(),
        }
        return Artifact(self.name, target, spec, payload, meta)

    def load(self, artifact: Artifact) -> TensorRTRunner:
        reason = self.unavailable_reason(artifact.target)
        if reason is not None:
            raise BackendUnavailableError(reason)
        # Importing it registers the tensorrt::execute_engine op the saved graph calls.
        import torch_tensorrt  # noqa: F401

        program = torch.export.load(io.BytesIO(artifact.payload))
        return TensorRTRunner(
            program.module(), artifact.spec, _device(artifact.target), list(artifact.meta["output_dtypes"])
        )


def _check_options(options: Mapping[str, Any], spec: InputSpec) -> tuple[str, int]:
    top = spec.largest_batch
    # `threads` is what the pipeline gives every backend; TensorRT has no use for it.
    problems = option_problems("tensorrt", {k: v for k, v in options.items() if k != "threads"}, top)
    if problems:
        raise ConversionError("; ".join(problems))
    precision = options.get("precision", "fp32")
    opt_batch = options.get("opt_batch_size", max(1, top // 2))
    for t in spec.inputs:
        if -1 in t.shape[1:]:
            raise ConversionError(
                f"tensorrt: input {t.name!r} has a dynamic dimension other than the batch; "
                f"TensorRT needs bounds for it, so give it a fixed size ({t})"
            )
    return precision, opt_batch


def _precision_settings(precision: str) -> dict[str, Any]:
    """Under explicit typing TensorRT runs each layer in its graph dtype, so `enabled_precisions`
    no longer lowers anything; Torch-TensorRT's autocast rewrites the graph to fp16 instead,
    keeping numerically sensitive layers in fp32."""
    if precision == "fp16":
        return {"enable_autocast": True, "autocast_low_precision_type": torch.float16}
    return {}


def _device(target: str) -> torch.device:
    device: torch.device | None = torch_cuda_device(target)
    if device is None:
        raise BackendUnavailableError(f"tensorrt: unavailable (CUDA sees no {target} device)")
    return device


def _trt_inputs(torch_tensorrt: Any, spec: InputSpec, opt_batch: int) -> list[Any]:
    top = spec.max_batch_size
    inputs = []
    for t in spec.inputs:
        dtype = getattr(torch, DTYPES[t.dtype].name)
        if t.batched and top > 1:
            inputs.append(
                torch_tensorrt.Input(
                    min_shape=t.concrete_shape(1),
                    opt_shape=t.concrete_shape(opt_batch),
                    max_shape=t.concrete_shape(top),
                    dtype=dtype,
                    name=t.name,
                )
            )
        else:
            inputs.append(torch_tensorrt.Input(shape=t.concrete_shape(1), dtype=dtype, name=t.name))
    return inputs


def _examples(spec: InputSpec, device: torch.device) -> list[torch.Tensor]:
    """Example inputs for the re-export that saving does; batch 2, as export specialises 1."""
    batch = 2 if spec.batched and spec.max_batch_size > 1 else 1
    rng = np.random.default_rng(0)
    return [torch.from_numpy(a).to(device) for a in spec.random_inputs(batch, rng).values()]


def _dynamic_shapes(spec: InputSpec) -> tuple[dict[int, Any] | None, ...] | None:
    """One batch Dim shared by every input, as the frontend exported them."""
    if not (spec.batched and spec.max_batch_size > 1):
        return None
    batch = torch.export.Dim("batch", min=1, max=spec.max_batch_size)
    return tuple({0: batch} for _ in spec.inputs)


def _output_dtypes(program: Any) -> list[str]:
    user = set(program.graph_signature.user_outputs)
    outputs = next(n for n in program.graph.nodes if n.op == "output").args[0]
    return [
        str(n.meta["val"].dtype).removeprefix("torch.")
        for n in outputs
        if isinstance(n, torch.fx.Node) and n.name in user
    ]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


backend = TensorRTBackend()
