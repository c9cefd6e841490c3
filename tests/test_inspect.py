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


@pytest.mark.parametrize(
    ("module", "apart"),
    [(LogOfLinear(), True), (Pixels(), True), (CenteredWithInf(), False), (Noisy(), True)],
    ids=lambda case: type(case).__name__ if isinstance(case, nn.Module) else str(case),
)
def test_rows_apart(tmp_path: Path, module: nn.Module, apart: bool) -> None:
    path = tmp_path / "model.pt"
    torch.jit.save(torch.jit.script(module.eval()), str(path))
    spec = {"inputs": [{"name": "x", "dtype": "float32", "shape": [-1, 32]}], "max_batch_size": 16}
    [output] = inspect_model(str(path), spec, [], lambda event: None)["outputs"]
    assert output["shape"][0] == -1
    assert output["rows_apart"] is apart
