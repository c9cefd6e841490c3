"""Serving benchmark: Kiln's v2 binary infer against a bare FastAPI endpoint, itself without
dynamic batching, and TorchServe 0.12, each ratio measured in the same run.

Every server runs on 127.0.0.1 as a subprocess with the same number of processes (`--workers`)
and intra-op threads per process (`--threads`); wrk, a closed loop of N connections, loads each in
turn: a Python client would take as much CPU as the server it measures, and on a small machine
that taxes the fastest server most.
Targets are measured in interleaved rounds (A B C, A B C, ...) so that a noisy neighbour on the
machine hits all of them alike; benchmarks/README.md says more.
Run: .venv/bin/python benchmarks/serving.py [--help]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import numpy as np
import psutil
import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bare_app import BareServer
from benchmarks.models import MLP64, RESNET18, BenchModel
from benchmarks.torchserve.server import TorchServe, setup_venv, unavailable_reason
from service.records import BackendRequest, default_tolerance
from tests.servers import KilnServer, unwind_on_signals, wait_until

HEADER_LENGTH = "Inference-Header-Content-Length"
REQUEST_TIMEOUT_S = 60
console = Console(width=200)  # wide tables, also when piped to a file


# Load generator ----------------------------------------------------------------------------

WRK_SCRIPT = Path(__file__).resolve().parent / "wrk" / "load.lua"
# The latency quantiles (percent) that load.lua prints, in its order.
QUANTILES = np.array([*(t / 10 for t in range(0, 990, 5)), *(t / 10 for t in range(990, 1000)), 100.0])


@dataclass(frozen=True)
class Target:
    label: str
    url: str
    body: bytes
    headers: dict[str, str]
    v2: bool  # a v2 binary answer (JSON header + raw bytes); otherwise raw float32 bytes
    pid: int  # the server's root process: its CPU time, children included, is measured


@dataclass
class Sample:
    runs: list[tuple[int, np.ndarray]] = field(default_factory=list)  # (requests, quantiles in s)
    errors: int = 0
    seconds: float = 0.0
    cpu_s: float = 0.0  # the server's CPU time (user + system) over the measured runs

    def add(self, other: Sample) -> None:
        self.runs += other.runs
        self.errors += other.errors
        self.seconds += other.seconds
        self.cpu_s += other.cpu_s

    @property
    def requests(self) -> int:
        return sum(n for n, _ in self.runs)

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    @property
    def cpu_ms_per_request(self) -> float:
        return self.cpu_s * 1000 / self.requests if self.requests else float("nan")

    def ms(self, q: float) -> float:
        """A percentile of all runs pooled: each run's quantiles stand for its requests."""
        pooled = [np.interp((np.arange(n) + 0.5) / n * 100, QUANTILES, qs) for n, qs in self.runs if n]
        return float(np.percentile(np.concatenate(pooled), q)) * 1000 if pooled else float("nan")


def wrk(target: Target, concurrency: int, seconds: int, cap: int) -> dict[str, Any]:
    """One wrk run of whole seconds; its summary as load.lua prints it."""
    with tempfile.NamedTemporaryFile(prefix="kiln-body-") as body:
        body.write(target.body)
        body.flush()
        headers = [part for pair in target.headers.items() for part in pair]
        command = [
            *("wrk", "-t1", f"-c{concurrency}", f"-d{seconds}s", f"--timeout={REQUEST_TIMEOUT_S}s"),
            *("-s", str(WRK_SCRIPT), target.url, "--", body.name, str(cap), *headers),
        ]
        limit = seconds + REQUEST_TIMEOUT_S + 30
        done = subprocess.run(command, capture_output=True, text=True, timeout=limit)
    line = next((x for x in done.stdout.splitlines() if x.startswith("KILN_WRK ")), None)
    if done.returncode or line is None:
        raise RuntimeError(f"wrk failed ({done.returncode}): {done.stdout[-500:]} {done.stderr[-500:]}")
    summary: dict[str, Any] = json.loads(line.removeprefix("KILN_WRK "))
    return summary


