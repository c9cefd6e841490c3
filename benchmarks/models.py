"""Benchmark models, scripted to TorchScript: ResNet-18 (by hand: no torchvision here) and the MLP.

Weights are random but seeded and initialised as torchvision does, so activations stay in a
normal float range (no denormals to slow one server down by chance).
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from tests.models import MLP, MODELS, TestModel


class BasicBlock(nn.Module):
    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample: nn.Module = nn.Identity()
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(
                nn.Conv2d(inplanes, planes, 1, stride=stride, bias=False), nn.BatchNorm2d(planes)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.downsample(x))


class ResNet18(nn.Module):
    """torchvision's resnet18 layer for layer: 11.7 M parameters, 1.8 GFLOPs at 224x224."""

    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        self.layer1 = nn.Sequential(BasicBlock(64, 64), BasicBlock(64, 64))
        self.layer2 = nn.Sequential(BasicBlock(64, 128, 2), BasicBlock(128, 128))
        self.layer3 = nn.Sequential(BasicBlock(128, 256, 2), BasicBlock(256, 256))
        self.layer4 = nn.Sequential(BasicBlock(256, 512, 2), BasicBlock(512, 512))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512, classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


@dataclass(frozen=True)
class BenchModel:
    name: str
    factory: Callable[[], nn.Module]
    # One sample's shape, without the batch dimension.
    sample_shape: tuple[int, ...]

    def torchscript(self) -> bytes:
        torch.manual_seed(0)
        buf = io.BytesIO()
        torch.jit.save(torch.jit.script(self.factory().eval()), buf)
        return buf.getvalue()

    def inputs(self) -> list[dict[str, object]]:
        return [{"name": "x", "dtype": "float32", "shape": [-1, *self.sample_shape]}]


RESNET18 = BenchModel("resnet18", ResNet18, (3, 224, 224))
MLP64 = BenchModel("mlp", MLP, (64,))
# What the GPU report and benchmark build: the test models, and a ResNet-18 at 224x224.
GPU_MODELS = {**MODELS, "resnet18": TestModel("resnet18", ResNet18, RESNET18.inputs())}
