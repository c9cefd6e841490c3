"""A minimal TorchServe handler for benchmarks/serving.py; it runs in the TorchServe venv.

Each request body is raw little-endian float32 bytes of one or more samples; each answer is the
model's output rows as raw little-endian float32 bytes. TorchServe batches requests into `data`
(batchSize / maxBatchDelay from the registration): they run as one forward pass. It needs only
torch: bench.json, packed beside the model, gives the sample shape and the intra-op threads.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
from typing import Any

import torch

_model: torch.jit.ScriptModule | None = None
_shape: list[int] = []


def _initialize(context: Any) -> None:
    global _model, _shape
    assert sys.byteorder == "little", "the payload is little-endian float32"
    model_dir = context.system_properties["model_dir"]
    with open(os.path.join(model_dir, "bench.json")) as f:
        config = json.load(f)
    _shape = list(config["sample_shape"])
    torch.set_num_threads(int(config["threads"]))
    serialized = context.manifest["model"]["serializedFile"]
    _model = torch.jit.load(os.path.join(model_dir, serialized), map_location="cpu").eval()


def _tensor(row: dict[str, Any]) -> torch.Tensor:
    body = row.get("data") or row.get("body")
    if not isinstance(body, bytes | bytearray):
        raise ValueError("send the tensor as raw float32 bytes (application/octet-stream)")
    buffer = body if isinstance(body, bytearray) else bytearray(body)  # frombuffer wants it writable
    return torch.frombuffer(buffer, dtype=torch.float32).reshape(-1, *_shape)


def handle(data: list[dict[str, Any]] | None, context: Any) -> list[bytes] | None:
    """TorchServe's function entry point; it is first called with data=None to initialize."""
    if data is None:
        _initialize(context)
        return None
    assert _model is not None
    inputs = [_tensor(row) for row in data]
    with torch.inference_mode():
        output = _model(torch.cat(inputs)).contiguous()
    answers, start = [], 0
    for x in inputs:
        part = output[start : start + x.shape[0]].contiguous()
        answers.append(ctypes.string_at(part.data_ptr(), part.numel() * part.element_size()))
        start += x.shape[0]
    return answers
