"""Instances benchmark: ResNet-18 with `instances` 1 against 2 (Triton's instance_group count),
in one `kiln serve` whose intra-op threads are 1 (KILN_THREADS), so that one batch at a time
keeps one core busy and two batches side by side can keep two. Both ratios are measured in the
same run, in interleaved rounds, with serving.py's load generator (wrk) and tables.

TorchScript serves (no compiles), so that the run takes about three minutes.
Run: .venv/bin/python benchmarks/instances.py [--help]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.models import RESNET18
from benchmarks.serving import (
    Row,
    check_answer,
    console,
    pid_of,
    reference,
    run_rounds,
    table,
    upload,
    v2_target,
)
from tests.servers import KilnServer, unwind_on_signals


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=30, help="measured seconds per target")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds the seconds are split over")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--max-batch-size", type=int, default=8)
    p.add_argument("--instances", type=int, default=2, help="the instances of the second model")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads of the server (KILN_THREADS)")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    unwind_on_signals()
    if shutil.which("wrk") is None:
        sys.exit("benchmarks/instances.py loads the server with wrk; install it: sudo apt-get install -y wrk")
    with tempfile.TemporaryDirectory(prefix="kiln-instances-") as tmp_name, ExitStack() as stack:
        tmp = Path(tmp_name)
        path = tmp / "resnet18.pt"
        path.write_bytes(RESNET18.torchscript())
        x = np.random.default_rng(0).standard_normal((1, *RESNET18.sample_shape)).astype(np.float32)
        threads = str(args.threads)
        env = {"KILN_DATA_DIR": str(tmp / "kiln"), "KILN_THREADS": threads, "OMP_NUM_THREADS": threads}
        kiln = KilnServer(env, tmp / "kiln.log")
        stack.callback(kiln.stop)
        console.log(f"starting kiln serve (KILN_THREADS={threads}), uploading ...")
        kiln.start()
        mb, many = args.max_batch_size, args.instances
        with httpx.Client(base_url=kiln.url, timeout=300) as http:
            upload(http, "resnet18", RESNET18, path, max_batch_size=mb)
            upload(http, f"resnet18-x{many}", RESNET18, path, max_batch_size=mb, instances=many)
        pid = pid_of(kiln.proc)
        targets = [
            v2_target(f"kiln v2, batching ({mb}), 1 instance", kiln.url, pid, "resnet18", x),
            v2_target(f"kiln v2, batching ({mb}), {many} instances", kiln.url, pid, f"resnet18-x{many}", x),
        ]
        expected = reference(path, x)
        for target in targets:
            check_answer(target, expected)
        samples = run_rounds(targets, args.concurrency, 3, args.seconds, args.rounds, 100_000)
    one, more = (samples[t.label] for t in targets)
    title = f"Instances: ResNet-18 [1,3,224,224], KILN_THREADS={threads}, {os.cpu_count()} CPUs"
    rows = [Row(targets[0].label, one), Row(targets[1].label, more, one)]
    console.print(table(title, args.concurrency, rows))


if __name__ == "__main__":
    main()
