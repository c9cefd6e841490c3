"""Upload the test models to a running Kiln on a GPU host, wait, and compare every variant with eager.

    PYTHONPATH=. python scripts/gpu_report.py --url http://127.0.0.1:8000

Each model (the test models and a ResNet-18 at 224x224) is uploaded with TensorRT fp32, TensorRT
fp16 and TVM, for every target a live worker announced (or those --targets names), so TVM gets a
CPU row and a CUDA row (`tvm @ cuda-sm90`). Once all settle, this process
loads each artifact from the store Kiln uses (the same KILN_* environment), runs it on the same
inputs as the eager model on the GPU, and prints a table: the worker's latency, the latency
measured here, and the error against eager. Exit status 1 when a variant was rejected (failed
verification), a TensorRT or TVM variant for a GPU target is not ready, or a ready variant misses
its tolerance against eager here. Other failures (TensorRT on the CPU target) are listed with
their reasons. Each model is then asked through the API's v2 endpoint, once and by 32 concurrent
batch-1 requests, whose answers must match eager and merge into fewer batches. Last come the
speed goals at the largest batch, for ResNet-18 and the encoder: TensorRT fp16 at <= 0.3x
eager's latency, TVM untuned at <= 1.0x.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import sys
import time
from collections.abc import Mapping
from typing import Any

import httpx
import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from benchmarks.models import GPU_MODELS
from benchmarks.serving import HEADER_LENGTH, Target, v2_target
from compiler.artifact import Artifact
from compiler.backends import get_backend
from compiler.benchmark import time_runner
from compiler.runner import Runner
from compiler.spec import InputSpec
from service.records import ModelConfig
from service.registry import ARTIFACT_BLOB, Registry
from service.settings import Settings
from service.store import open_store
from tests.client import scrape, value
from tests.models import TestModel

BACKENDS: list[Any] = [
    {"name": "tensorrt", "options": {"precision": "fp32"}},
    {"name": "tensorrt", "options": {"precision": "fp16"}},
    "tvm",
]
# The backends this check is for: any of their variants on a GPU target that is not ready fails it.
REQUIRED = ("torchscript", "tensorrt", "tvm")
SETTLED = {"ready", "failed", "rejected"}
# Concurrent batch-1 requests per model, and the batching delay they are uploaded with.
CONCURRENT = 32
QUEUE_DELAY_US = 2000
# Latency goals on a GPU target at the largest batch, as a fraction of eager's: (model, variant, most).
GOALS = [(m, v, most) for m in ("resnet18", "encoder") for v, most in (("tensorrt fp16", 0.3), ("tvm", 1.0))]


class TorchRunner:
    """Eager or TorchScript on the GPU, behind the Runner protocol so both are timed alike."""

    def __init__(self, backend: str, module: Any, spec: InputSpec) -> None:
        self.backend = backend
        self.module = module.cuda().eval()
        self.spec = spec

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        tensors = [torch.from_numpy(inputs[n]).cuda() for n in self.spec.names]
        with torch.inference_mode():
            return {"output0": self.module(*tensors).cpu().numpy()}


def upload_all(http: httpx.Client, models: list[str], batch: int, targets: list[str]) -> dict[str, int]:
    versions = {}
    for name in models:
        model = GPU_MODELS[name]
        config = model.config(
            max_batch_size=batch, max_queue_delay_us=QUEUE_DELAY_US, backends=BACKENDS, targets=targets
        )
        response = http.post(
            "/v1/models",
            files={"file": ("model.pt", model.torchscript())},
            data={"config": json.dumps(config)},
        )
        response.raise_for_status()
        versions[name] = response.json()["version"]
    return versions


def wait_all(http: httpx.Client, versions: dict[str, int], timeout: float) -> dict[str, list[dict[str, Any]]]:
    """Each model whose variants all settled within `timeout` seconds, with its variants."""
    deadline = time.monotonic() + timeout
    settled: dict[str, list[dict[str, Any]]] = {}
    while len(settled) < len(versions) and time.monotonic() < deadline:
        for name, number in versions.items():
            variants = http.get(f"/v1/models/{name}/versions/{number}").json()["variants"]
            if all(v["status"] in SETTLED for v in variants):
                settled[name] = variants
        time.sleep(2)
    return settled


def label(variant: dict[str, Any]) -> str:
    precision = variant["options"].get("precision")
    return f"{variant['backend']} {precision}" if precision else variant["backend"]


def compare(
    runner: Runner, inputs: list[dict[str, np.ndarray]], wants: list[np.ndarray]
) -> tuple[float, float, float, list[np.ndarray]]:
    """(ms at batch 1, ms at the largest batch, max abs error against eager, outputs)."""
    outs = [runner.run(x)["output0"] for x in inputs]
    error = max(float(np.abs(o.astype(np.float64) - w).max()) for o, w in zip(outs, wants, strict=True))
    first, last = (time_runner(runner, x, warmup=5, iters=50, budget_s=3.0) for x in (inputs[0], inputs[-1]))
    return first, last, error, outs


def report(
    model: TestModel, variants: list[dict[str, Any]], registry: Registry, batch: int
) -> tuple[Table, list[str], dict[str, float]]:
    """The model's table, its problems, and ms at `batch` by row: `eager`, and each ready variant
    of a GPU target by its label."""
    config = ModelConfig.model_validate(model.config(max_batch_size=batch))
    spec = InputSpec.from_dicts(model.inputs, batch)
    rng = np.random.default_rng(0)
    inputs = [spec.random_inputs(b, rng) for b in (1, batch)]
    eager = TorchRunner("eager", model.module(), spec)
    wants = [eager.run(x)["output0"].astype(np.float64) for x in inputs]
    table = Table(
        "variant",
        "target",
        "status",
        "worker ms b1",
        "ms b1",
        f"ms b{batch}",
        "max |err| vs eager",
        "note",
        title=f"{model.name} (latency measured here on the GPU host; worker ms from Kiln)",
    )
    problems: list[str] = []
    largest: dict[str, float] = {}
    for backend in REQUIRED:
        if not any(v["backend"] == backend and v["target"].startswith("cuda-") for v in variants):
            problems.append(f"{model.name}: no {backend} variant for a GPU target was planned")
    scripted = TorchRunner("torchscript", torch.jit.load(io.BytesIO(model.torchscript())), spec)
    for local in (eager, scripted):
        first, last, error, _ = compare(local, inputs, wants)
        largest.setdefault(local.backend, last)
        table.add_row(
            local.backend, "this GPU", "local", "", f"{first:.3f}", f"{last:.3f}", f"{error:.2e}", ""
        )
    for v in variants:
        name = f"{label(v)} @ {v['target']}"
        worker_ms = f"{v['latency_ms']:.3f}" if v["latency_ms"] is not None else ""
        if v["status"] != "ready":
            table.add_row(label(v), v["target"], v["status"], worker_ms, "", "", "", v["error"] or "")
            if v["status"] == "rejected" or (v["backend"] in REQUIRED and v["target"].startswith("cuda-")):
                problems.append(f"{model.name}: {name} is {v['status']}: {v['error']}")
            continue
        # The API does not show artifact keys; the registry, on the same store, does.
        record = registry.get_variant(v["id"])
        if record is None or record.artifact_key is None:  # the uploaded TorchScript, on the CPU
            runner: Runner = get_backend("torchscript").load(
                Artifact("torchscript", "any", spec, model.torchscript())
            )
        else:
            packed = registry.store.get_blob(ARTIFACT_BLOB.format(key=record.artifact_key))
            runner = get_backend(v["backend"]).load(Artifact.unpack(packed))
        first, last, error, outs = compare(runner, inputs, wants)
        rtol, atol = config.tolerance(v["options"])
        fits = all(np.allclose(o, w, rtol=rtol, atol=atol) for o, w in zip(outs, wants, strict=True))
        note = "" if fits else f"misses rtol={rtol:g} atol={atol:g} against eager"
        if not fits:
            problems.append(f"{model.name}: {name} {note}")
        if v["target"].startswith("cuda-"):
            largest[label(v)] = last
        table.add_row(
            label(v), v["target"], "ready", worker_ms, f"{first:.3f}", f"{last:.3f}", f"{error:.2e}", note
        )
    return table, problems, largest


def served(http: httpx.Client, model: TestModel, variants: list[dict[str, Any]]) -> tuple[str, float, float]:
    """The variant the replica serves batch 1 with now, as `backend @ target`, and its tolerance."""
    active = http.get(f"/v1/models/{model.name}").json()["active"] or {}
    variant = next((v for v in variants if v["id"] == active.get("variant_id")), None)
    if variant is None:
        raise SystemExit(f"{model.name}: the API names no active variant ({active})")
    rtol, atol = ModelConfig.model_validate(model.config()).tolerance(variant["options"])
    return f"{label(variant)} @ {variant['target']}", rtol, atol


def check_served(
    http: httpx.Client, model: TestModel, variants: list[dict[str, Any]]
) -> tuple[str, list[str]]:
    """One batch-1 v2 inference through the API against eager on the GPU: which variant the
    replica served it with, and a problem if the answer misses that variant's tolerance."""
    spec = InputSpec.from_dicts(model.inputs, 1)
    x = spec.random_inputs(1, np.random.default_rng(1))["x"]
    want = TorchRunner("eager", model.module(), spec).run({"x": x})["output0"]
    body = {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
    response = http.post(f"/v2/models/{model.name}/infer", json=body)
    if response.status_code != 200:
        return "nothing", [f"{model.name}: v2 infer answered {response.status_code}: {response.text[:200]}"]
    got = np.asarray(response.json()["outputs"][0]["data"], dtype=np.float64).reshape(want.shape)
    name, rtol, atol = served(http, model, variants)
    error = float(np.abs(got - want).max())
    line = f"{model.name}: the API served b1 with {name}, max |err| vs eager {error:.2e}"
    fits = np.allclose(got, want, rtol=rtol, atol=atol)
    return line, [] if fits else [f"{model.name}: v2 infer by {name} misses rtol={rtol:g} atol={atol:g}"]


async def _post_all(targets: list[Target]) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=300) as client:
        return await asyncio.gather(*(client.post(t.url, content=t.body, headers=t.headers) for t in targets))


