"""Artifacts: the bytes a backend produced plus JSON metadata, packed as one zip file."""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from dataclasses import dataclass, field
from typing import Any

from compiler.errors import CompilerError
from compiler.spec import InputSpec

FORMAT_VERSION = 1


@dataclass
class Artifact:
    backend: str
    target: str
    spec: InputSpec
    payload: bytes
    meta: dict[str, Any] = field(default_factory=dict)

    def pack(self) -> bytes:
        header = {
            "format": FORMAT_VERSION,
            "backend": self.backend,
            "target": self.target,
            "spec": self.spec.to_dict(),
            "meta": self.meta,
        }
        buf = io.BytesIO()
        # Payloads are compiled code and weights: they barely compress, so store them as is.
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
            zf.writestr("kiln.json", json.dumps(header, sort_keys=True))
            zf.writestr("payload", self.payload)
        return buf.getvalue()

    @classmethod
    def unpack(cls, data: bytes) -> Artifact:
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as zf:
                header = json.loads(zf.read("kiln.json"))
                payload = zf.read("payload")
        except (zipfile.BadZipFile, KeyError, json.JSONDecodeError) as exc:
            raise CompilerError(f"not a Kiln artifact: {exc}") from exc
        if header.get("format") != FORMAT_VERSION:
            raise CompilerError(f"unsupported artifact format {header.get('format')!r}")
        spec = InputSpec.from_dicts(header["spec"]["inputs"], header["spec"]["max_batch_size"])
        return cls(header["backend"], header["target"], spec, payload, header["meta"])


def artifact_key(
    model_sha256: str,
    backend: str,
    backend_version: str,
    target: str,
    spec: InputSpec,
    options: dict[str, Any],
) -> str:
    """Content address of a compile: identical work maps to one key anywhere in the cluster."""
    doc = {
        "model": model_sha256,
        "backend": backend,
        "backend_version": backend_version,
        "target": target,
        "spec": spec.to_dict(),
        "options": options,
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()
