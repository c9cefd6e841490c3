"""Intra-op threads, set once per process for every runtime so variants compare fairly."""

from __future__ import annotations

import math
import os
from pathlib import Path

# TVM's pool workers wait for the next parallel kernel by calling sched_yield, 300000 times by
# default. After a call of a tuned ResNet-18 that burned 0.17 s of CPU in the next 0.2 s: time
# taken from the next runner in a race, and from a server's request threads. Beside one busy
# core its calls took 42-244 ms (median 94 in 12 rounds) where ONNX Runtime's took 41-69; with
# workers that sleep at once, 42-57 ms. Idle, the cost was within noise (22.3 against 22.5 ms).
TVM_SPIN_COUNT = "0"


def set_threads(count: int) -> None:
    # TVM's thread pool reads both variables when it first starts; torch reads its setter. An
    # operator's own TVM_THREAD_POOL_SPIN_COUNT wins.
    os.environ["TVM_NUM_THREADS"] = str(count)
    os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", TVM_SPIN_COUNT)
    import torch

    if torch.get_num_threads() != count:
        torch.set_num_threads(count)


def available_cpus() -> int:
    """The CPUs this process may use: those it may run on, and no more than its cgroup's quota,
    a container's CPU limit, which os.cpu_count ignores: a pod limited to 2 CPUs on a 64-core
    node ran 64 threads a batch, throttled. Read here, a KServe runtime needs no
    `resourceFieldRef`, which Knative refuses by default."""
    count = len(os.sched_getaffinity(0))
    quota = cgroup_cpu_quota()
    return count if quota is None else max(1, min(count, math.ceil(quota)))


def cgroup_cpu_quota(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """CPUs' worth of time a period that the cgroup allows (v2's cpu.max, else v1's CFS files);
    None where it sets no limit or there is none to read."""
    try:
        quota, period = (root / "cpu.max").read_text().split()
    except (OSError, ValueError):
        try:
            quota = (root / "cpu" / "cpu.cfs_quota_us").read_text().strip()
            period = (root / "cpu" / "cpu.cfs_period_us").read_text().strip()
        except OSError:
            return None
    try:
        limit = int(quota) / int(period)
    except (ValueError, ZeroDivisionError):  # v2's "max", or a file of another format
        return None
    return limit if limit > 0 else None  # v1's -1: none
