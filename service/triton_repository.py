"""A Triton model repository on disk, read as the loads that deploy it to Kiln.

Each model is a directory holding `config.pbtxt` (Triton's ModelConfig in protobuf text), its
versions as numbered directories with the model file (`1/model.pt`, or the config's
`default_model_filename`), and the label files its outputs name beside them. The versions Triton
would load (its version policy: by default the newest) each become one Triton load with the
configuration and files (service/api/triton_load.py), oldest first, so that the newest serves.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2 as config_pb

CONFIG = "config.pbtxt"
# Names, on a load's answer, the Kiln version its files became (Triton's answer is empty).
VERSION_HEADER = "Kiln-Model-Version"
# The PyTorch backend's file name when the configuration names none.
DEFAULT_FILENAME = "model.pt"
# Triton ignores a version directory not named by a number, or whose name starts with 0.
VERSION_DIR = re.compile(r"[1-9][0-9]*")
PLATFORMS = {"platform": "pytorch_libtorch", "backend": "pytorch"}


class RepositoryError(Exception):
    """A model directory that cannot be read as Triton would read it."""


def foreign_platform(config: Any) -> str | None:
    """Why Kiln cannot serve a configuration's platform or backend, if it cannot."""
    for key, platform in PLATFORMS.items():
        value = getattr(config, key)
        if value and value != platform:
            return f"{key} {value!r}; Kiln serves TorchScript (platform pytorch_libtorch, or backend pytorch)"
    return None


@dataclass(frozen=True)
class VersionLoad:
    """One version of a model: its directory's number in the Triton repository, and the files
    its load sends, by their `file:` path; they are read when its request is built."""

    model: str
    version: int
    config: str  # ModelConfig as JSON
    files: dict[str, Path]
    model_path: str  # which of the files is the model

    def contents(self) -> dict[str, bytes]:
        """Each file's content, by its `file:` path."""
        return {path: read(file) for path, file in self.files.items()}

    def request(self) -> dict[str, Any]:
        """The HTTP load request, each file's content in base64."""
        files = {path: base64.b64encode(content).decode() for path, content in self.contents().items()}
        return {"parameters": {"config": self.config, **files}}


def model_dirs(repository: Path) -> tuple[list[Path], list[Path]]:
    """The repository's model directories, those holding a configuration (or that cannot be
    read: version_loads says why), and the others."""
    dirs = sorted(p for p in repository.iterdir() if p.is_dir() and not p.name.startswith("."))
    models = [p for p in dirs if _holds_config(p)]
    return models, [p for p in dirs if p not in models]


def _holds_config(model_dir: Path) -> bool:
    try:
        return (model_dir / CONFIG).is_file()
    except OSError:  # unreadable (EACCES): pathlib answers only "no such file" with False
        return True


def version_loads(model_dir: Path) -> list[VersionLoad]:
    """The loads of the versions Triton would load, oldest first."""
    try:
        config = text_format.Parse((model_dir / CONFIG).read_text(), config_pb.ModelConfig())
    except (OSError, UnicodeDecodeError, text_format.ParseError) as exc:
        raise RepositoryError(f"{model_dir / CONFIG}: {exc}") from None
    name = config.name or model_dir.name
    if name != model_dir.name:  # as Triton requires
        raise RepositoryError(
            f"{model_dir / CONFIG}: name {name!r} is not its directory's, {model_dir.name!r}"
        )
    foreign = foreign_platform(config)
    if foreign is not None:
        raise RepositoryError(f"{model_dir / CONFIG}: {foreign}")
    config.name = name
    try:
        found = {int(p.name): p for p in model_dir.iterdir() if p.is_dir() and VERSION_DIR.fullmatch(p.name)}
    except OSError as exc:
        raise RepositoryError(f"{model_dir}: {exc.strerror or exc}") from None
    versions = chosen(sorted(found), config.version_policy)
    if not versions:
        raise RepositoryError(
            f"{model_dir}: no version directory (1/, 2/, ...) that its version_policy loads"
        )
    labels = {}
    for output in config.output:
        if output.label_filename:
            if not _plain_name(output.label_filename):
                raise RepositoryError(
                    f"{model_dir / CONFIG}: label_filename {output.label_filename!r} must name a file "
                    "in the model's directory"
                )
            labels[f"file:{output.label_filename}"] = model_dir / output.label_filename
    filename = config.default_model_filename or DEFAULT_FILENAME
    if not _plain_name(filename):
        raise RepositoryError(
            f"{model_dir / CONFIG}: default_model_filename {filename!r} must name a file in each "
            "version's directory"
        )
    config.ClearField("version_policy")  # applied here, by the versions chosen
    text = json_format.MessageToJson(config, preserving_proto_field_name=True)
    loads = []
    for version in versions:
        key = f"file:{version}/{filename}"
        loads.append(VersionLoad(name, version, text, {key: found[version] / filename, **labels}, key))
    return loads


def _plain_name(name: str) -> bool:
    """A file's name alone, in its directory: no folder, not the directory itself or its parent."""
    return Path(name).name == name and name not in (".", "..")


def chosen(versions: list[int], policy: Any) -> list[int]:
    """The versions a Triton version policy loads: the newest n (1 by default), all, or some."""
    if policy.HasField("all"):
        return versions
    if policy.HasField("specific"):
        return [v for v in versions if v in set(policy.specific.versions)]
    return versions[-(policy.latest.num_versions or 1) :]


def read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise RepositoryError(f"{path}: {exc.strerror or exc}") from None
