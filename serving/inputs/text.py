"""The ``text`` kind: strings (``BYTES``) tokenized with the release's tokenizer, sentence
pairs (a second ``BYTES`` input, ``TextInput.pair``) tokenized as the tokenizer joins pairs, or
token tensors (``input_ids`` + ``attention_mask`` [+ ``token_type_ids``], ``INT64``) for
clients that tokenize themselves.

A row is its token ids without padding, or, where the model takes ``token_type_ids``, ``[2,
n]``: its ids over its segment ids (the tokenizer's: 0 for the first text, 1 for the pair's
second). A model call pads its rows to the longest (``serving.model.text.pad``) and feeds
``input_ids``, ``attention_mask`` and, where the model takes one, ``token_type_ids``. A row's
cost is its length, so the batcher groups rows of similar length. Rows are forwarded to the
center as the texts that came in (a few bytes each, both inputs of a pair), or as token
tensors when tokens came in.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from serving.errors import BadRequest
from serving.inputs.base import Bounds, Feeds, encoded, one_input
from serving.inputs.tokens import IDS, MASK, TYPES, TokenLimits, token_rows
from serving.model.text import Texts, file_length, load_tokenizer, pad, unpadded
from serving.model.text import token_rows as tokenize
from serving.protocol import v2
from serving.release.manifest import TensorSpec, TextInput

MODEL_INPUTS = (IDS, MASK, TYPES)
GENERATED_VOCAB = 100  # generated token ids stay below this, so any real vocabulary fits


class TextCodec:
    kind = "text"
    inline_bytes = 64 * 1024  # tokenizing a small body is cheaper than the hop to a thread

    def __init__(self, spec: TextInput, inputs: list[TensorSpec], bounds: Bounds,
                 files: Callable[[str], Path]) -> None:
        names = [i.name for i in inputs]
        if not {IDS, MASK} <= set(names) or not set(names) <= set(MODEL_INPUTS):
            raise ValueError(f"a text model takes {IDS}, {MASK} and optionally {TYPES}; this "
                             f"one takes {names}")
        if spec.pair is not None and (spec.pair == spec.name or spec.pair in MODEL_INPUTS):
            raise ValueError(f"the pair's input {spec.pair!r} must be named apart from "
                             f"{spec.name!r} and the token inputs")
        self.spec, self.bounds, self.feeds = spec, bounds, names
        self.types = TYPES in names  # rows carry segment ids
        self.tokenizer = None
        self.max_sequence = spec.max_length
        if spec.tokenizer:
            path = files(spec.tokenizer)
            self.tokenizer = unpadded(load_tokenizer(path, spec.max_length))
            # a client tokenizing with the release's file as it is sends rows this long
            self.max_sequence = max(spec.max_length, file_length(path))
        self.vocab = self.tokenizer.get_vocab_size() if self.tokenizer else None
        unknown = getattr(self.tokenizer.model, "unk_token", None) if self.tokenizer else None
        self.unknown = self.tokenizer.token_to_id(unknown) if self.tokenizer and unknown \
            else None
        self.statistics = ["tokens", "unknown_share"]

    def metadata(self) -> list[dict[str, Any]]:
        tokens = [{"name": name, "datatype": "INT64", "shape": [-1, -1]}
                  for name in (IDS, MASK, TYPES) if name != TYPES or self.types]
        if self.tokenizer is None:
            return tokens
        texts = [n for n in (self.spec.name, self.spec.pair) if n is not None]
        return [*({"name": n, "datatype": "BYTES", "shape": [-1]} for n in texts), *tokens]

    def decode(self, tensors: list[v2.Tensor], parameters: dict[str, Any]) -> v2.Decoded:
        truncate = parameters.get("truncate", True)
        if not isinstance(truncate, bool):
            raise BadRequest("parameters.truncate must be a boolean")
        by_name = {t.name: t for t in tensors}
        token_names = {IDS, MASK, TYPES} if self.types else {IDS, MASK}
        if not set(by_name) & (token_names - {MASK}) or self.spec.name in by_name:
            return self._decode_texts(tensors, truncate)
        unknown = set(by_name) - token_names
        if unknown:
            raise BadRequest(f"unknown input {sorted(unknown)[0]!r}: this model takes "
                             f"{self._takes()}")
        if MASK not in by_name:
            raise BadRequest(f"token input needs both {IDS!r} and {MASK!r}")
        limits = TokenLimits(self.bounds.max_rows, self.spec.max_length, self.max_sequence,
                             self.vocab)
        rows = token_rows(by_name, limits, truncate, self.types)

        def forward(indices: list[int]) -> list[v2.Tensor]:
            batch = pad([rows[i] for i in indices])
            return [v2.binary(name, "INT64", values) for name, values in batch.feeds().items()]
        return v2.Decoded(rows, forward)

    def _decode_texts(self, tensors: list[v2.Tensor], truncate: bool) -> v2.Decoded:
        name, pair = self.spec.name, self.spec.pair
        names = [t.name for t in tensors]
        if names and set(names) <= {MASK}:
            raise BadRequest(f"token input needs both {IDS!r} and {MASK!r}")
        if pair is None:
            if len(names) == 2 and name in names:  # a second text: a pair, or a typo
                other = next(n for n in names if n != name)
                raise BadRequest(f"unknown input {other!r}: this model takes single texts, "
                                 f"{self._takes()}")
            text = one_input(tensors, {name: "BYTES", IDS: "INT64", MASK: "INT64"})
            texts = self._texts(text)
            return v2.Decoded(self._tokenize(texts, truncate), encoded(name, texts))
        unknown = [n for n in names if n not in (name, pair)]
        if unknown:
            raise BadRequest(f"unknown input {unknown[0]!r}: this model takes {self._takes()}")
        missing = [n for n in (name, pair) if n not in names]
        if missing or len(names) != 2:
            what = f"{missing[0]!r} is missing" if missing else "send each once"
            raise BadRequest(f"this model takes sentence pairs: send {name!r} and {pair!r} "
                             f"(BYTES, one {pair!r} per {name!r}; {what}), or {self._tokens()}")
        by_name = {t.name: t for t in tensors}
        first, second = self._texts(by_name[name]), self._texts(by_name[pair])
        if len(first) != len(second):
            raise BadRequest(f"{name!r} has {len(first)} rows, {pair!r} {len(second)}: send "
                             f"one {pair!r} per {name!r}")
        forward_first, forward_second = encoded(name, first), encoded(pair, second)
        return v2.Decoded(self._tokenize(list(zip(first, second, strict=True)), truncate),
                          lambda rows: forward_first(rows) + forward_second(rows))

    def _takes(self) -> str:
        texts = f"{self.spec.name!r} (BYTES)"
        if self.spec.pair is not None:
            texts = f"{self.spec.name!r} + {self.spec.pair!r} (BYTES, sentence pairs)"
        return f"{texts} or {self._tokens()}" if self.tokenizer else self._tokens()

    def _tokens(self) -> str:
        return f"{IDS!r} + {MASK!r}" + (f" [+ {TYPES!r}]" if self.types else "") + " (INT64)"

    def collate(self, rows: list[np.ndarray]) -> Feeds:
        feeds = pad(rows).feeds()
        if not self.types:
            feeds.pop(TYPES, None)
        elif TYPES not in feeds:  # rows of ids alone (made elsewhere): one segment
            feeds[TYPES] = np.zeros_like(feeds[IDS])
        return feeds

    def cost(self, row: np.ndarray) -> int:
        return int(row.shape[-1])

    def stats(self, rows: list[np.ndarray]) -> np.ndarray:
        """Each row's length in tokens and the share of them that are the tokenizer's unknown
        token (words it cannot spell: another language, another alphabet)."""
        lengths = np.fromiter((r.shape[-1] for r in rows), np.float64, len(rows))
        unknown = np.zeros(len(rows))
        if self.unknown is not None and len(rows):
            starts = np.concatenate([[0], np.cumsum(lengths[:-1])]).astype(np.intp)
            ids = np.concatenate([r[0] if r.ndim == 2 else r for r in rows])  # both segments
            hits = (ids == self.unknown).astype(np.float64)
            unknown = np.add.reduceat(hits, starts) / np.maximum(lengths, 1)
        return np.stack([lengths, unknown], axis=1)

    def sample(self, rows: int, seed: int = 0) -> list[np.ndarray]:  # pragma: no mutate
        rng = np.random.default_rng(seed)
        top = min(self.vocab or GENERATED_VOCAB, GENERATED_VOCAB)
        ids = [rng.integers(1, top, size=int(rng.integers(1, min(48, self.spec.max_length)
                                                          + 1)), dtype=np.int64)
               for _ in range(rows)]
        if not self.types:
            return ids
        # a pair release's rows have a second segment from some point on; others one segment
        starts = [int(rng.integers(1, max(len(r), 2))) if self.spec.pair else len(r)
                  for r in ids]
        return [np.stack([r, (np.arange(len(r)) >= s).astype(np.int64)])
                for r, s in zip(ids, starts, strict=True)]

    def items(self, values: list[Any]) -> list[np.ndarray]:
        """Rows of calibration texts, or of ``(text, text_pair)`` pairs for a pair release."""
        if self.tokenizer is None:
            raise ValueError("texts need the release's tokenizer")
        if self.spec.pair is None:
            return tokenize(self.tokenizer, [str(v) for v in values], self.types)[0]
        if not all(isinstance(v, (list, tuple)) and len(v) == 2 for v in values):
            raise ValueError(f"a pair release calibrates on pairs: every row needs "
                             f"{self.spec.name!r} and {self.spec.pair!r}")
        return tokenize(self.tokenizer, [(str(a), str(b)) for a, b in values], self.types)[0]

    def _tokenize(self, texts: Texts, truncate: bool) -> list[np.ndarray]:
        if self.tokenizer is None:
            raise BadRequest(f"this model has no tokenizer: send {IDS!r} and {MASK!r} INT64 "
                             f"tensors" + (f" (and {TYPES!r})" if self.types else ""))
        rows, truncated = tokenize(self.tokenizer, texts, self.types)
        if not truncate and any(truncated):
            raise BadRequest(f"text row {truncated.index(True)} is longer than the model's "
                             f"{self.spec.max_length} tokens (parameters.truncate=false)")
        return rows

    def _texts(self, tensor: v2.Tensor) -> list[str]:
        if tensor.datatype != "BYTES":
            raise BadRequest(f"input {tensor.name!r} must have datatype BYTES, got "
                             f"{tensor.datatype}")
        v2.check_rows(tensor, (1, 2), self.bounds.max_rows)
        if len(tensor.shape) == 2 and tensor.shape[1] != 1:
            pairs = (f"; send sentence pairs as {self.spec.name!r} and {self.spec.pair!r}"
                     if self.spec.pair else "; this model takes single texts")
            raise BadRequest(f"input {tensor.name!r}: shape must be [rows] or [rows, 1]"
                             f"{pairs}")
        data = v2.strings(tensor)
        for i, text in enumerate(data):
            size = len(text.encode("utf-8"))  # msgspec already refused invalid UTF-8
            if size > self.bounds.max_text_bytes:
                raise BadRequest(f"input {tensor.name!r} row {i}: {size} bytes; the limit is "
                                 f"{self.bounds.max_text_bytes}")
        return data
