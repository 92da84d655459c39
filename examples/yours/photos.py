"""An image classifier as a user brings one: which part of which photo a 64x64 RGB patch comes
from (the two sample photos, each cut in four quadrants: eight labels). The center is a small
ResNet (residual blocks, batch norm), the edge a two-layer CNN; both take FP32 NCHW scaled to
[0, 1] and normalized per channel. Calibration rows are PNG files listed in JSON Lines."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from examples.yours import data
from examples.yours.train import fit
from serving.model import torchscript

SIDE = 64
MEAN, STD = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)
TRAIN_ROWS, CALIBRATION_ROWS = 1600, 300
LABELS = [f"{photo}-{corner}" for photo in data.PHOTOS
          for corner in ("top-left", "top-right", "bottom-left", "bottom-right")]


class Block(torch.nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(channels)
        self.conv2 = torch.nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(x + self.bn2(self.conv2(y)))


class Classifier(torch.nn.Module):
    """``forward(image)``: the input's name is what clients send (``--input image:...``)."""

    def __init__(self, body: torch.nn.Module) -> None:
        super().__init__()
        self.body = body

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.body(image)


def resnet(classes: int) -> torch.nn.Module:
    return Classifier(torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, stride=2, padding=1), torch.nn.BatchNorm2d(16),
        torch.nn.ReLU(), Block(16), torch.nn.Conv2d(16, 32, 3, stride=2, padding=1),
        torch.nn.ReLU(), Block(32), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
        torch.nn.Linear(32, classes)))


def small_cnn(classes: int) -> torch.nn.Module:
    return Classifier(torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 5, stride=4, padding=2), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(4), torch.nn.Flatten(), torch.nn.Linear(8 * 16, classes)))


def quadrant_patches(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Patches labelled by photo and by the quadrant their centre lies in."""
    rng = np.random.default_rng(seed)
    photos = [data.photo(name) for name in data.PHOTOS]
    out = np.empty((count, SIDE, SIDE, 3), np.uint8)
    labels = np.empty(count, np.int64)
    for i in range(count):
        k = int(rng.integers(0, len(photos)))
        image = photos[k]
        y = int(rng.integers(0, image.shape[0] - SIDE))
        x = int(rng.integers(0, image.shape[1] - SIDE))
        out[i] = image[y:y + SIDE, x:x + SIDE]
        bottom = y + SIDE // 2 >= image.shape[0] // 2
        right = x + SIDE // 2 >= image.shape[1] // 2
        labels[i] = 4 * k + 2 * bottom + right
    return out, labels


def tensors(pixels: np.ndarray) -> torch.Tensor:
    """What the release's ``--image scale=255,mean=...,std=...`` makes of the pixels."""
    x = torch.from_numpy(pixels).permute(0, 3, 1, 2).float() / 255
    return (x - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)


def build(out: Path, seed: int = 0) -> list[str]:
    """center.pt, edge.pt, calibration.jsonl and its PNG files in ``out``; the label names."""
    (out / "calibration").mkdir(parents=True, exist_ok=True)
    pixels, labels = quadrant_patches(TRAIN_ROWS + CALIBRATION_ROWS, seed)
    x, y = tensors(pixels[:TRAIN_ROWS]), torch.from_numpy(labels[:TRAIN_ROWS])
    torch.manual_seed(seed)
    center, edge = resnet(len(LABELS)), small_cnn(len(LABELS))
    fit(center, [x], y, epochs=10, seed=seed)
    fit(edge, [x], y, epochs=10, lr=3e-3, seed=seed)
    torchscript.save(torchscript.script(center), out / "center.pt")
    torchscript.save(torchscript.script(edge), out / "edge.pt")
    with (out / "calibration.jsonl").open("w") as f:
        for i in range(TRAIN_ROWS, TRAIN_ROWS + CALIBRATION_ROWS):
            name = f"calibration/{i:05d}.png"
            Image.fromarray(pixels[i]).save(out / name)
            f.write(json.dumps({"image": name, "label": LABELS[labels[i]]}) + "\n")
    return LABELS
