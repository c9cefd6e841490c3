"""Intra-op threads, set once per process for every runtime so variants compare fairly."""

from __future__ import annotations

import os


def set_threads(count: int) -> None:
    # TVM's thread pool reads TVM_NUM_THREADS when it first starts; torch reads its setter.
    os.environ["TVM_NUM_THREADS"] = str(count)
    import torch

    if torch.get_num_threads() != count:
        torch.set_num_threads(count)
