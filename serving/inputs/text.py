"""The ``text`` kind: strings (``BYTES``) tokenized with the release's tokenizer, or token
tensors (``input_ids`` + ``attention_mask``, ``INT64``) for clients that tokenize themselves.

A row is its token ids without padding; a model call pads its rows to the longest
(``serving.model.text.pad``) and feeds ``input_ids``, ``attention_mask`` and, where the model
takes one, ``token_type_ids`` (zeros: one segment). A row's cost is its length, so the batcher
groups rows of similar length. Rows are forwarded to the center as the texts that came in (a
few bytes each), or as token tensors when tokens came in.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from serving.errors import BadRequest
from serving.inputs.base import Bounds, Feeds, encoded, one_input
from serving.model.text import file_length, load_tokenizer, pad, token_rows, unpadded
from serving.protocol import v2
from serving.release.manifest import TensorSpec, TextInput

IDS, MASK, TYPES = "input_ids", "attention_mask", "token_type_ids"
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
        self.spec, self.bounds, self.feeds = spec, bounds, names
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
        tokens = [{"name": IDS, "datatype": "INT64", "shape": [-1, -1]},
                  {"name": MASK, "datatype": "INT64", "shape": [-1, -1]}]
        if self.tokenizer is None:
            return tokens
        return [{"name": self.spec.name, "datatype": "BYTES", "shape": [-1]}, *tokens]

    def decode(self, tensors: list[v2.Tensor], parameters: dict[str, Any]) -> v2.Decoded:
        truncate = parameters.get("truncate", True)
        if not isinstance(truncate, bool):
            raise BadRequest("parameters.truncate must be a boolean")
        by_name = {t.name: t for t in tensors}
        if self.spec.name in by_name or len(tensors) < 2:
            names = {self.spec.name: "BYTES", IDS: "INT64", MASK: "INT64"}
            text = one_input(tensors, names)
            if text.name in (IDS, MASK):
                raise BadRequest(f"token input needs both {IDS!r} and {MASK!r}")
            texts = self._texts(text)
            return v2.Decoded(self._tokenize(texts, truncate), encoded(self.spec.name, texts))
        unknown = set(by_name) - {IDS, MASK}
        if unknown:
            raise BadRequest(f"unknown input {sorted(unknown)[0]!r}: this model takes "
                             f"{self.spec.name!r} (BYTES) or {IDS!r} + {MASK!r} (INT64)")
        rows = self._token_rows(by_name[IDS], by_name[MASK], truncate)

        def forward(indices: list[int]) -> list[v2.Tensor]:
            batch = pad([rows[i] for i in indices])
            return [v2.binary(IDS, "INT64", batch.input_ids),
                    v2.binary(MASK, "INT64", batch.attention_mask)]
        return v2.Decoded(rows, forward)

    def collate(self, rows: list[np.ndarray]) -> Feeds:
        feeds = pad(rows).feeds()
        if TYPES in self.feeds:
            feeds[TYPES] = np.zeros_like(feeds[IDS])
        return feeds

    def cost(self, row: np.ndarray) -> int:
        return len(row)

    def stats(self, rows: list[np.ndarray]) -> np.ndarray:
        """Each row's length in tokens and the share of them that are the tokenizer's unknown
        token (words it cannot spell: another language, another alphabet)."""
        lengths = np.fromiter((len(r) for r in rows), np.float64, len(rows))
        unknown = np.zeros(len(rows))
        if self.unknown is not None and len(rows):
            starts = np.concatenate([[0], np.cumsum(lengths[:-1])]).astype(np.intp)
            hits = (np.concatenate(rows) == self.unknown).astype(np.float64)
            unknown = np.add.reduceat(hits, starts) / np.maximum(lengths, 1)
        return np.stack([lengths, unknown], axis=1)

    def sample(self, rows: int, seed: int = 0) -> list[np.ndarray]:  # pragma: no mutate
        rng = np.random.default_rng(seed)
        top = min(self.vocab or GENERATED_VOCAB, GENERATED_VOCAB)
        return [rng.integers(1, top, size=int(rng.integers(1, min(48, self.spec.max_length)
                                                           + 1)), dtype=np.int64)
                for _ in range(rows)]

    def items(self, values: list[Any]) -> list[np.ndarray]:
        if self.tokenizer is None:
            raise ValueError("texts need the release's tokenizer")
        return token_rows(self.tokenizer, [str(v) for v in values])[0]

    def _tokenize(self, texts: list[str], truncate: bool) -> list[np.ndarray]:
        if self.tokenizer is None:
            raise BadRequest(f"this model has no tokenizer: send {IDS!r} and {MASK!r} INT64 "
                             f"tensors")
        rows, truncated = token_rows(self.tokenizer, texts)
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
            raise BadRequest(f"input {tensor.name!r}: shape must be [rows] or [rows, 1]")
        data = v2.strings(tensor)
        for i, text in enumerate(data):
            size = len(text.encode("utf-8"))  # msgspec already refused invalid UTF-8
            if size > self.bounds.max_text_bytes:
                raise BadRequest(f"input {tensor.name!r} row {i}: {size} bytes; the limit is "
                                 f"{self.bounds.max_text_bytes}")
        return data

    def _token_rows(self, ids: v2.Tensor, mask: v2.Tensor, truncate: bool) -> list[np.ndarray]:
        for tensor in (ids, mask):
            if tensor.datatype != "INT64":
                raise BadRequest(f"input {tensor.name!r} must have datatype INT64, got "
                                 f"{tensor.datatype}")
        if ids.shape != mask.shape:
            raise BadRequest(f"{IDS!r} shape {ids.shape} differs from {MASK!r} shape "
                             f"{mask.shape}")
        rows = v2.check_rows(ids, (2,), self.bounds.max_rows)
        seq, longest = ids.shape[1], self.max_sequence
        if seq > longest:
            raise BadRequest(f"input {IDS!r}: {seq} tokens per row; the limit is {longest} "
                             f"(the model takes {self.spec.max_length}, padding included)")
        id_array, mask_array = v2.array(ids), v2.array(mask)
        if not np.isin(mask_array, (0, 1)).all():
            raise BadRequest(f"{MASK!r} must hold only 0 and 1")
        if (id_array < 0).any() or (self.vocab and (id_array >= self.vocab).any()):
            raise BadRequest(f"{IDS!r} must lie in [0, {self.vocab})")
        out = []
        for i in range(rows):
            row = id_array[i][mask_array[i] == 1]
            if len(row) == 0:
                raise BadRequest(f"row {i} has no tokens (attention_mask all 0)")
            if len(row) > self.spec.max_length:
                if not truncate:
                    raise BadRequest(f"row {i} has {len(row)} tokens; the model takes "
                                     f"{self.spec.max_length} (parameters.truncate=false)")
                row = row[:self.spec.max_length]
            out.append(row)
        return out
