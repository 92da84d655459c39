"""Models a user publishes as a cascade (``registry publish CENTER --edge EDGE``), trained in
seconds on data that ships with scikit-learn: a wide MLP center and a logistic edge on the
handwritten digits as a table, and a CNN on 32x32 RGB patches of the two sample
photos (china, flower); the data files are read as scikit-learn ships them."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from examples.sentiment.data import package_file
from examples.yours import data
from tests.kinds import torchscript_file


class Mlp(nn.Module):
    """Raw features in (standardised inside), ``hidden`` wide layers (none: logistic)."""

    def __init__(self, mean: Tensor, std: Tensor, hidden: list[int], classes: int) -> None:
        super().__init__()
        # buffers assigned, not annotated: TorchScript cannot read a postponed annotation
        self.mean, self.std = nn.Buffer(mean), nn.Buffer(std)
        widths = [mean.shape[0], *hidden]
        layers: list[nn.Module] = []
        for a, b in itertools.pairwise(widths):
            layers += [nn.Linear(a, b), nn.ReLU()]
        self.net = nn.Sequential(*layers, nn.Linear(widths[-1], classes))

    def forward(self, features: Tensor) -> Tensor:
        return self.net((features - self.mean) / self.std)


def _train(model: nn.Module, x: Tensor, y: Tensor, steps: int, lr: float) -> nn.Module:
    optimiser = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(steps):
        optimiser.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimiser.step()
    return model.eval()


def digits(out: Path) -> tuple[Path, Path, Path]:
    """``center.pt`` (64-256-256-10), ``edge.pt`` (logistic, ~130x fewer FLOPs, briefly
    trained: less sure, and less often right) and ``calibration.npz``: the 8x8 handwritten
    digits as 64 features, trained on the even rows, calibrated on the odd ones."""
    import gzip

    raw = gzip.decompress(package_file("scikit-learn", "sklearn/datasets/data/digits.csv.gz")
                          .read_bytes()).decode()
    table = np.loadtxt(raw.splitlines(), delimiter=",")
    x, y = table[:, :-1].astype(np.float32), table[:, -1].astype(np.int64)
    train = torch.from_numpy(x[::2]), torch.from_numpy(y[::2])
    mean, std = train[0].mean(0), train[0].std(0).clamp(min=1.0)
    torch.manual_seed(0)
    center = _train(Mlp(mean, std, [256, 256], 10), *train, steps=80, lr=0.003)
    edge = _train(Mlp(mean, std, [], 10), *train, steps=8, lr=0.05)
    out.mkdir(parents=True, exist_ok=True)
    np.savez(out / "calibration.npz", features=x[1::2], labels=y[1::2])
    return (torchscript_file(center, out / "center.pt"), torchscript_file(edge, out / "edge.pt"),
            out / "calibration.npz")


class Patches(nn.Module):
    """Two convolutions and a wide head: ~0.5 M weights, an INT8 edge of ~0.5 MiB."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
                                      nn.MaxPool2d(2))
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(32 * 8 * 8, 256), nn.ReLU(),
                                  nn.Linear(256, 2))

    def forward(self, image: Tensor) -> Tensor:
        return self.head(self.features(image))


def photo_patches(out: Path, rows: int = 256) -> tuple[Path, Path]:
    """``patches.pt`` (input ``image:FP32:-1,3,32,32``, labels ``china,flower``: which sample
    photo a patch is from) and the ``calibration.jsonl`` of its PNG patches."""
    from PIL import Image

    photos = [data.photo(name) for name in data.PHOTOS]  # china, flower
    rng = np.random.default_rng(0)
    labels = np.arange(rows) % 2
    patches = np.stack([_patch(photos[label], rng) for label in labels])
    x = torch.from_numpy(patches.transpose(0, 3, 1, 2) / np.float32(255))
    torch.manual_seed(0)
    model = _train(Patches(), x, torch.from_numpy(labels), steps=20, lr=0.003)
    (out / "cal").mkdir(parents=True, exist_ok=True)
    lines = []
    for i, patch in enumerate(patches):
        Image.fromarray(patch, "RGB").save(out / "cal" / f"{i:03d}.png")
        lines.append(json.dumps({"image": f"cal/{i:03d}.png",
                                 "label": ["china", "flower"][labels[i]]}))
    (out / "calibration.jsonl").write_text("\n".join(lines) + "\n")
    return torchscript_file(model, out / "patches.pt"), out / "calibration.jsonl"


def _patch(photo: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    top, left = rng.integers(0, photo.shape[0] - 32), rng.integers(0, photo.shape[1] - 32)
    return np.ascontiguousarray(photo[top:top + 32, left:left + 32])
