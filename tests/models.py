"""Small models defined here, scripted to TorchScript bytes for the tests and benchmarks."""

from __future__ import annotations

import functools
import io
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self, features: int = 64, hidden: int = 128, classes: int = 10) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(features, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.Conv2d(8, 16, 3, stride=2, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(),
        )
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.features(x).mean(dim=(2, 3))
        return self.head(y)


class LSTMHead(nn.Module):
    """Reads the last time step, `out[:, -1]`: the negative index TVM's importer got wrong."""

    def __init__(self, features: int = 16, hidden: int = 32) -> None:
        super().__init__()
        self.lstm = nn.LSTM(features, hidden, batch_first=True)
        self.head = nn.Linear(hidden, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        return self.head(out[:, -1])


class Encoder(nn.Module):
    def __init__(self, d_model: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(
            d_model, heads, dim_feedforward=64, dropout=0.0, batch_first=True
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)


class Tunable(nn.Module):
    """A first layer (32 -> 32, ReLU) that every width shares, so its tuned kernel is reusable."""

    def __init__(self, classes: int = 8) -> None:
        super().__init__()
        self.shared = nn.Sequential(nn.Linear(32, 32), nn.ReLU())
        self.head = nn.Linear(32, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.shared(x))


class Tokens(nn.Module):
    """Token ids and their mask, which must share the sequence's length, and a table of 32
    positions, which bounds it: dims export ties rather than leaving each free."""

    def __init__(self, vocab: int = 100, width: int = 16, positions: int = 32) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Parameter(torch.randn(positions, width))
        self.head = nn.Linear(width, 4)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.tokens(ids) + self.positions[: ids.shape[1]]
        weights = mask.unsqueeze(-1).float()
        return self.head((x * weights).sum(1) / weights.sum(1).clamp(min=1.0))


class Signal(nn.Module):
    """A convolution over a sequence of any length, from its window's 5 up."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(1, 4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x).mean(2)


class Unconvertible(nn.Module):
    """Scripts and runs in TorchScript, but TVM's importer has no converter for its op."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.linalg.svdvals(x.reshape(x.shape[0], 4, -1))


@functools.cache
def _script(name: str, factory: Callable[[], nn.Module]) -> bytes:
    """Scripting is slow and deterministic (seeded weights): do it once per model."""
    torch.manual_seed(0)
    buf = io.BytesIO()
    torch.jit.save(torch.jit.script(factory().eval()), buf)
    return buf.getvalue()


@dataclass(frozen=True)
class TestModel:
    __test__ = False  # not a pytest test class
    name: str
    factory: Callable[[], nn.Module]
    inputs: list[dict[str, object]]

    def module(self) -> nn.Module:
        torch.manual_seed(0)
        return self.factory().eval()

    def torchscript(self) -> bytes:
        return _script(self.name, self.factory)

    def config(self, **extra: object) -> dict[str, object]:
        return {"name": self.name, "inputs": self.inputs, **extra}


MODELS: dict[str, TestModel] = {
    m.name: m
    for m in [
        TestModel("mlp", MLP, [{"name": "x", "dtype": "float32", "shape": [-1, 64]}]),
        TestModel("cnn", CNN, [{"name": "x", "dtype": "float32", "shape": [-1, 3, 16, 16]}]),
        TestModel("lstm", LSTMHead, [{"name": "x", "dtype": "float32", "shape": [-1, 8, 16]}]),
        TestModel("encoder", Encoder, [{"name": "x", "dtype": "float32", "shape": [-1, 8, 32]}]),
    ]
}

TOKENS = TestModel(
    "tokens",
    Tokens,
    [
        {"name": "ids", "dtype": "int64", "shape": [-1, -1]},
        {"name": "mask", "dtype": "int64", "shape": [-1, -1]},
    ],
)
SIGNAL = TestModel("signal", Signal, [{"name": "x", "dtype": "float32", "shape": [-1, 1, -1]}])

UNCONVERTIBLE = TestModel("svd", Unconvertible, [{"name": "x", "dtype": "float32", "shape": [-1, 16]}])

# Three models that differ only in their head: tuning one leaves records the others reuse.
TUNABLE = [
    TestModel(
        f"tunable{classes}",
        functools.partial(Tunable, classes),
        [{"name": "x", "dtype": "float32", "shape": [-1, 32]}],
    )
    for classes in (8, 4, 2)
]