def check_batching(
    http: httpx.Client, model: TestModel, variants: list[dict[str, Any]]
) -> tuple[str, list[str]]:
    """CONCURRENT batch-1 requests at once (v2, binary tensors): each answer against eager on the
    GPU, and the batches the server ran them in (its kiln_batch_size histogram)."""
    spec = InputSpec.from_dicts(model.inputs, 1)
    rng = np.random.default_rng(2)
    xs = [spec.random_inputs(1, rng)["x"] for _ in range(CONCURRENT)]
    eager = TorchRunner("eager", model.module(), spec)
    wants = [eager.run({"x": x})["output0"] for x in xs]
    base = str(http.base_url).rstrip("/")
    targets = [v2_target(model.name, base, 0, model.name, x) for x in xs]
    before = scrape(http)
    started = time.perf_counter()
    responses = asyncio.run(_post_all(targets))
    seconds = time.perf_counter() - started
    after = scrape(http)
    runs, rows = (
        value(after, f"kiln_batch_size_{part}", model=model.name)
        - value(before, f"kiln_batch_size_{part}", model=model.name)
        for part in ("count", "sum")
    )
    name, rtol, atol = served(http, model, variants)
    problems = []
    for response, want in zip(responses, wants, strict=True):
        if response.status_code != 200:
            problems.append(f"{model.name}: a request got {response.status_code}: {response.text[:200]}")
            continue
        length = int(response.headers[HEADER_LENGTH])
        got = np.frombuffer(response.content, "<f4", offset=length).reshape(want.shape)
        if not np.allclose(got, want, rtol=rtol, atol=atol):
            problems.append(f"{model.name}: a batched answer misses rtol={rtol:g} atol={atol:g}")
    if runs >= CONCURRENT:
        problems.append(f"{model.name}: {CONCURRENT} concurrent requests ran in {runs:g} runs: none merged")
    rate = CONCURRENT / seconds
    line = (
        f"{model.name}: {CONCURRENT} concurrent b1 requests in {seconds:.3f} s ({rate:.0f} req/s),"
        f" {runs:g} runs of {rows / max(runs, 1):.1f} on average, now served by {name}"
    )
    return line, problems


