"""A sentence-pair classifier as a user brings one from Hugging Face ``transformers`` (as NLI
models and cross-encoders are): given two statements of the 2016 debates, one the moderator's
and one a candidate's, which comes first. The answer depends on the segments: the tokenizer
encodes ``[CLS] text [SEP] text_pair [SEP]`` with ``token_type_ids`` 0 then 1, and the model
reads them. Same architecture and export as ``debates``; calibration rows carry ``text`` and
``text_pair``."""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch

from examples.yours import data, debates

LABELS = ["moderator-first", "candidate-first"]
CALIBRATION_ROWS = 300
ROWS = 1600


def pairs(seed: int) -> tuple[list[str], list[str], list[int]]:
    texts, parties = data.debates(seed)
    moderator = [t for t, p in zip(texts, parties, strict=True)
                 if data.PARTIES[p] == "Moderator"]
    candidates = [t for t, p in zip(texts, parties, strict=True)
                  if data.PARTIES[p] != "Moderator"]
    rng = random.Random(seed)
    first, second, labels = [], [], []
    for _ in range(ROWS):
        question, answer = rng.choice(moderator), rng.choice(candidates)
        label = rng.randrange(2)
        first.append(question if label == 0 else answer)
        second.append(answer if label == 0 else question)
        labels.append(label)
    return first, second, labels


def build(out: Path, seed: int = 0) -> list[str]:
    """center.pt, edge.pt, tokenizer.json and calibration.jsonl in ``out``; the label names."""
    out.mkdir(parents=True, exist_ok=True)
    texts, _ = data.debates(seed)
    tok = debates.tokenizer(texts, out / "tokenizer.json")
    first, second, labels = pairs(seed)
    train = slice(CALIBRATION_ROWS, None)
    inputs = debates.encode(tok, first[train], second[train])
    y = torch.tensor(labels[train])
    torch.manual_seed(seed)
    center = debates.bert(2, 64, len(LABELS), tok.get_vocab_size())
    edge = debates.bert(1, 32, len(LABELS), tok.get_vocab_size())
    debates.train_pair(center, edge, inputs, y, (3, 3), seed)
    debates.export(center, inputs, out / "center.pt")
    debates.export(edge, inputs, out / "edge.pt")
    with (out / "calibration.jsonl").open("w") as f:
        for a, b, label in zip(first[:CALIBRATION_ROWS], second, labels, strict=False):
            f.write(json.dumps({"text": a, "text_pair": b, "label": LABELS[label]}) + "\n")
    return LABELS
