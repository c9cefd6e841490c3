"""The Runner protocol: a loaded artifact that maps named numpy inputs to named numpy outputs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import numpy as np


class Runner(Protocol):
    backend: str

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one (possibly batched) call. Inputs are already checked against the spec."""
        ...


def output_names(count: int) -> list[str]:
    """Names for a model's positional outputs, shared by every backend so results line up."""
    return [f"output{i}" for i in range(count)]
