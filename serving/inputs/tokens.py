"""Token tensors a client tokenized itself (``input_ids``, ``attention_mask`` and, for a model
that takes them, ``token_type_ids``; all ``INT64``, one shape): checked against the model's
vocabulary, length and segment ids, and cut to each row's real tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from serving.errors import BadRequest
from serving.protocol import v2

IDS, MASK, TYPES = "input_ids", "attention_mask", "token_type_ids"


@dataclass(frozen=True)
class TokenLimits:
    max_rows: int
    max_length: int  # tokens the model takes; longer rows are truncated (or refused)
    max_sequence: int  # the longest row accepted, padding included
    vocab: int | None  # ids must lie below it (None: unknown)


def token_rows(tensors: dict[str, v2.Tensor], limits: TokenLimits, truncate: bool,
               types: bool) -> list[np.ndarray]:
    """Each row's tokens where its mask is 1: ids, or ``[2, n]`` ids over segment ids when
    ``types`` (the model takes ``token_type_ids``; zeros when the client sent none)."""
    ids, mask, segments = tensors[IDS], tensors[MASK], tensors.get(TYPES)
    sent = [t for t in (ids, mask, segments) if t is not None]
    for tensor in sent:
        if tensor.datatype != "INT64":
            raise BadRequest(f"input {tensor.name!r} must have datatype INT64, got "
                             f"{tensor.datatype}")
    for tensor in sent[1:]:
        if tensor.shape != ids.shape:
            raise BadRequest(f"{IDS!r} shape {ids.shape} differs from {tensor.name!r} shape "
                             f"{tensor.shape}")
    rows = v2.check_rows(ids, (2,), limits.max_rows)
    seq = ids.shape[1]
    if seq > limits.max_sequence:
        raise BadRequest(f"input {IDS!r}: {seq} tokens per row; the limit is "
                         f"{limits.max_sequence} (the model takes {limits.max_length}, padding "
                         f"included)")
    id_array, mask_array = v2.array(ids), v2.array(mask)
    type_array = v2.array(segments) if segments is not None else np.zeros_like(id_array)
    if not np.isin(mask_array, (0, 1)).all():
        raise BadRequest(f"{MASK!r} must hold only 0 and 1")
    if not np.isin(type_array, (0, 1)).all():
        raise BadRequest(f"{TYPES!r} must hold only 0 and 1 (segment A, segment B)")
    if (id_array < 0).any() or (limits.vocab and (id_array >= limits.vocab).any()):
        raise BadRequest(f"{IDS!r} must lie in [0, {limits.vocab})")
    out = []
    for i in range(rows):
        keep = mask_array[i] == 1
        row = np.stack([id_array[i][keep], type_array[i][keep]]) if types else id_array[i][keep]
        if row.shape[-1] == 0:
            raise BadRequest(f"row {i} has no tokens (attention_mask all 0)")
        if row.shape[-1] > limits.max_length:
            if not truncate:
                raise BadRequest(f"row {i} has {row.shape[-1]} tokens; the model takes "
                                 f"{limits.max_length} (parameters.truncate=false)")
            row = row[..., :limits.max_length]
        out.append(row)
    return out
