"""The two digit classifiers: a tiny edge CNN and a larger, more accurate center CNN.

Both take FP32 ``[N, 1, 28, 28]`` images already normalised as ``(pixel / 255 - MEAN) / STD``
(the ``request`` block of ``tiered.json`` tells the servers to do that to a PNG) and return
logits ``[N, 10]``. Only standard layers, so that both script to TorchScript and the edge
exports to ONNX and quantizes to INT8.
"""

from __future__ import annotations

import numpy as np
import torch
from numpy.typing import NDArray
from torch import nn

MEAN, STD, SCALE = 0.1307, 0.3081, 255.0  # MNIST's pixel mean and std, on the 0..1 scale
CLASSES = 10


def normalise(images: NDArray[np.uint8]) -> torch.Tensor:
    """uint8 ``[N, 28, 28]`` -> the models' FP32 ``[N, 1, 28, 28]`` input."""
    pixels = torch.from_numpy(np.ascontiguousarray(images)).to(torch.float32)
    return ((pixels / SCALE - MEAN) / STD).unsqueeze(1)


class EdgeNet(nn.Module):
    """One 3x3 conv layer of 8 filters, 4x4 max pooling and a linear head: ~4k parameters,
    ~94% on the test split (the center: ~98%), so that a cascade has errors to hand on."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(4),  # 8 x 7 x 7
        )
        self.classifier = nn.Linear(8 * 7 * 7, CLASSES)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(image), 1))


class CenterNet(nn.Module):
    """Conv 32 and conv 64 (each with batch norm) and a 128-wide hidden layer: ~420k
    parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.MaxPool2d(2),                                               # 32 x 14 x 14
            nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
            nn.MaxPool2d(2),                                               # 64 x 7 x 7
        )
        self.classifier = nn.Sequential(
            nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Dropout(0.3), nn.Linear(128, CLASSES))

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(image), 1))


def parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
