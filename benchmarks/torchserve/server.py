"""TorchServe 0.12 for benchmarks/serving.py: its own venv, a model archive, and one server process.

TorchServe never enters Kiln's venv (it pins its own dependencies): it lives in a separate venv
that `setup_venv` builds, with the CPU torch of Kiln's pin. Everything binds to 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.servers import free_port, wait_until

HANDLER = Path(__file__).resolve().with_name("handler.py")
PACKAGES = ["torchserve==0.12.0", "torch-model-archiver==0.12.0", "pyyaml"]  # no workers without pyyaml


# PyPI's torch for Linux is a CUDA build of several GB; PyTorch's index has the CPU one, which
# ==2.13.0 matches and pip prefers. A machine that cannot reach it installs as pip is set up to
# (as the Makefile does).
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def setup_venv(venv: Path) -> None:
    """Build the TorchServe venv: torch first (pinned, the CPU wheel), then TorchServe."""
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "torch==2.13.0", *cpu_index()], check=True)
    subprocess.run([*pip, *PACKAGES], check=True)


def cpu_index() -> list[str]:
    try:
        httpx.get(f"{TORCH_CPU_INDEX}/torch/", timeout=5).raise_for_status()
    except httpx.HTTPError:
        return []
    return ["--extra-index-url", TORCH_CPU_INDEX]


def unavailable_reason(venv: Path) -> str | None:
    """Why TorchServe cannot run from `venv`, or None when it can."""
    if shutil.which("java") is None:
        return "java is not on PATH (TorchServe's frontend is a JVM)"
    for tool in ("python", "torchserve", "torch-model-archiver"):
        if not (venv / "bin" / tool).exists():
            return f"{venv / 'bin' / tool} is missing; pass --setup-torchserve or --torchserve-venv PATH"
    check = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import torch, ts, yaml"], capture_output=True, text=True
    )
    if check.returncode != 0:
        return f"the TorchServe venv cannot import torch, ts and yaml: {check.stderr.strip()[-200:]}"
    return None


class TorchServe:
    """One TorchServe: a JVM frontend plus `workers` Python workers per registered model."""

    def __init__(self, venv: Path, workdir: Path, threads: int, workers: int = 1) -> None:
        self.venv = venv
        self.workdir = workdir
        self.threads = threads
        self.workers = workers
        self.store = workdir / "model-store"
        self.store.mkdir(parents=True, exist_ok=True)
        self.ports = {key: free_port() for key in ("inference", "management", "metrics", "grpc", "grpc_mgmt")}
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.ports['inference']}"

    @property
    def management(self) -> str:
        return f"http://127.0.0.1:{self.ports['management']}"

    def archive(self, name: str, model: Path, sample_shape: tuple[int, ...]) -> None:
        """Pack `model` with the handler into `<store>/<name>.mar`."""
        extra = self.workdir / name / "bench.json"
        extra.parent.mkdir(parents=True, exist_ok=True)
        extra.write_text(json.dumps({"sample_shape": list(sample_shape), "threads": self.threads}))
        subprocess.run(
            [
                str(self.venv / "bin" / "torch-model-archiver"),
                *("--model-name", name, "--version", "1.0", "--serialized-file", str(model)),
                *("--handler", str(HANDLER), "--extra-files", str(extra)),
                *("--export-path", str(self.store), "--force"),
            ],
            check=True,
        )

    def start(self) -> None:
        p = self.ports
        config = self.workdir / "config.properties"
        config.write_text(
            "\n".join(
                [
                    f"inference_address=http://127.0.0.1:{p['inference']}",
                    f"management_address=http://127.0.0.1:{p['management']}",
                    f"metrics_address=http://127.0.0.1:{p['metrics']}",
                    "grpc_inference_address=127.0.0.1",
                    f"grpc_inference_port={p['grpc']}",
                    "grpc_management_address=127.0.0.1",
                    f"grpc_management_port={p['grpc_mgmt']}",
                    f"model_store={self.store}",
                    "disable_token_authorization=true",
                    "enable_model_api=true",
                    f"default_workers_per_model={self.workers}",
                    f"number_of_netty_threads={self.threads}",
                    f"netty_client_threads={self.threads}",
                    "job_queue_size=1000",
                    "default_response_timeout=120",
                    "disable_system_metrics=true",
                    "install_py_dep_per_model=false",
                ]
            )
            + "\n"
        )
        logs = self.workdir / "logs"
        logs.mkdir(exist_ok=True)
        # Its pid file and JVM temp files go to the work dir, so it never meets another TorchServe.
        env = {
            **os.environ,
            "TMPDIR": str(self.workdir),
            "TEMP": str(self.workdir),
            "LOG_LOCATION": str(logs),
            "METRICS_LOCATION": str(logs),
            "PATH": f"{self.venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
            "OMP_NUM_THREADS": str(self.threads),
        }
        with open(self.workdir / "torchserve.out", "ab") as out:
            # A session of its own: stop() ends the launcher, the JVM and the workers together.
            self.proc = subprocess.Popen(
                [
                    str(self.venv / "bin" / "torchserve"),
                    *("--start", "--foreground", "--ncs", "--disable-token-auth", "--enable-model-api"),
                    *("--ts-config", str(config), "--model-store", str(self.store)),
                ],
                cwd=self.workdir,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            wait_until(lambda: httpx.get(f"{self.url}/ping").status_code == 200, 120, "torchserve", 0.5)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}\n{self.tail()}") from exc

    def register(self, name: str, batch_size: int, max_batch_delay_ms: int) -> None:
        """Each worker batches up to `batch_size` requests, waiting `max_batch_delay_ms`."""
        params: dict[str, str | int] = {
            "url": f"{name}.mar",
            "model_name": name,
            "batch_size": batch_size,
            "max_batch_delay": max_batch_delay_ms,
            "initial_workers": self.workers,
            "synchronous": "true",
            "response_timeout": 120,
        }
        response = httpx.post(f"{self.management}/models", params=params, timeout=300)
        if response.status_code != 200:
            raise RuntimeError(f"registering {name} failed: {response.text}\n{self.tail()}")

    def stop(self) -> None:
        if self.proc is None:
            return
        group = self.proc.pid  # the session this Popen started: launcher, JVM, workers; nothing else
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(group, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and self._alive(group):
                time.sleep(0.2)
            if not self._alive(group):
                break
        self.proc = None

    def _alive(self, group: int) -> bool:
        assert self.proc is not None
        self.proc.poll()  # reap the launcher, or its zombie keeps the group alive
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return False
        return True

    def tail(self, lines: int = 30) -> str:
        found = [self.workdir / "torchserve.out", *sorted((self.workdir / "logs").glob("*.log"))]
        text = [
            f"== {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-lines:]) for p in found
        ]
        return "\n".join(text)
