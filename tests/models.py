"""Deliberately broken or fragile TorchScript models for the publish pipeline's error paths."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch
from torch import Tensor, nn

from examples.sentiment.bert import TINY, BertClassifier
from serving import torchscript


class WrongSignature(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return x.float()


class NaNOutputs(nn.Module):
    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        return torch.full((input_ids.shape[0], 2), float("nan"))


class WrongShape(nn.Module):
    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        return input_ids.float()[:, :1]


def fragile_classifier(seed: int = 0) -> nn.Module:
    """Its two logits differ by far less than INT8 weight rounding: quantization flips them."""
    torch.manual_seed(seed)
    model = BertClassifier(replace(TINY, dropout=0.0)).eval()
    with torch.no_grad():
        row = model.classifier.weight[0].clone()
        model.classifier.weight[0] = row
        model.classifier.weight[1] = row + 1e-5 * torch.randn_like(row)
        model.classifier.bias.zero_()
    return model


def save_script(module: nn.Module, path: Path) -> Path:
    torchscript.save(torchscript.script(module), path)
    return path
