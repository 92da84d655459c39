"""Tokenization shared by the publish pipeline, the center and the edge."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np
from tokenizers import Tokenizer


@dataclass(frozen=True)
class Encoded:
    input_ids: np.ndarray  # int64 [batch, seq]
    attention_mask: np.ndarray  # int64 [batch, seq]

    def feeds(self) -> dict[str, np.ndarray]:
        return {"input_ids": self.input_ids, "attention_mask": self.attention_mask}


def load_tokenizer(path: Path, max_length: int) -> Tokenizer:
    """A tokenizer that truncates to ``max_length`` and pads only to the longest input.

    Tokenizer files such as MiniLM's pad every input to a fixed 128 tokens, which makes every
    batch pay for 128 positions; padding to the longest input of the batch avoids that.
    """
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.enable_truncation(max_length=max_length)
    padding = tokenizer.padding or {}
    tokenizer.enable_padding(pad_id=padding.get("pad_id", 0),
                             pad_token=padding.get("pad_token", "[PAD]"))
    return tokenizer


class _Truncation(msgspec.Struct):
    max_length: int = 0


class _Padding(msgspec.Struct):
    strategy: dict[str, int] | str = ""  # {"Fixed": n} or "BatchLongest"


class _TokenizerFile(msgspec.Struct):
    truncation: _Truncation | None = None
    padding: _Padding | None = None


def file_length(path: Path) -> int:
    """The longest row the tokenizer file's own settings produce (its fixed padding or its
    truncation length; 0 when neither is set). A client tokenizing with the release's file
    as it is (MiniLM's pads every row to 128) sends rows this long, longer than the model's
    ``max_length``; the servers accept that much padding and no more."""
    try:
        settings = msgspec.json.decode(path.read_bytes(), type=_TokenizerFile)
    except (msgspec.DecodeError, msgspec.ValidationError):  # a layout we do not know
        return 0
    fixed = settings.padding.strategy if settings.padding else ""
    return max(settings.truncation.max_length if settings.truncation else 0,
               fixed.get("Fixed", 0) if isinstance(fixed, dict) else 0)


def encode(tokenizer: Tokenizer, texts: list[str]) -> Encoded:
    batch = tokenizer.encode_batch(texts)
    return Encoded(
        input_ids=np.asarray([e.ids for e in batch], dtype=np.int64),
        attention_mask=np.asarray([e.attention_mask for e in batch], dtype=np.int64),
    )


def unpadded(tokenizer: Tokenizer) -> Tokenizer:
    """A copy that truncates but never pads: rows are padded per batch by the batcher."""
    copy = Tokenizer.from_str(tokenizer.to_str())
    copy.no_padding()
    return copy


def token_rows(tokenizer: Tokenizer, texts: list[str]) -> tuple[list[np.ndarray], list[bool]]:
    """Token ids per text (truncated to the tokenizer's limit) and whether each was truncated."""
    # one text (most requests): encode, without encode_batch's set-up for a parallel batch
    batch = [tokenizer.encode(texts[0])] if len(texts) == 1 else tokenizer.encode_batch(texts)
    return ([np.asarray(e.ids, dtype=np.int64) for e in batch],
            [bool(e.overflowing) for e in batch])


def pad(rows: list[np.ndarray], pad_id: int = 0) -> Encoded:
    """Right-pad rows to the longest one, with the matching attention mask."""
    longest = max(len(r) for r in rows)
    ids = np.full((len(rows), longest), pad_id, dtype=np.int64)
    mask = np.zeros((len(rows), longest), dtype=np.int64)
    for i, row in enumerate(rows):
        ids[i, :len(row)] = row
        mask[i, :len(row)] = 1
    return Encoded(ids, mask)
