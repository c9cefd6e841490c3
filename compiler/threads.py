"""Intra-op threads, set once per process for every runtime so variants compare fairly."""

from __future__ import annotations

import os

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
