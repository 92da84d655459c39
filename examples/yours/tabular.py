"""A tabular classifier as a user brings one: an MLP over the 30 breast-cancer measurements
(the center) and a logistic regression over the same (the edge), both taking raw features
(standardization is inside the model), scripted to TorchScript, with an ``.npz`` calibration
split (``features`` and ``labels``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from examples.yours import data
from examples.yours.train import fit
from serving.model import torchscript

CALIBRATION_ROWS = 200


class Standardized(torch.nn.Module):
    def __init__(self, body: torch.nn.Module, mean: torch.Tensor, std: torch.Tensor) -> None:
        super().__init__()
        self.body = body
        self.mean = torch.nn.Buffer(mean)
        self.std = torch.nn.Buffer(std)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.body((features - self.mean) / self.std)


def build(out: Path, seed: int = 0) -> list[str]:
    """center.pt, edge.pt and calibration.npz in ``out``; returns the label names."""
    out.mkdir(parents=True, exist_ok=True)
    x, y, labels = data.breast_cancer()
    order = np.random.default_rng(seed).permutation(len(y))
    cal, train = order[:CALIBRATION_ROWS], order[CALIBRATION_ROWS:]
    xt, yt = torch.from_numpy(x[train]), torch.from_numpy(y[train])
    mean, std = xt.mean(0), xt.std(0) + 1e-6
    torch.manual_seed(seed)
    center = Standardized(torch.nn.Sequential(
        torch.nn.Linear(30, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
        torch.nn.Linear(64, 2)), mean, std)
    edge = Standardized(torch.nn.Linear(30, 2), mean, std)
    fit(center, [xt], yt, epochs=60, seed=seed)
    fit(edge, [xt], yt, epochs=10, lr=3e-3, seed=seed)  # a linear model: less sure near the line
    torchscript.save(torchscript.script(center), out / "center.pt")
    torchscript.save(torchscript.script(edge), out / "edge.pt")
    np.savez(out / "calibration.npz", features=x[cal], labels=y[cal])
    return labels
