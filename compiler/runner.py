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


class Renamed:
    """A runner whose outputs are served under other names: `names`, in the order the model
    returns them (output0, output1, ...); outputs past them keep theirs."""

    def __init__(self, runner: Runner, names: list[str]) -> None:
        self.runner = runner
        self.backend = runner.backend
        self.names = dict(zip(output_names(len(names)), names, strict=True))

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {self.names.get(name, name): array for name, array in self.runner.run(inputs).items()}
