"""Tokenization shared by the publish pipeline, the center and the edge."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np
from tokenizers import Tokenizer

Texts = list[str] | list[tuple[str, str]]
"""Single texts, or sentence pairs (``text``, ``text_pair``) encoded as the tokenizer's
post-processor joins them (BERT: ``[CLS] a [SEP] b [SEP]``, segment ids 0 then 1)."""


@dataclass(frozen=True)
class Encoded:
    input_ids: np.ndarray  # int64 [batch, seq]
    attention_mask: np.ndarray  # int64 [batch, seq]
    token_type_ids: np.ndarray | None = None  # int64 [batch, seq], where rows carry them

    def feeds(self) -> dict[str, np.ndarray]:
        feeds = {"input_ids": self.input_ids, "attention_mask": self.attention_mask}
        if self.token_type_ids is not None:
            feeds["token_type_ids"] = self.token_type_ids
        return feeds


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


def token_rows(tokenizer: Tokenizer, texts: Texts,
               types: bool = False) -> tuple[list[np.ndarray], list[bool]]:
    """Token ids per text or pair (truncated to the tokenizer's limit, pairs longest first)
    and whether each was truncated. With ``types`` a row is ``[2, n]``: its ids over the
    tokenizer's segment (token type) ids."""
    # one text (most requests): encode, without encode_batch's set-up for a parallel batch
    if len(texts) == 1:
        first = texts[0]
        batch = [tokenizer.encode(first) if isinstance(first, str)
                 else tokenizer.encode(first[0], first[1])]
    else:
        batch = tokenizer.encode_batch(list(texts))
    rows = ([np.asarray([e.ids, e.type_ids], dtype=np.int64).reshape(2, -1) for e in batch]
            if types else [np.asarray(e.ids, dtype=np.int64) for e in batch])
    return rows, [bool(e.overflowing) for e in batch]


def pad(rows: list[np.ndarray], pad_id: int = 0) -> Encoded:
    """Right-pad rows to the longest one, with the matching attention mask; rows of shape
    ``[2, n]`` (ids over segment ids) pad their segment ids with 0 too."""
    longest = max(r.shape[-1] for r in rows)
    ids = np.full((len(rows), longest), pad_id, dtype=np.int64)
    mask = np.zeros((len(rows), longest), dtype=np.int64)
    types = np.zeros((len(rows), longest), dtype=np.int64) if rows[0].ndim == 2 else None
    for i, row in enumerate(rows):
        n = row.shape[-1]
        mask[i, :n] = 1
        if types is None:
            ids[i, :n] = row
        else:
            ids[i, :n], types[i, :n] = row[0], row[1]
    return Encoded(ids, mask, types)
