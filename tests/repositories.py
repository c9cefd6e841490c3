"""Triton model repositories on disk, as the tests of `kiln import-triton` and of a repository
deployed at startup lay them out."""

from __future__ import annotations

import io
from pathlib import Path

import torch

from tests import models

# An MLP's configuration: labels, batching, two instances, TorchScript alone, every version.
CONFIG_PBTXT = """
platform: "pytorch_libtorch"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 64 ] } ]
output [ { name: "output0" data_type: TYPE_FP32 dims: [ 10 ] label_filename: "labels.txt" } ]
dynamic_batching { max_queue_delay_microseconds: 500 }
instance_group [ { count: 2 kind: KIND_CPU } ]
parameters { key: "backends" value: { string_value: "[]" } }
version_policy: { all { } }
"""


def scripted(seed: int) -> bytes:
    """Another MLP's TorchScript: its weights drawn from `seed`."""
    torch.manual_seed(seed)
    buf = io.BytesIO()
    torch.jit.save(torch.jit.script(models.MLP().eval()), buf)
    return buf.getvalue()


def model_dir(
    repo: Path, name: str, config: str, versions: dict[str, bytes], filename: str = "model.pt"
) -> Path:
    for version, data in versions.items():
        (repo / name / version).mkdir(parents=True)
        (repo / name / version / filename).write_bytes(data)
    (repo / name).mkdir(parents=True, exist_ok=True)
    (repo / name / "config.pbtxt").write_text(config)
    return repo / name
