"""Request decoders for protocol tests: the real text codec over the demo's tokenizer, with
the small limits the tests probe both sides of."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from serving.inputs.base import Bounds
from serving.inputs.text import TextCodec
from serving.model.text import pad
from serving.protocol import v2
from serving.release.manifest import TensorSpec, TextInput

TOKENS = [TensorSpec("input_ids", "INT64", [-1, -1]),
          TensorSpec("attention_mask", "INT64", [-1, -1])]


def text_codec(max_rows: int = 4, max_text_bytes: int = 50, max_length: int = 4,
               vocab_size: int | None = 1000, max_sequence: int = 0) -> TextCodec:
    """A text codec: ``max_length`` tokens kept, rows padded up to ``max_sequence`` accepted,
    token ids below ``vocab_size``."""
    from examples.sentiment.encoder import tokenizer_path

    codec = TextCodec(TextInput(tokenizer="tokenizer.json", max_length=max_length), TOKENS,
                      Bounds(max_rows=max_rows, max_text_bytes=max_text_bytes),
                      lambda _: tokenizer_path())
    codec.max_sequence = max_sequence or max_length
    codec.vocab = vocab_size
    return codec


def texts_of(parsed: v2.Parsed) -> list[str] | None:
    """The texts a request carried (as forwarded to a center), None for token tensors."""
    (tensor, *_) = parsed.inputs.forward(list(range(parsed.rows)))
    if tensor.datatype != "BYTES":
        return None
    return v2.strings(tensor)


def token_feeds(rows: list[np.ndarray]) -> dict[str, np.ndarray]:
    """Token rows padded into one call's feeds, as the text codec collates them."""
    return pad(rows).feeds()


TOKEN_BATCHING = (token_feeds, len)  # a Batcher's collate and cost for token rows


def decoded(rows: list[np.ndarray], texts: list[str] | None = None) -> v2.Decoded:
    """Rows as a text codec decodes them: forwarded as ``texts`` when given, else as tokens."""
    def forward(indices: list[int]) -> list[v2.Tensor]:
        if texts is not None:
            return [v2.binary("text", "BYTES", [texts[i] for i in indices])]
        batch = token_feeds([rows[i] for i in indices])
        return [v2.binary(name, "INT64", values) for name, values in batch.items()]
    return v2.Decoded(rows, forward)


def received(content: bytes, header_length: str | None) -> dict[str, Any]:
    """A V2 REST request body as a server receives it, binary tensors (the binary extension)
    decoded into each input's flat ``data`` (strings for BYTES)."""
    length = int(header_length) if header_length else len(content)
    body: dict[str, Any] = json.loads(content[:length])
    offset = length
    for item in body["inputs"]:
        size = item.get("parameters", {}).get("binary_data_size")
        if size is None:
            continue
        tensor = v2.Tensor(item["name"], item["shape"], item["datatype"],
                           raw=content[offset:offset + size])
        offset += size
        item["data"] = (v2.strings(tensor) if item["datatype"] == "BYTES"
                        else v2.array(tensor).ravel().tolist())
    return body
