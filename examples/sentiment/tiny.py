"""A tiny release with the demo's architecture and tokenizer, built in seconds, for tests.

Center: 2 layers of width 32; edge: 1 layer. Both are briefly trained on real review snippets
from scratch (~62% accuracy), so their outputs carry signal and INT8 fidelity, calibration
and the cascade are exercised on real predictions, not on a constant.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import click
import torch

from examples.sentiment import data, encoder
from examples.sentiment.bert import TINY, BertClassifier
from examples.sentiment.release import write_release
from examples.sentiment.train import fine_tune, seed_everything
from serving.model.text import load_tokenizer

MAX_LENGTH = 32


def build_tiny_release(out: Path, seed: int = 0, train_rows: int = 4000,
                       calibration_rows: int = 200, flipped: bool = False) -> Path:
    """``flipped``: train on the opposite labels (and calibrate on them), as a bad training
    run would: a release that publishes fine and is worse on live traffic."""
    seed_everything(seed)
    dataset = data.split(data.load_reviews(), seed=7)
    labels = dataset.train.labels[:train_rows]
    if flipped:
        labels = [1 - label for label in labels]
    train = data.Split(dataset.train.texts[:train_rows], labels)
    tokenizer = load_tokenizer(encoder.tokenizer_path(), MAX_LENGTH)
    torch.set_num_threads(1)
    models = []
    for layers in (2, 1):
        model = BertClassifier(replace(TINY, num_layers=layers, dropout=0.0))
        models.append(fine_tune(model, tokenizer, train.texts, train.labels, seed=seed,
                                epochs=2, lr=1e-2, batch_size=64, freeze_embeddings=False))
    calibration = data.Split(dataset.val.texts[:calibration_rows],
                             [1 - label if flipped else label
                              for label in dataset.val.labels[:calibration_rows]])
    return write_release(out, models[0], models[1], encoder.tokenizer_path(), calibration,
                         MAX_LENGTH)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--out", type=click.Path(path_type=Path), required=True,
              help="Release folder to write.")
@click.option("--seed", type=int, default=0, show_default=True, help="Training seed.")
def main(out: Path, seed: int) -> None:
    """Build the tiny release (seconds): a stand-in for the full demo release in tests, e.g.
    ``TIERED_TRAINER=examples.sentiment.tiny tiered up``."""
    build_tiny_release(out, seed=seed)


if __name__ == "__main__":
    main()
