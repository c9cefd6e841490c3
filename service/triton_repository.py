"""A Triton model repository on disk, read as the loads that deploy it to Kiln.

Each model is a directory holding `config.pbtxt` (Triton's ModelConfig in protobuf text), its
versions as numbered directories with the model file (`1/model.pt`, or the config's
`default_model_filename`), and the label files its outputs name beside them. Each version becomes
one Triton load with the configuration and files (service/api/triton_load.py), oldest first, so
that the newest serves.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2 as config_pb

CONFIG = "config.pbtxt"
# The PyTorch backend's file name when the configuration names none.
DEFAULT_FILENAME = "model.pt"


class RepositoryError(Exception):
    """A model directory that cannot be read as Triton would read it."""


@dataclass(frozen=True)
class VersionLoad:
    """One version of a model: its directory's number in the Triton repository, and the files
    its load sends, by their `file:` path; they are read when its body is built."""

    model: str
    version: int
    config: str  # ModelConfig as JSON
    files: dict[str, Path]

    def body(self) -> dict[str, Any]:
        """The HTTP load request, each file's content in base64."""
        files = {path: read(file) for path, file in self.files.items()}
        return {"parameters": {"config": self.config, **files}}


def model_dirs(repository: Path) -> list[Path]:
    """The repository's model directories: those holding a configuration."""
    return sorted(p for p in repository.iterdir() if (p / CONFIG).is_file())


def version_loads(model_dir: Path) -> list[VersionLoad]:
    try:
        config = text_format.Parse((model_dir / CONFIG).read_text(), config_pb.ModelConfig())
    except (OSError, UnicodeDecodeError, text_format.ParseError) as exc:
        raise RepositoryError(f"{model_dir / CONFIG}: {exc}") from None
    name = config.name or model_dir.name
    if name != model_dir.name:  # as Triton requires
        raise RepositoryError(
            f"{model_dir / CONFIG}: name {name!r} is not its directory's, {model_dir.name!r}"
        )
    config.name = name
    versions = sorted(int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit())
    if not versions:
        raise RepositoryError(f"{model_dir}: no version directory (1/, 2/, ...)")
    labels = {
        f"file:{o.label_filename}": model_dir / o.label_filename for o in config.output if o.label_filename
    }
    filename = config.default_model_filename or DEFAULT_FILENAME
    text = json_format.MessageToJson(config, preserving_proto_field_name=True)
    return [
        VersionLoad(name, v, text, {f"file:{v}/{filename}": model_dir / str(v) / filename, **labels})
        for v in versions
    ]


def read(path: Path) -> str:
    try:
        return base64.b64encode(path.read_bytes()).decode()
    except OSError as exc:
        raise RepositoryError(f"{path}: {exc.strerror or exc}") from None
