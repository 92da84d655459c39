"""Hugging Face exports as users make them, built in the test from a small random config (no
hub): a ``BertForSequenceClassification`` traced with ``torchscript=True, return_dict=False``
(it returns the tuple ``(logits,)``), its WordPiece ``tokenizer.json``, and labelled texts to
calibrate on. Building one takes a second or two."""

from __future__ import annotations

import json
import random
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

if TYPE_CHECKING:
    from transformers import BertForSequenceClassification

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = ["the", "a", "film", "movie", "plot", "story", "actor", "actors", "scene", "scenes",
         "music", "score", "great", "good", "fine", "bad", "awful", "dull", "boring", "funny",
         "sad", "long", "short", "slow", "fast", "touching", "moving", "smart", "silly", "loved",
         "hated", "liked", "enjoyed", "watched", "again", "never", "always", "very", "too",
         "quite", "really", "not", "and", "but", "or", "so", "it", "was", "is", "this", "that",
         "one", "two", "best", "worst", "ever", "i", "we", "they"]
SEQUENCE = 8  # tokens in the tracing example; the trace serves any batch and length


def vocabulary() -> list[str]:
    """The special tokens, the words and a few WordPiece suffixes: 100 entries."""
    pieces = [f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz"]
    vocab = SPECIAL + WORDS + pieces
    return vocab + [f"##{c}{c}" for c in "abcdefghijklmnopqrstuvwxyz"][:100 - len(vocab)]


def wordpiece(path: Path) -> Path:
    """A BERT-style tokenizer (lowercase, WordPiece, ``[CLS] A [SEP]`` and ``[CLS] A [SEP] B
    [SEP]`` with segment ids) over :func:`vocabulary`, saved as ``tokenizer.json``."""
    vocab = {token: i for i, token in enumerate(vocabulary())}
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    tokenizer.decoder = decoders.WordPiece()
    tokenizer.save(str(path))
    return path


def bert(num_labels: int = 3, seed: int = 0) -> BertForSequenceClassification:
    """A random 2-layer ``BertForSequenceClassification`` (hidden 32), in eval mode; weights
    drawn wider than BERT's 0.02 so that its answers differ from text to text. Random weights
    leave near-ties that INT8 flips: with seed 0 the INT8 copy agrees on about 98% of texts
    (other seeds: 95-99%), above the fleet's 97% floor."""

    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' notices about its own deprecations
        return _bert(num_labels)


def _bert(num_labels: int) -> BertForSequenceClassification:
    from transformers import BertConfig, BertForSequenceClassification

    # PretrainedConfig's own settings (num_labels, torchscript, ...) are keyword arguments its
    # type hints leave out
    settings: dict[str, Any] = {"num_labels": num_labels, "torchscript": True,
                                "return_dict": False}
    config = BertConfig(vocab_size=len(vocabulary()), hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=128,
                        initializer_range=0.2, **settings)
    return BertForSequenceClassification(config).eval()


def trace(model: torch.nn.Module, path: Path) -> Path:
    """``torch.jit.trace`` on ``(input_ids, attention_mask, token_type_ids)``, as the
    Hugging Face TorchScript guide does, saved to ``path``."""
    ids = torch.randint(5, len(vocabulary()), (2, SEQUENCE), generator=torch.Generator()
                        .manual_seed(0))
    example = (ids, torch.ones_like(ids), torch.zeros_like(ids))
    with torch.no_grad(), warnings.catch_warnings():
        # the tracer warns of the Python branches in transformers' masking code; the trace
        # still serves any batch and length (the tests compare it with the model)
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(model, example, strict=False)
        torch.jit.save(traced, str(path))
    return path


def bert_export(folder: Path, num_labels: int = 3, seed: int = 0) -> tuple[Path, Path]:
    """``model.pt`` (traced, returns ``(logits,)``) and ``tokenizer.json`` in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    return (trace(bert(num_labels, seed), folder / "model.pt"),
            wordpiece(folder / "tokenizer.json"))


def sentences(rows: int, seed: int = 0) -> list[str]:
    """Texts of 3 to 12 words of :data:`WORDS` (now and then an unknown one)."""
    rng = random.Random(seed)
    return [" ".join(rng.choice([*WORDS, "zebra"]) for _ in range(rng.randint(3, 12)))
            for _ in range(rows)]


def calibration(path: Path, rows: int = 64, num_labels: int = 3, seed: int = 0) -> Path:
    """JSON Lines ``{"text", "label"}`` with labels drawn at random (the model is random too:
    the split calibrates a threshold, it measures no skill)."""
    rng = random.Random(seed + 1)
    lines = [json.dumps({"text": text, "label": rng.randrange(num_labels)})
             for text in sentences(rows, seed)]
    path.write_text("\n".join(lines) + "\n")
    return path


class DictOutput(torch.nn.Module):
    """The model answering ``{"hidden": ..., "logits": ...}``: the mean token embedding (as
    wide as the model, so that taking it for the logits would not fail a shape check) first."""

    def __init__(self, model: BertForSequenceClassification) -> None:
        super().__init__()
        self.model = model
        self.embeddings = model.get_input_embeddings()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        hidden = self.embeddings(input_ids).mean(1)
        return {"hidden": hidden,
                "logits": self.model(input_ids, attention_mask, token_type_ids)[0]}


class LogitsSecond(DictOutput):
    """The model answering ``(hidden, logits)``."""

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,  # type: ignore[override]
                token_type_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = super().forward(input_ids, attention_mask, token_type_ids)
        return out["hidden"], out["logits"]


def variant(folder: Path, wrapper: type[DictOutput], seed: int = 0) -> tuple[Path, Path]:
    """``model.pt`` (``wrapper`` around :func:`bert`, traced; a dict output is traced
    non-strict, as ``torch.jit.trace`` requires) and ``tokenizer.json`` in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    return (trace(wrapper(bert(seed=seed)), folder / "model.pt"),
            wordpiece(folder / "tokenizer.json"))
