"""Upload inspection tells an output whose rows are each its own request's from one whose rows
depend on the batch's other rows, which must never be merged: to the bit, whatever the values."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from compiler.inspect import inspect_model


class LogOfLinear(nn.Module):
    """NaN wherever the linear layer is negative: rows apart all the same."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(self.fc(x))


class Pixels(nn.Module):
    """Rounded to uint8: a float's last bit flips a pixel where a tolerance would not."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(32, 3 * 16 * 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (torch.sigmoid(self.fc(x)) * 255).round().to(torch.uint8).reshape(-1, 3, 16, 16)


class CenteredWithInf(nn.Module):
    """Less the batch's mean, beside a column of -inf: rows that depend on the others."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        centered = x - x.mean(dim=0, keepdim=True)
        return torch.cat([centered, torch.log(torch.zeros_like(x[:, :1]))], dim=1)


class Noisy(nn.Module):
    """Each answer another: merging leaks nothing, and it still batches."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.randn_like(x)


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class RunningSum(nn.Module):
    """Each row the sum of those up to it: the first row is its own, the later ones are not."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.cumsum(0)


class LessTheFirst(nn.Module):
    """The first row is all zeros whatever comes after it; the others take it away."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x - x[:1]


class PlusTheLast(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + x[-1:]


class ThirdReadsFourth(nn.Module):
    """One row of the batch, neither the first, the middle nor the last, reads the next."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x[:2], x[2:3] + x[3:4], x[3:]])


class Shifted(nn.Module):
    """Each row is the one before it, the first the last: no row is its own."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.roll(1, 0)


def _named(case: object) -> str:
    return type(case).__name__ if isinstance(case, nn.Module) else str(case)


@pytest.mark.parametrize(
    ("module", "apart"),
    [
        (LogOfLinear(), True),
        (Pixels(), True),
        (MLP(), True),
        (CenteredWithInf(), False),
        (Noisy(), True),
        (RunningSum(), False),
        (LessTheFirst(), False),
        (PlusTheLast(), False),
        (ThirdReadsFourth(), False),
        (Shifted(), False),
    ],
    ids=_named,
)
def test_rows_apart(tmp_path: Path, module: nn.Module, apart: bool) -> None:
    path = tmp_path / "model.pt"
    torch.jit.save(torch.jit.script(module.eval()), str(path))
    spec = {"inputs": [{"name": "x", "dtype": "float32", "shape": [-1, 32]}], "max_batch_size": 16}
    [output] = inspect_model(str(path), spec, [], lambda event: None)["outputs"]
    assert output["shape"][0] == -1
    assert output["rows_apart"] is apart


class LastReadsPrevious(nn.Module):
    """The last row alone depends on another: the one before it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x[:-1], x[-1:] + x[-2:-1]])


@pytest.mark.parametrize("max_batch_size", [2, 3, 7, 8, 9, 17, 64])
@pytest.mark.parametrize(
    ("module", "apart"),
    [(MLP(), True), (RunningSum(), False), (LessTheFirst(), False), (LastReadsPrevious(), False)],
    ids=_named,
)
def test_every_row_is_checked_at_any_largest_batch(
    tmp_path: Path, module: nn.Module, apart: bool, max_batch_size: int
) -> None:
    path = tmp_path / "model.pt"
    torch.jit.save(torch.jit.script(module.eval()), str(path))
    spec = {
        "inputs": [{"name": "x", "dtype": "float32", "shape": [-1, 32]}],
        "max_batch_size": max_batch_size,
    }
    [output] = inspect_model(str(path), spec, [], lambda event: None)["outputs"]
    assert output["rows_apart"] is apart


@pytest.mark.parametrize(
    ("shape", "max_batch_size", "found"),
    [([-1, 32], 1, [-1, 32]), ([4, 32], 8, [4, 32])],
    ids=["batch-1", "no-batch"],
)
def test_a_model_never_batched_keeps_its_rows_apart(
    tmp_path: Path, shape: list[int], max_batch_size: int, found: list[int]
) -> None:
    """With one row per run, or no batch dimension, no requests are ever merged."""
    path = tmp_path / "model.pt"
    torch.jit.save(torch.jit.script(RunningSum()), str(path))
    spec = {"inputs": [{"name": "x", "dtype": "float32", "shape": shape}], "max_batch_size": max_batch_size}
    [output] = inspect_model(str(path), spec, [], lambda event: None)["outputs"]
    assert (output["shape"], output["rows_apart"]) == (found, True)


class Lookup(nn.Module):
    """Integer ids and a float weight: two inputs, two outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(10, 8)

    def forward(self, ids: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = self.embedding(ids).sum(1) * weight
        return rows, rows.cumsum(0)


def test_rows_apart_is_told_for_each_output_of_several_inputs(tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    torch.jit.save(torch.jit.script(Lookup().eval()), str(path))
    spec = {
        "inputs": [
            {"name": "ids", "dtype": "int64", "shape": [-1, 4]},
            {"name": "weight", "dtype": "float32", "shape": [-1, 1]},
        ],
        "max_batch_size": 8,
    }
    outputs = inspect_model(str(path), spec, [], lambda event: None)["outputs"]
    assert [(o["shape"], o["rows_apart"]) for o in outputs] == [([-1, 8], True), ([-1, 8], False)]


class Transposed(nn.Module):
    """The batch comes out second."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.t()


def test_a_dimension_past_the_first_that_follows_the_batch_is_dynamic(tmp_path: Path) -> None:
    """It was reported at its size at batch 1, [4, 1], where a batch of 2 answers [4, 2]."""
    path = tmp_path / "model.pt"
    torch.jit.save(torch.jit.script(Transposed()), str(path))
    spec = {"inputs": [{"name": "x", "dtype": "float32", "shape": [-1, 4]}], "max_batch_size": 8}
    [output] = inspect_model(str(path), spec, [], lambda event: None)["outputs"]
    assert (output["shape"], output["rows_apart"]) == ([4, -1], True)


class AlongTheLength(nn.Module):
    """Outputs that lead with the batch, and two that lead with the length instead."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return x[:, :2], x.t(), x.sum(0)


def test_a_first_dimension_that_follows_the_length_is_dynamic_and_not_the_batch(tmp_path: Path) -> None:
    """At the largest batch, 8, and the length's TRACE_FILL, 8, `x.t()` and `x.sum(0)` were
    reported as [8, -1] and [8]: a client sized its output for 8 rows, where a request of
    length 5 got 5."""
    path = tmp_path / "model.pt"
    torch.jit.save(torch.jit.script(AlongTheLength()), str(path))
    spec = {"inputs": [{"name": "x", "dtype": "float32", "shape": [-1, -1]}], "max_batch_size": 8}
    outputs = inspect_model(str(path), spec, [], lambda event: None)["outputs"]
    assert [(o["shape"], o["batched"]) for o in outputs] == [
        ([-1, 2], True),
        ([-1, -1], False),
        ([-1], False),
    ]
