"""Backbone numbers: for each test model (tests/models.py) and each of its variants (TorchScript and
untuned TVM), the seconds from upload to ready, the median latency of sequential batch-1 predictions
through HTTP and of the same variant's runner called in-process, and the difference: what the
server's HTTP path adds to a request.

Starts its own embedded `kiln serve` on a loopback port, with one intra-op thread, and prints one
table. Run: make benchmark
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from compiler.threads import set_threads
from service.registry import Registry
from service.runtime import Runtime
from service.settings import Settings
from service.store.local import LocalStore
from tests.client import predict, sample, upload, wait_settled
from tests.models import MODELS
from tests.servers import KilnServer, unwind_on_signals

THREADS = 1


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=200, help="sequential requests timed per variant and path")
    args = p.parse_args()
    if args.requests < 1:
        p.error("--requests must be at least 1")
    return args


def p50_ms(fn: Callable[[], object], n: int) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> None:
    args = parse_args()
    unwind_on_signals()
    set_threads(THREADS)
    table = Table(
        "model",
        "variant",
        "upload→ready s",
        "HTTP p50 ms",
        "in-process p50 ms",
        "HTTP overhead ms",
        title=f"Kiln backbone: batch 1, {THREADS} intra-op thread, {args.requests} sequential requests each",
    )
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        server = KilnServer(
            {"KILN_DATA_DIR": str(data), "KILN_THREADS": str(THREADS)}, Path(tmp) / "kiln.log"
        )
        server.start()
        try:
            with httpx.Client(base_url=server.url, timeout=600) as http:
                for model in MODELS.values():
                    upload(http, model, max_batch_size=8, backends=["tvm"]).raise_for_status()
                settings = Settings(data_dir=data, threads=THREADS)
                registry = Registry(LocalStore(data))
                runtime = Runtime(registry, settings)
                for name, model in MODELS.items():
                    variants = wait_settled(http, name, 1, timeout=1800)
                    version = registry.get_version(name, 1)
                    x = sample(model, 1)
                    for v in variants:
                        job = http.get(f"/v1/jobs/{v['job_id']}").json() if v["job_id"] else None
                        ready_s = job["finished_at"] - job["created_at"] if job else 0.0
                        if v["status"] != "ready":
                            table.add_row(name, v["backend"], v["status"], "", "", "")
                            continue
                        backend = v["backend"]
                        http_ms = p50_ms(
                            lambda b=backend, n=name, x=x: predict(http, n, x, backend=b), args.requests
                        )
                        record = registry.get_variant(v["id"])
                        assert record is not None
                        runner = runtime.load(version, record).runner
                        local_ms = p50_ms(lambda r=runner, x=x: r.run({"x": x}), args.requests)
                        table.add_row(
                            name,
                            backend,
                            f"{ready_s:.1f}",
                            f"{http_ms:.3f}",
                            f"{local_ms:.3f}",
                            f"{http_ms - local_ms:.3f}",
                        )
        finally:
            server.stop()
    Console(width=140).print(table)


if __name__ == "__main__":
    main()
