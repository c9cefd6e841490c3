"""The AOTInductor backend: TorchScript -> ExportedProgram -> a .pt2 package of C++ kernels and weights.

Threads: Inductor bakes its own kernels' OpenMP thread count in at compile time (it would read
torch.get_num_threads() then), so compile pins it to the `threads` option, which is part of the
artifact key. The ATen kernels it calls out to (GEMMs) follow the process-wide torch setting, which
compiler.threads.set_threads owns, exactly as the TorchScript runner does. load() and run() never
call torch.set_num_threads: the API process serves many runners at once, and a runner changing
the global setting would change every other runner's speed behind the server's back.
"""

from __future__ import annotations

import io
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from compiler.artifact import Artifact
from compiler.backends import family_reason
from compiler.backends.base import export_for, threads_of
from compiler.backends.hazards import lifted_constants, refuse_trapping_divisions
from compiler.backends.torchscript import flatten_outputs
from compiler.dims import dims_meta
from compiler.errors import ConversionError
from compiler.runner import output_names
from compiler.spec import InputSpec


class InductorRunner:
    backend = "inductor"

    def __init__(self, model: Any, spec: InputSpec) -> None:
        # The AOTI container hands each call its own model instance (waiting for a free one), so
        # concurrent calls from the batcher's threads are safe without a lock here.
        self._model = model
        self.spec = spec

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        tensors = [torch.from_numpy(np.ascontiguousarray(inputs[n])) for n in self.spec.names]
        with torch.inference_mode():
            outputs = flatten_outputs(self._model(*tensors))
        return {
            name: t.contiguous().numpy() for name, t in zip(output_names(len(outputs)), outputs, strict=True)
        }


class InductorBackend:
    name = "inductor"

    def version(self) -> str:
        return f"torch-{torch.__version__}"

    def unavailable_reason(self, target: str) -> str | None:
        if (family := family_reason(self.name, target)) is not None:
            return family
        # Inductor's own default compiler; it builds the kernels and links the package's library.
        if shutil.which(os.environ.get("CXX", "g++")) is None:
            return "inductor: no C++ compiler (g++, or $CXX) on PATH"
        return None

    def compile(self, model: bytes, spec: InputSpec, target: str, options: dict[str, Any]) -> Artifact:
        program = export_for(self, model, spec, self.unavailable_reason(target))
        refuse_trapping_divisions(self.name, program.graph, lifted_constants(program))
        threads = threads_of(options)
        with tempfile.TemporaryDirectory(prefix="kiln-inductor-") as tmp:
            path = os.path.join(tmp, "model.pt2")
            try:
                torch._inductor.aoti_compile_and_package(
                    program, package_path=path, inductor_configs={"cpp.threads": threads}
                )
            except Exception as exc:  # Inductor raises many types, with generated code and g++ logs
                raise ConversionError(f"inductor: {_first_line(exc)}") from exc
            payload = Path(path).read_bytes()
        return Artifact(self.name, target, spec, payload, {"threads": threads, **dims_meta(program, spec)})

    def load(self, artifact: Artifact) -> InductorRunner:
        # From a buffer, torch writes a temporary .pt2 for the C++ loader and deletes it at once;
        # the loader extracts the library to a temporary directory that it removes once freed.
        model = torch._inductor.aoti_load_package(io.BytesIO(artifact.payload))
        return InductorRunner(model, artifact.spec)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


backend = InductorBackend()