def measure(target: Target, concurrency: int, warmup_s: int, seconds: int, cap: int) -> Sample:
    """A warm-up run, then `seconds` measured, with at most `cap` requests in each."""
    if urlsplit(target.url).hostname != "127.0.0.1":
        raise ValueError(f"only 127.0.0.1 is ever loaded; refusing {target.url}")
    wrk(target, concurrency, warmup_s, cap)
    before = tree_cpu_s(target.pid)
    summary = wrk(target, concurrency, seconds, cap)
    cpu_s = tree_cpu_s(target.pid) - before
    quantiles = np.array(summary["quantiles_us"], dtype=float) / 1e6
    return Sample([(summary["requests"], quantiles)], summary["errors"], summary["duration_us"] / 1e6, cpu_s)


def tree_cpu_s(pid: int) -> float:
    """CPU seconds used so far by a process and all its children (TorchServe: JVM + workers)."""
    root = psutil.Process(pid)
    total = 0.0
    for proc in [root, *root.children(recursive=True)]:
        try:
            times = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def run_rounds(
    targets: list[Target], concurrency: int, warmup_s: int, seconds: float, rounds: int, max_requests: int
) -> dict[str, Sample]:
    """Each target gets `seconds` in all (rounded to whole seconds per round, as wrk counts),
    split over `rounds` interleaved rounds."""
    per_round = max(1, round(seconds / rounds))
    results = {t.label: Sample() for t in targets}
    for r in range(rounds):
        for t in targets:
            console.log(f"round {r + 1}/{rounds}: {t.label}, concurrency {concurrency}", style="dim")
            results[t.label].add(measure(t, concurrency, warmup_s, per_round, max_requests))
    return results


# Payloads ----------------------------------------------------------------------------------


def v2_target(label: str, base: str, pid: int, model: str, x: np.ndarray) -> Target:
    raw = x.astype("<f4").tobytes()
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "datatype": "FP32",
                    "shape": list(x.shape),
                    "parameters": {"binary_data_size": len(raw)},
                }
            ],
            "parameters": {"binary_data_output": True},
        },
        separators=(",", ":"),
    ).encode()
    headers = {"Content-Type": "application/octet-stream", HEADER_LENGTH: str(len(header))}
    return Target(label, f"{base}/v2/models/{model}/infer", header + raw, headers, True, pid)


def shared_target(label: str, base: str, pid: int, model: str, region: str, x: np.ndarray) -> Target:
    """The input named by a registered shared-memory region; the body is the JSON header alone."""
    tensor = {"name": "x", "datatype": "FP32", "shape": list(x.shape)}
    tensor["parameters"] = {"shared_memory_region": region, "shared_memory_byte_size": x.nbytes}
    doc = {"inputs": [tensor], "parameters": {"binary_data_output": True}}
    body = json.dumps(doc, separators=(",", ":")).encode()
    return Target(
        label, f"{base}/v2/models/{model}/infer", body, {"Content-Type": "application/json"}, True, pid
    )


@contextmanager
def shared_input(base: str, region: str, x: np.ndarray) -> Iterator[None]:
    """`x` in a POSIX shared-memory segment, registered with Kiln as `region`, as a client on
    the same host sets it up; unregistered and removed afterwards."""
    key = f"/kiln-bench-{os.getpid()}"
    path = Path("/dev/shm") / key[1:]
    path.write_bytes(x.astype("<f4").tobytes())
    try:
        doc = {"key": key, "offset": 0, "byte_size": x.nbytes}
        httpx.post(f"{base}/v2/systemsharedmemory/region/{region}/register", json=doc).raise_for_status()
        yield
        httpx.post(f"{base}/v2/systemsharedmemory/region/{region}/unregister")
    finally:
        path.unlink()


def raw_target(label: str, url: str, pid: int, x: np.ndarray) -> Target:
    headers = {"Content-Type": "application/octet-stream"}
    return Target(label, url, x.astype("<f4").tobytes(), headers, False, pid)


def check_answer(target: Target, expected: np.ndarray, tolerance: float = 1e-3) -> None:
    """Each server must compute the real thing before it is timed."""
    response = httpx.post(target.url, content=target.body, headers=target.headers, timeout=120)
    if response.status_code != 200:
        raise RuntimeError(f"{target.label}: HTTP {response.status_code}: {response.text[:300]}")
    body = response.content
    if target.v2:
        length = int(response.headers[HEADER_LENGTH])
        shape = json.loads(body[:length])["outputs"][0]["shape"]
        got = np.frombuffer(body, "<f4", offset=length).reshape(shape)
    else:
        got = np.frombuffer(body, "<f4").reshape(expected.shape)
    scale = max(1.0, float(np.abs(expected).max()))
    if got.shape != expected.shape or not np.allclose(got, expected, rtol=tolerance, atol=tolerance * scale):
        raise RuntimeError(f"{target.label}: the answer differs from the model's own output")


