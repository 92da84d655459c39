"""A text classifier as a user brings one from Hugging Face ``transformers``: which side of the
2016 US debates said a statement (Democratic, Republican or the moderator).
``BertForSequenceClassification`` built from a small config (no download), trained a few
seconds, traced for TorchScript the way transformers documents it (``torchscript=True``,
``return_dict=False``: the export returns a tuple ``(logits,)``); its WordPiece tokenizer is
trained on the statements and saved as ``tokenizer.json``. The center has two layers, the edge
one, narrower."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch
from tokenizers import Tokenizer
from tokenizers.implementations import BertWordPieceTokenizer

from examples.yours import data
from examples.yours.train import fit

MAX_LENGTH = 64
CALIBRATION_ROWS = 300
VOCAB = 3000


def tokenizer(texts: list[str], path: Path) -> Tokenizer:
    """A BERT WordPiece tokenizer trained on ``texts`` (its pair template included)."""
    trainer = BertWordPieceTokenizer(lowercase=True)
    trainer.train_from_iterator(iter(texts), vocab_size=VOCAB, min_frequency=2, show_progress=False)
    trainer.save(str(path))
    loaded = Tokenizer.from_file(str(path))
    loaded.enable_truncation(MAX_LENGTH)
    loaded.enable_padding()
    return loaded


def bert(layers: int, hidden: int, labels: int, vocab: int) -> torch.nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    # transformers types its config's keyword arguments only in part
    config = BertConfig(vocab_size=vocab, hidden_size=hidden,  # type: ignore[call-arg]
                        num_hidden_layers=layers, num_attention_heads=2,
                        intermediate_size=2 * hidden, max_position_embeddings=MAX_LENGTH,
                        num_labels=labels, torchscript=True, return_dict=False)
    return BertForSequenceClassification(config)


def encode(tok: Tokenizer, texts: list[str],
           pairs: list[str] | None = None) -> list[torch.Tensor]:
    batch = tok.encode_batch(list(zip(texts, pairs, strict=True)) if pairs else texts)
    return [torch.tensor([getattr(e, field) for e in batch]) for field in
            ("ids", "attention_mask", "type_ids")]


def export(model: torch.nn.Module, example: list[torch.Tensor], path: Path) -> None:
    """``torch.jit.trace`` as the transformers docs show it; the export is left as it comes."""
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.jit.trace(model.eval(), tuple(x[:2] for x in example)).save(str(path))


def train_pair(center: torch.nn.Module, edge: torch.nn.Module, inputs: list[torch.Tensor],
               labels: torch.Tensor, epochs: tuple[int, int], seed: int) -> None:
    fit(center, inputs, labels, epochs=epochs[0], lr=2e-3, seed=seed,
        forward=lambda *x: center(*x)[0])
    fit(edge, inputs, labels, epochs=epochs[1], lr=2e-3, seed=seed,
        forward=lambda *x: edge(*x)[0])


def build(out: Path, seed: int = 0) -> list[str]:
    """center.pt, edge.pt, tokenizer.json and calibration.jsonl in ``out``; the label names."""
    out.mkdir(parents=True, exist_ok=True)
    texts, labels = data.debates(seed)
    tok = tokenizer(texts, out / "tokenizer.json")
    train = slice(CALIBRATION_ROWS, None)
    inputs = encode(tok, texts[train])
    y = torch.tensor(labels[train])
    torch.manual_seed(seed)
    center = bert(2, 64, len(data.PARTIES), tok.get_vocab_size())
    edge = bert(1, 32, len(data.PARTIES), tok.get_vocab_size())
    train_pair(center, edge, inputs, y, (6, 6), seed)
    export(center, inputs, out / "center.pt")
    export(edge, inputs, out / "edge.pt")
    with (out / "calibration.jsonl").open("w") as f:
        for text, label in zip(texts[:CALIBRATION_ROWS], labels, strict=False):
            f.write(json.dumps({"text": text, "label": data.PARTIES[label]}) + "\n")
    return data.PARTIES