def goal_lines(largest: dict[str, dict[str, float]], batch: int) -> list[str]:
    lines = []
    for model, variant, most in GOALS:
        if model not in largest:
            continue  # not asked for (--models)
        ms = largest[model]
        if variant not in ms:
            lines.append(f"{model} b{batch}: {variant} <= {most}x eager: not measured (no ready GPU variant)")
            continue
        ratio = ms[variant] / ms["eager"]
        verdict = "PASS" if ratio <= most else "FAIL"
        lines.append(
            f"{model} b{batch}: {variant} {ms[variant]:.3f} ms against eager {ms['eager']:.3f} ms,"
            f" {ratio:.2f}x (goal <= {most}x): {verdict}"
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--max-batch-size", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds for every variant to settle")
    known = ",".join(GPU_MODELS)
    parser.add_argument("--models", default=known, help="comma-separated: " + known)
    parser.add_argument("--targets", default="auto", help="comma-separated; auto: every live worker's")
    args = parser.parse_args()
    models = args.models.split(",")
    if unknown := set(models) - set(GPU_MODELS):
        parser.error(f"unknown models {sorted(unknown)}; known: {', '.join(GPU_MODELS)}")
    # Eager is the reference: TF32 would make it the least exact row of the table.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    console = Console(width=200)
    registry = Registry(open_store(Settings()))
    with httpx.Client(base_url=args.url, timeout=300) as http:
        versions = upload_all(http, models, args.max_batch_size, args.targets.split(","))
        console.print(f"uploaded {versions}; waiting for every variant to settle")
        settled = wait_all(http, versions, args.timeout)
        # A lent GPU host is short-lived: what settled is still reported.
        problems = [f"{name}: not settled after {args.timeout:g} s" for name in set(versions) - set(settled)]
        largest = {}
        for name, variants in settled.items():
            table, found, largest[name] = report(GPU_MODELS[name], variants, registry, args.max_batch_size)
            console.print(table)
            for check in (check_served, check_batching):
                line, wrong = check(http, GPU_MODELS[name], variants)
                console.print(line)
                problems += wrong
            problems += found
    for line in goal_lines(largest, args.max_batch_size):
        console.print(line)
    for problem in problems:
        console.print(f"[red]FAIL[/red] {problem}")
    console.print("[green]all variants verified[/green]" if not problems else f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
