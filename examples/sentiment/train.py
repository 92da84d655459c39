"""Fine-tuning and evaluation loops for the demo models (seeded, CPU)."""

from __future__ import annotations

import random
from collections.abc import Callable

import numpy as np
import torch
from tokenizers import Tokenizer
from torch import nn
from torch.nn import functional as F

from serving.model.text import encode

Progress = Callable[[int], None]


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _batch(tokenizer: Tokenizer, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    enc = encode(tokenizer, texts)
    return torch.from_numpy(enc.input_ids), torch.from_numpy(enc.attention_mask)


def fine_tune(model: nn.Module, tokenizer: Tokenizer, texts: list[str], labels: list[int], *,
              seed: int, epochs: int = 1, batch_size: int = 32, lr: float = 5e-5,
              teacher: np.ndarray | None = None, temperature: float = 2.0, alpha: float = 0.5,
              freeze_embeddings: bool = True,
              progress: Progress | None = None) -> nn.Module:
    """Cross-entropy fine-tuning; with ``teacher`` logits, mixed with distillation (Hinton).

    Word embeddings stay frozen by default: they are most of the parameters and the data is
    small (a randomly initialised tiny model must train them).
    """
    seed_everything(seed)
    model.train()
    for name, param in model.named_parameters():
        param.requires_grad = not (freeze_embeddings and "word_embeddings" in name)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    steps = epochs * ((len(texts) + batch_size - 1) // batch_size)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=steps,
                                                    pct_start=0.1)
    y = torch.tensor(labels)
    soft = None if teacher is None else torch.from_numpy(teacher)
    rng = np.random.default_rng(seed)
    for _ in range(epochs):
        order = rng.permutation(len(texts))
        for start in range(0, len(texts), batch_size):
            idx = order[start:start + batch_size]
            ids, mask = _batch(tokenizer, [texts[i] for i in idx])
            logits = model(ids, mask)
            loss = F.cross_entropy(logits, y[idx])
            if soft is not None:
                kd = F.kl_div(F.log_softmax(logits / temperature, -1),
                              F.softmax(soft[idx] / temperature, -1), reduction="batchmean")
                loss = (1 - alpha) * loss + alpha * kd * temperature**2
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
            if progress:
                progress(len(idx))
    return model.eval()


def predict_logits(model: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                   tokenizer: Tokenizer, texts: list[str], batch_size: int = 64,
                   progress: Progress | None = None) -> np.ndarray:
    parts = []
    with torch.inference_mode():
        for start in range(0, len(texts), batch_size):
            chunk = texts[start:start + batch_size]
            parts.append(model(*_batch(tokenizer, chunk)).float().numpy())
            if progress:
                progress(len(chunk))
    return np.concatenate(parts)


def accuracy(logits: np.ndarray, labels: list[int]) -> float:
    return float((logits.argmax(1) == np.asarray(labels)).mean())
