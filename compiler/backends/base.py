"""The one protocol every backend implements. Adding a backend = one file + one registry entry."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from compiler.artifact import Artifact
from compiler.errors import BackendUnavailableError, ConversionError
from compiler.frontend import export_program, load_torchscript
from compiler.runner import Runner
from compiler.spec import InputSpec
from compiler.threads import available_cpus


class Backend(Protocol):
    name: str

    def version(self) -> str:
        """Version of the underlying toolchain; part of the artifact key."""
        ...

    def unavailable_reason(self, target: str) -> str | None:
        """None when this backend can compile for and run on `target` here, else why not."""
        ...

    def compile(self, model: bytes, spec: InputSpec, target: str, options: dict[str, Any]) -> Artifact:
        """Compile TorchScript bytes for `target`. Raises ConversionError with a readable reason."""
        ...

    def load(self, artifact: Artifact) -> Runner:
        """Load an artifact produced by `compile` into a Runner."""
        ...


def export_for(backend: Backend, model: bytes, spec: InputSpec, reason: str | None) -> Any:
    """What every exporting backend's compile starts with: refuse with `reason`, why it cannot
    build for the target (usually its `unavailable_reason`), then TorchScript -> ExportedProgram,
    with failures named after the backend."""
    if reason is not None:
        raise BackendUnavailableError(reason)
    try:
        return export_program(load_torchscript(model), spec)
    except ConversionError as exc:
        raise ConversionError(f"{backend.name}: {exc}") from exc


def threads_of(options: Mapping[str, Any]) -> int:
    """The intra-op threads a compile builds for: its `threads` option (the server's
    KILN_THREADS), else every CPU it may use."""
    return int(options.get("threads") or available_cpus())
