"""Deliberately broken or fragile TorchScript models for the publish pipeline's error paths."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch
from torch import Tensor, nn

from examples.sentiment.bert import TINY, BertClassifier
from serving.model import torchscript


class WrongSignature(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return x.float()


class NaNOutputs(nn.Module):
    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        return torch.full((input_ids.shape[0], 2), float("nan"))


class WrongShape(nn.Module):
    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        return input_ids.float()[:, :1]


class TiesUnderInt8(nn.Module):
    """fp32 says ``1`` for every input; INT8 ties, so it says ``0``: 0% agreement on any CPU.

    Features are a sigmoid of mean token embeddings, so every one is in (0, 1). The two weight
    rows share their largest entry (1.0, hence the same quantization scale) and differ elsewhere
    by 1e-4, far below half a quantization step (1/127, or 1/63 with 7-bit weights): quantized,
    the rows are identical integers and the logits tie exactly, while in fp32 row 1 wins by
    1e-4 times the sum of positive features. ``logits = f @ W.T + b`` exports as a MatMul, which
    dynamic quantization quantizes (a Gemm it would leave in fp32).
    """

    def __init__(self, vocab: int = 30522, width: int = 16) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embedding = nn.Embedding(vocab, width)
        weight = torch.zeros(2, width)
        weight[:, 0] = 1.0
        weight[1, 1:] = 1e-4
        self.weight = nn.Parameter(weight)
        self.bias = nn.Parameter(torch.zeros(2))

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        mask = attention_mask.unsqueeze(-1).float()
        mean = (self.embedding(input_ids) * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        return torch.sigmoid(mean) @ self.weight.t() + self.bias


def fragile_classifier() -> nn.Module:
    """A classifier INT8 quantization cannot keep: see ``TiesUnderInt8``."""
    return TiesUnderInt8().eval()


def confident_classifier(seed: int = 0) -> nn.Module:
    """Its logits differ by 40 on every input (bias only): INT8 cannot flip one, on any CPU."""
    torch.manual_seed(seed)
    model = BertClassifier(replace(TINY, dropout=0.0)).eval()
    with torch.no_grad():
        model.classifier.weight.zero_()
        model.classifier.bias.copy_(torch.tensor([20.0, -20.0]))
    return model


def save_script(module: nn.Module, path: Path) -> Path:
    torchscript.save(torchscript.script(module), path)
    return path
