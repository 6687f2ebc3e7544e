"""Models the trainer can train, by name.

- `resnet18`: torchvision's ResNet-18 adapted to 32x32 inputs (3x3 stride-1 first convolution,
  no max pooling), the usual CIFAR variant.
- `tiny`: a two-convolution network for fast tests and demos. It has no batch normalization,
  so its gradients do not depend on how a global batch is split across ranks or micro-steps
  (the DDP and accumulation equivalences hold exactly, up to float rounding).

Weights are initialized from torch's global RNG: seed it before `build_model` for a
reproducible start.
"""

from __future__ import annotations

import torch
from torch import nn
from torchvision.models import resnet18

from orch_trainer.args import MODEL_NAMES


class TinyCNN(nn.Module):
    """conv(16) -> relu -> maxpool -> conv(32) -> relu -> global average -> linear."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.head = nn.Linear(32, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def _resnet18_small_inputs(num_classes: int) -> nn.Module:
    model = resnet18(weights=None, num_classes=num_classes)
    model.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
    model.maxpool = nn.Identity()
    return model


def build_model(name: str, num_classes: int) -> nn.Module:
    """A freshly initialized model `name` (one of MODEL_NAMES) with `num_classes` outputs."""
    if name == "tiny":
        return TinyCNN(num_classes)
    if name == "resnet18":
        return _resnet18_small_inputs(num_classes)
    raise ValueError(f"unknown model {name!r}; choose from {', '.join(MODEL_NAMES)}")