# Servers -----------------------------------------------------------------------------------


# The CPU compilers Kiln races against TorchScript for the CNN; untuned TVM never wins there.
RESNET_BACKENDS = ["onnxruntime", "inductor", "openvino"]


def upload(http: httpx.Client, name: str, model: BenchModel, path: Path, **config: object) -> None:
    """Upload, then wait until every variant has settled: ready, or failed with a reason."""
    doc = {"name": name, "inputs": model.inputs(), "backends": [], **config}
    response = http.post(
        "/v1/models", files={"file": ("model.pt", path.read_bytes())}, data={"config": json.dumps(doc)}
    )
    response.raise_for_status()

    def settled() -> bool:
        variants = http.get(f"/v1/models/{name}").json()["versions"][-1]["variants"]
        return all(v["status"] in ("ready", "failed", "rejected") for v in variants)

    wait_until(settled, 900, f"{name}'s variants settled")
    wait_until(lambda: http.get(f"/v2/models/{name}/ready").status_code == 200, 60, f"{name} ready")


def served_by(http: httpx.Client, name: str) -> str:
    """Each variant's measured latency by batch size, as the race sees them."""
    variants = http.get(f"/v1/models/{name}").json()["versions"][-1]["variants"]
    parts = []
    for v in variants:
        latencies = sorted((int(b), ms) for b, ms in v["latency_ms_by_batch"].items())
        parts.append(f"{v['backend']} {v['status']}" + "".join(f", b{b} {ms:.1f} ms" for b, ms in latencies))
    return "; ".join(parts)


# Tables ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    label: str
    sample: Sample
    baseline: Sample | None = None  # None: this row is the baseline
    min_rps: float | None = None  # target: at least this ratio of the baseline's req/s
    max_p99: float | None = None  # target: at most this ratio of the baseline's p99


COLUMNS = (
    *("server / config", "conc.", "requests", "req/s", "p50 ms", "p99 ms", "errors"),
    *("server CPU ms/req", "req/s ratio", "p99 ratio", "target", "result"),
)


def table(title: str, concurrency: int, rows: list[Row]) -> Table:
    out = Table(*COLUMNS, title=title)
    for row in rows:
        s, b = row.sample, row.baseline
        ratio, p99_ratio, target, verdict = "1.00 (base)", "1.00 (base)", "", ""
        if b is not None:
            r_rps = s.rps / b.rps if b.rps else float("nan")
            r_p99 = s.ms(99) / b.ms(99)
            ratio, p99_ratio = f"{r_rps:.2f}x", f"{r_p99:.2f}x"
            goals, passed = [], True
            if row.min_rps is not None:
                goals.append(f"req/s >= {row.min_rps}x")
                passed &= r_rps >= row.min_rps
            if row.max_p99 is not None:
                goals.append(f"p99 <= {row.max_p99}x")
                passed &= r_p99 <= row.max_p99
            passed &= s.errors == 0
            target = ", ".join(goals) or "(reference)"
            if goals:
                verdict = "[green]PASS[/green]" if passed else "[red]FAIL[/red]"
        out.add_row(
            row.label,
            str(concurrency),
            str(s.requests),
            f"{s.rps:.1f}",
            f"{s.ms(50):.1f}",
            f"{s.ms(99):.1f}",
            str(s.errors),
            f"{s.cpu_ms_per_request:.2f}",
            ratio,
            p99_ratio,
            target,
            verdict,
        )
    return out


