"""A few seconds of Adam on CPU: how the example models here are trained (a user trains theirs
however they like; Tiered sees only the exported files)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

Batch = Sequence[torch.Tensor]


def fit(model: torch.nn.Module, inputs: Batch, labels: torch.Tensor, *, epochs: int,
        batch: int = 32, lr: float = 1e-3, seed: int = 0,
        forward: Callable[..., torch.Tensor] | None = None) -> torch.nn.Module:
    """Cross-entropy on ``inputs`` (tensors with rows first) for ``epochs``; returns the model
    in eval mode. ``forward`` turns a batch into logits (default: ``model(*batch)``)."""
    torch.manual_seed(seed)
    run = forward or model
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(labels))
        for start in range(0, len(order), batch):
            rows = order[start:start + batch]
            loss = torch.nn.functional.cross_entropy(run(*[x[rows] for x in inputs]),
                                                     labels[rows])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return model.eval()


def accuracy(logits: torch.Tensor, labels: torch.Tensor) -> float:
    return float((logits.argmax(1) == labels).float().mean())
