"""Backend registry. Modules are imported lazily: TVM alone takes seconds to import."""

from __future__ import annotations

import importlib

from compiler.backends.base import Backend
from compiler.errors import BackendUnavailableError

# name -> module holding a module-level `backend` object.
REGISTRY: dict[str, str] = {
    "torchscript": "compiler.backends.torchscript",
    "tvm": "compiler.backends.tvm",
    "onnxruntime": "compiler.backends.onnxruntime",
    "inductor": "compiler.backends.inductor",
}

REFERENCE = "torchscript"


def get_backend(name: str) -> Backend:
    module_name = REGISTRY.get(name)
    if module_name is None:
        raise BackendUnavailableError(f"unknown backend {name!r}; known: {sorted(REGISTRY)}")
    backend: Backend = importlib.import_module(module_name).backend
    return backend