# Main --------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mlp-seconds", type=float, default=20, help="measured seconds per MLP target")
    p.add_argument("--resnet-seconds", type=float, default=30, help="measured seconds per ResNet target")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds the seconds are split over")
    p.add_argument("--mlp-concurrency", type=int, default=16)
    p.add_argument("--resnet-concurrency", type=int, default=8)
    p.add_argument(
        "--light-concurrency",
        type=int,
        default=2,
        help="ResNet concurrency of the adaptive queue delay's table",
    )
    p.add_argument(
        "--resnet-backends",
        type=json.loads,
        default=RESNET_BACKENDS,
        help='the ResNet\'s `backends`, JSON: add {"name": "openvino", "options": {"precision": "bf16"}}',
    )
    p.add_argument("--max-batch-size", type=int, default=8)
    p.add_argument("--queue-delay-us", type=int, default=20_000, help="ResNet max_queue_delay_us")
    p.add_argument("--threads", type=int, default=2, help="intra-op threads of every server process")
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="processes per server: uvicorn workers of Kiln and the bare app, TorchServe workers per model",
    )
    p.add_argument("--max-requests", type=int, default=100_000, help="cap per target and round")
    p.add_argument(
        "--torchserve-venv",
        type=Path,
        default=Path(os.environ.get("KILN_TS_VENV", "/tmp/ts-venv")),
        help="venv with torchserve==0.12.0 (default $KILN_TS_VENV or /tmp/ts-venv)",
    )
    p.add_argument("--setup-torchserve", action="store_true", help="build that venv first")
    p.add_argument("--no-torchserve", action="store_true", help="skip the TorchServe rows")
    args = p.parse_args()
    if args.queue_delay_us % 1000:
        p.error("--queue-delay-us must be whole milliseconds: TorchServe's maxBatchDelay is in ms")
    return args


def pid_of(proc: subprocess.Popen[bytes] | None) -> int:
    assert proc is not None, "the server is not running"
    return proc.pid


def reference(path: Path, x: np.ndarray) -> np.ndarray:
    module = torch.jit.load(str(path), map_location="cpu").eval()
    with torch.inference_mode():
        out: np.ndarray = module(torch.from_numpy(x)).numpy()
    return out


def kiln_batches(url: str) -> str:
    """The mean batch Kiln ran per model, from its statistics extension (with several workers,
    the view of the one that answers)."""
    stats = httpx.get(f"{url}/v2/models/stats", timeout=30).json()["model_stats"]
    return ", ".join(
        f"{m['name']} {m['inference_count'] / max(m['execution_count'], 1):.1f} per run"
        for m in stats
        if m["execution_count"]
    )


