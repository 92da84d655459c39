"""Write a release folder (``tiered.json`` + files) that ``registry publish`` accepts."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from examples.sentiment.data import LABELS, Split
from serving.model import torchscript

CENTER, EDGE, TOKENIZER, CALIBRATION = "center.pt", "edge.pt", "tokenizer.json", \
    "calibration.jsonl"


def write_release(out: Path, center: torch.nn.Module, edge: torch.nn.Module, tokenizer: Path,
                  calibration: Split, max_length: int) -> Path:
    """Script both models to TorchScript and lay out the folder; returns ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    torchscript.save(torchscript.script(center), out / CENTER)
    torchscript.save(torchscript.script(edge), out / EDGE)
    shutil.copyfile(tokenizer, out / TOKENIZER)
    with (out / CALIBRATION).open("w", encoding="utf-8") as f:
        for text, label in zip(calibration.texts, calibration.labels, strict=True):
            f.write(json.dumps({"text": text, "label": LABELS[label]}) + "\n")
    spec = {"labels": LABELS, "center": CENTER, "edge": EDGE, "tokenizer": TOKENIZER,
            "max_length": max_length, "calibration": CALIBRATION}
    (out / "tiered.json").write_text(json.dumps(spec, indent=2) + "\n")
    return out
