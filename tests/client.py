"""A thin test client over httpx for Kiln's /v1 API."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from tests.models import TestModel

SETTLED = {"ready", "failed", "rejected"}
# Metric samples by name: each sample's labels and value.
Samples = dict[str, list[tuple[dict[str, str], float]]]


def upload(http: httpx.Client, model: TestModel, name: str | None = None, **config: Any) -> httpx.Response:
    body = model.config(**config)
    if name is not None:
        body["name"] = name
    return http.post(
        "/v1/models", files={"file": ("model.pt", model.torchscript())}, data={"config": json.dumps(body)}
    )


def wait_settled(http: httpx.Client, name: str, version: int, timeout: float = 300) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        response = http.get(f"/v1/models/{name}/versions/{version}")
        response.raise_for_status()
        variants: list[dict[str, Any]] = response.json()["variants"]
        if all(v["status"] in SETTLED for v in variants):
            return variants
        time.sleep(0.5)
    raise TimeoutError(f"{name} v{version} did not settle in {timeout}s: {variants}")


def by_backend(variants: list[dict[str, Any]], backend: str) -> dict[str, Any]:
    return next(v for v in variants if v["backend"] == backend)


def sample(model: TestModel, batch: int, seed: int = 1) -> np.ndarray:
    shape = [batch if d == -1 else d for d in model.inputs[0]["shape"]]  # type: ignore[union-attr]
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def expected(model: TestModel, x: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        out: torch.Tensor = model.module()(torch.from_numpy(x))
    return out.numpy()


def infer_body(x: np.ndarray, **extra: object) -> dict[str, object]:
    """A v2 JSON infer request for a single-input model's `x`."""
    tensor = {"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.tolist()}
    return {"inputs": [tensor], **extra}


def binary_infer(x: np.ndarray, **extra: object) -> dict[str, Any]:
    """httpx's arguments for a v2 infer of a single-input model's float32 `x` as binary data."""
    tensor = {
        "name": "x",
        "shape": list(x.shape),
        "datatype": "FP32",
        "parameters": {"binary_data_size": x.nbytes},
    }
    header = json.dumps({"inputs": [tensor], **extra}).encode()
    return {"content": header + x.tobytes(), "headers": {"Inference-Header-Content-Length": str(len(header))}}


def predict(
    http: httpx.Client, name: str, x: np.ndarray, backend: str | None = None, version: int | None = None
) -> httpx.Response:
    path = f"/v1/models/{name}" + (f"/versions/{version}" if version else "") + "/predict"
    params = {"backend": backend} if backend else {}
    return http.post(path, json={"inputs": {"x": x.tolist()}}, params=params)


def scrape(http: httpx.Client) -> Samples:
    response = http.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples: Samples = {}
    for family in text_string_to_metric_families(response.text):
        samples.setdefault(family.name, [])
        for s in family.samples:
            samples.setdefault(s.name, []).append((s.labels, s.value))
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return sum(v for lab, v in samples.get(name, []) if labels.items() <= lab.items())


def check_classes(got: np.ndarray, values: np.ndarray, count: int, labels: Sequence[str] = ()) -> None:
    """`got` is the classification extension's answer for `values`, [batch, classes]: each item's
    top `count` as "<value>:<index>[:<label>]", highest first, a label for indices that have one."""
    k = min(count, values.shape[1])
    assert got.shape == (len(values), k), got.shape
    for row, item in zip(got, values, strict=True):
        top = np.argsort(-item, kind="stable")[:k]
        for text, index in zip(row, top, strict=True):
            value, found, *label = (text.decode() if isinstance(text, bytes) else text).split(":", 2)
            assert int(found) == index, (row, top)
            assert float(value) == pytest.approx(float(item[index]), abs=1e-5)
            assert label == ([labels[index]] if index < len(labels) else []), text