def start_kiln(stack: ExitStack, tmp: Path, args: argparse.Namespace, paths: dict[str, Path]) -> KilnServer:
    """Upload and compile through one `kiln serve`, then serve from a fresh one with `--workers`
    processes on the same data: every worker loads its runners from the store, as after a deploy."""
    mb, threads = args.max_batch_size, args.threads
    console.log(f"starting kiln serve (KILN_THREADS={threads}), uploading ...")
    # OMP_NUM_THREADS too: `kiln serve` does not apply KILN_THREADS to its own runtime.
    env = {"KILN_DATA_DIR": str(tmp / "kiln"), "KILN_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)}
    env["KILN_SHARED_MEMORY"] = "true"  # for the ResNet's input in shared memory
    kiln = KilnServer(env, tmp / "kiln-upload.log")
    stack.callback(kiln.stop)
    kiln.start()
    with httpx.Client(base_url=kiln.url, timeout=300) as http:
        upload(http, "mlp", MLP64, paths["mlp"], max_batch_size=mb)  # queue delay: server default, 0
        upload(http, "mlp-b1", MLP64, paths["mlp"], max_batch_size=1)
        delay, racers = args.queue_delay_us, args.resnet_backends
        path = paths["resnet18"]
        upload(http, "resnet18", RESNET18, path, max_batch_size=mb, max_queue_delay_us=delay, backends=racers)
        upload(http, "resnet18-b1", RESNET18, path, max_batch_size=1, backends=racers)
        waits = {"max_queue_delay_us": delay, "adaptive_queue_delay": False}
        upload(http, "resnet18-wait", RESNET18, path, max_batch_size=mb, backends=racers, **waits)
        for name in ("resnet18", "resnet18-b1", "resnet18-wait"):
            console.log(f"{name}: {served_by(http, name)}")
    kiln.stop()
    console.log(f"restarting kiln serve with {args.workers} uvicorn worker(s)")
    kiln = KilnServer(env, tmp / "kiln.log", workers=args.workers)
    stack.callback(kiln.stop)
    kiln.start()
    return kiln


def start_torchserve(
    stack: ExitStack, tmp: Path, args: argparse.Namespace, paths: dict[str, Path]
) -> TorchServe | str:
    """A running TorchServe with both models registered, or why there is none."""
    reason = unavailable_reason(args.torchserve_venv)
    if reason is not None:
        return reason
    console.log(f"starting TorchServe 0.12 ({args.workers} worker(s) per model, {args.threads} threads) ...")
    ts = TorchServe(args.torchserve_venv, tmp / "torchserve", args.threads, args.workers)
    stack.callback(ts.stop)
    try:
        for m in (MLP64, RESNET18):
            ts.archive(m.name, paths[m.name], m.sample_shape)
        ts.start()
        ts.register("mlp", args.max_batch_size, 0)
        ts.register("resnet18", args.max_batch_size, args.queue_delay_us // 1000)
    except (OSError, RuntimeError, TimeoutError, subprocess.CalledProcessError) as exc:
        ts.stop()
        return f"TorchServe did not start: {str(exc)[:500]}"
    return ts


def main() -> None:
    args = parse_args()
    if shutil.which("wrk") is None:
        sys.exit("benchmarks/serving.py loads the servers with wrk; install it: sudo apt-get install -y wrk")
    unwind_on_signals()
    if args.setup_torchserve and not args.no_torchserve:
        console.log(f"building the TorchServe venv in {args.torchserve_venv} ...")
        setup_venv(args.torchserve_venv)
    started = time.monotonic()
    load_before = os.getloadavg()[0]
    mb, delay = args.max_batch_size, args.queue_delay_us
    with tempfile.TemporaryDirectory(prefix="kiln-serving-") as tmp_name, ExitStack() as stack:
        tmp = Path(tmp_name)
        rng = np.random.default_rng(0)
        paths, x, expected = {}, {}, {}
        for m in (MLP64, RESNET18):
            paths[m.name] = tmp / f"{m.name}.pt"
            paths[m.name].write_bytes(m.torchscript())
            x[m.name] = rng.standard_normal((1, *m.sample_shape)).astype(np.float32)
            expected[m.name] = reference(paths[m.name], x[m.name])

        kiln = start_kiln(stack, tmp, args, paths)
        console.log("starting the bare FastAPI app ...")
        bare = BareServer(paths["mlp"], "x:float32[-1,64]", args.threads, tmp / "bare.log", args.workers)
        stack.callback(bare.stop)
        bare.start()
        ts = "--no-torchserve" if args.no_torchserve else start_torchserve(stack, tmp, args, paths)

        k, b = pid_of(kiln.proc), pid_of(bare.proc)
        mlp_targets = [
            v2_target("bare FastAPI + runner", bare.url, b, "mlp", x["mlp"]),
            v2_target(f"kiln v2 (batch {mb}, delay 0)", kiln.url, k, "mlp", x["mlp"]),
            v2_target("kiln v2 (max_batch_size 1)", kiln.url, k, "mlp-b1", x["mlp"]),
        ]
        batching = f"kiln v2, batching ({mb}, {delay} us)"
        resnet_targets = [
            v2_target("kiln v2, no batching (max 1)", kiln.url, k, "resnet18-b1", x["resnet18"]),
            v2_target(f"{batching}, adaptive delay", kiln.url, k, "resnet18", x["resnet18"]),
            v2_target(f"{batching}, always waits", kiln.url, k, "resnet18-wait", x["resnet18"]),
        ]
        light_targets = [resnet_targets[2], resnet_targets[1]]
        if isinstance(ts, TorchServe):
            t, url = pid_of(ts.proc), ts.url
            mlp_targets.append(raw_target(f"torchserve ({mb}, 0 ms)", f"{url}/predictions/mlp", t, x["mlp"]))
            label = f"torchserve ({mb}, {delay // 1000} ms)"
            resnet_targets.append(raw_target(label, f"{url}/predictions/resnet18", t, x["resnet18"]))
        stack.enter_context(shared_input(kiln.url, "resnet18-x", x["resnet18"]))
        label = f"{batching}, adaptive delay, input in shared memory"
        resnet_targets.append(shared_target(label, kiln.url, k, "resnet18", "resnet18-x", x["resnet18"]))
        for target in mlp_targets:
            check_answer(target, expected["mlp"])
        # A bf16 variant, when asked for, may serve: it is checked at its own tolerance.
        raced = [{"name": b} if isinstance(b, str) else b for b in args.resnet_backends]
        options = [BackendRequest.model_validate(b).options for b in raced]
        tolerance = max([1e-3, *(default_tolerance(o)[0] for o in options)])
        for target in resnet_targets:
            check_answer(target, expected["resnet18"], tolerance)

        console.log(f"MLP: {args.mlp_seconds:.0f} s per target, in {args.rounds} rounds")
        conc = args.mlp_concurrency
        mlp = run_rounds(mlp_targets, conc, 1, args.mlp_seconds, args.rounds, args.max_requests)
        console.log(f"ResNet-18: {args.resnet_seconds:.0f} s per target, in {args.rounds} rounds")
        conc = args.resnet_concurrency
        resnet = run_rounds(resnet_targets, conc, 3, args.resnet_seconds, args.rounds, args.max_requests)
        conc = args.light_concurrency
        console.log(f"ResNet-18 at concurrency {conc}: {args.resnet_seconds:.0f} s per target")
        light = run_rounds(light_targets, conc, 3, args.resnet_seconds, args.rounds, args.max_requests)
        batches = kiln_batches(kiln.url)

    print_tables(args, mlp_targets, mlp, resnet_targets, resnet, None if isinstance(ts, TorchServe) else ts)
    title = "Adaptive queue delay: ResNet-18, always waiting out the delay (as Triton) vs adaptive"
    for conc, samples in ((args.light_concurrency, light), (args.resnet_concurrency, resnet)):
        waited, adapted = (samples[t.label] for t in light_targets)
        rows = [Row(light_targets[0].label, waited), Row(light_targets[1].label, adapted, waited)]
        console.print(table(title, conc, rows))
    console.print(f"Kiln's executed batches over the run (warm-ups included): {batches}")
    for label, sample in [*mlp.items(), *resnet.items(), *light.items()]:
        if sample.errors:
            console.print(f"[red]{label}: {sample.errors} requests failed or timed out[/red]")
    # Other work on the machine skews every number: the load average says how much there was.
    load = f"load average {load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at the end"
    console.print(f"total wall time {time.monotonic() - started:.0f} s, {os.cpu_count()} CPUs, {load}")


def print_tables(
    args: argparse.Namespace,
    mlp_targets: list[Target],
    mlp: dict[str, Sample],
    resnet_targets: list[Target],
    resnet: dict[str, Sample],
    ts_reason: str | None,
) -> None:
    bare, kiln_mlp, kiln_mlp1 = (mlp[t.label] for t in mlp_targets[:3])
    title = "Overhead: MLP [1,64], v2 binary infer vs a bare FastAPI endpoint calling the same runner"
    rows = [
        Row(mlp_targets[0].label, bare),
        Row(mlp_targets[1].label, kiln_mlp, bare, min_rps=0.8),
        Row(mlp_targets[2].label, kiln_mlp1, bare, min_rps=0.8),
    ]
    console.print(table(title, args.mlp_concurrency, rows))

    unbatched, batched = (resnet[t.label] for t in resnet_targets[:2])
    title = "Batching: ResNet-18 [1,3,224,224], dynamic batching vs none"
    rows = [
        Row(resnet_targets[0].label, unbatched),
        Row(resnet_targets[1].label, batched, unbatched, min_rps=1.5),
    ]
    console.print(table(title, args.resnet_concurrency, rows))
    in_shared = resnet[resnet_targets[-1].label]
    title = "Shared memory: ResNet-18, its 602 KB input in a registered region vs in the request body"
    rows = [Row(resnet_targets[1].label, batched), Row(resnet_targets[-1].label, in_shared, batched)]
    console.print(table(title, args.resnet_concurrency, rows))

    if ts_reason is not None:
        console.print(f"[yellow]Against TorchServe: skipped: {ts_reason}[/yellow]")
        return
    ts_resnet, ts_mlp = resnet[resnet_targets[3].label], mlp[mlp_targets[3].label]
    title = "Against TorchServe 0.12: ResNet-18, same file, payload and batching"
    rows = [
        Row(resnet_targets[3].label, ts_resnet),
        Row(resnet_targets[1].label, batched, ts_resnet, min_rps=1.5, max_p99=0.5),
        Row(resnet_targets[2].label, resnet[resnet_targets[2].label], ts_resnet),  # TorchServe's waits
    ]
    console.print(table(title, args.resnet_concurrency, rows))
    title = "Against TorchServe 0.12: MLP, same file, payload and batching"
    rows = [
        Row(mlp_targets[3].label, ts_mlp),
        Row(mlp_targets[1].label, kiln_mlp, ts_mlp, min_rps=3.0, max_p99=0.3),
        Row(mlp_targets[0].label, bare, ts_mlp),  # what any FastAPI server could reach here
    ]
    console.print(table(title, args.mlp_concurrency, rows))


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        logging.getLogger("asyncio").setLevel(logging.CRITICAL)  # the interrupted task's GC notice
        console.print("interrupted: every server was stopped")
        sys.exit(130)
