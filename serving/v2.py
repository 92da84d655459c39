"""The Open Inference Protocol (KServe V2) REST codec: request parsing, validation, responses.

Text arrives as one ``BYTES`` input named ``text`` (a list of strings); token tensors arrive as
``INT64`` inputs ``input_ids`` and ``attention_mask``. Every client mistake becomes a
``BadRequest`` with a message that names the field, never a 500.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np

from serving.errors import BadRequest

TEXT, IDS, MASK = "text", "input_ids", "attention_mask"
Scalar = str | int | float | bool | None


class RequestInput(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    shape: list[int]
    datatype: str
    data: list[Any]
    parameters: dict[str, Any] = {}


class RequestOutput(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    parameters: dict[str, Any] = {}


class InferRequest(msgspec.Struct, forbid_unknown_fields=True):
    inputs: list[RequestInput]
    id: str | None = None
    parameters: dict[str, Any] = {}
    outputs: list[RequestOutput] | None = None


class ResponseOutput(msgspec.Struct):
    name: str
    shape: list[int]
    datatype: str
    data: list[Any]


class InferResponse(msgspec.Struct, omit_defaults=True):
    model_name: str
    model_version: str
    outputs: list[ResponseOutput]
    id: str | None = None
    parameters: dict[str, Any] = {}


@dataclass(frozen=True)
class Limits:
    max_rows: int  # rows per request
    max_text_bytes: int  # one string, before tokenization
    max_length: int  # tokens the model accepts; longer inputs are truncated unless refused
    vocab_size: int | None  # token ids must be below this (None: unknown)


@dataclass(frozen=True)
class Parsed:
    """A validated request: either texts or token rows (ids without padding)."""

    id: str | None
    parameters: dict[str, Any]
    texts: list[str] | None
    token_rows: list[np.ndarray] | None
    outputs: list[str] | None

    @property
    def rows(self) -> int:
        return len(self.texts) if self.texts is not None else len(self.token_rows or [])


def decode(body: bytes) -> InferRequest:
    if not body:
        raise BadRequest("empty request body: expected a V2 inference request (JSON)")
    try:
        return msgspec.json.decode(body, type=InferRequest)
    except msgspec.ValidationError as exc:
        raise BadRequest(f"invalid inference request: {exc}") from exc
    except msgspec.DecodeError as exc:
        raise BadRequest(f"malformed JSON: {exc}") from exc


def parse(body: bytes, limits: Limits) -> Parsed:
    request = decode(body)
    names = [i.name for i in request.inputs]
    if len(set(names)) != len(names):
        raise BadRequest(f"duplicate input names: {names}")
    by_name = {i.name: i for i in request.inputs}
    unknown = set(by_name) - {TEXT, IDS, MASK}
    if unknown:
        raise BadRequest(f"unknown input {sorted(unknown)[0]!r}: expected {TEXT!r} (BYTES) or "
                         f"{IDS!r} + {MASK!r} (INT64)")
    truncate = request.parameters.get("truncate", True)
    if not isinstance(truncate, bool):
        raise BadRequest("parameters.truncate must be a boolean")
    outputs = [o.name for o in request.outputs] if request.outputs is not None else None
    if TEXT in by_name:
        if len(by_name) != 1:
            raise BadRequest(f"send either {TEXT!r} or token tensors, not both")
        texts = _texts(by_name[TEXT], limits)
        return Parsed(request.id, request.parameters, texts, None, outputs)
    if set(by_name) != {IDS, MASK}:
        raise BadRequest(f"token input needs both {IDS!r} and {MASK!r}")
    rows = _token_rows(by_name[IDS], by_name[MASK], limits, truncate)
    return Parsed(request.id, request.parameters, None, rows, outputs)


def _flatten(data: list[Any]) -> list[Any]:
    """V2 allows row-major nested lists as well as flat ones."""
    flat: list[Any] = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            flat.append(item)
        else:
            stack.pop()
    return flat


def _shape_rows(tensor: RequestInput, rank: tuple[int, ...]) -> list[Any]:
    if len(tensor.shape) not in rank or any(d < 0 for d in tensor.shape):
        raise BadRequest(f"input {tensor.name!r}: shape {tensor.shape} is not valid here")
    data = _flatten(tensor.data)
    expected = int(np.prod(tensor.shape)) if tensor.shape else 0
    if expected != len(data):
        raise BadRequest(f"input {tensor.name!r}: shape {tensor.shape} holds {expected} "
                         f"elements but data has {len(data)}")
    return data


def _check_rows(name: str, rows: int, limits: Limits) -> None:
    if rows == 0:
        raise BadRequest(f"input {name!r} is an empty batch")
    if rows > limits.max_rows:
        raise BadRequest(f"input {name!r} has {rows} rows; the limit is {limits.max_rows}")


def _texts(tensor: RequestInput, limits: Limits) -> list[str]:
    if tensor.datatype != "BYTES":
        raise BadRequest(f"input {TEXT!r} must have datatype BYTES, got {tensor.datatype}")
    data = _shape_rows(tensor, (1, 2))
    if len(tensor.shape) == 2 and tensor.shape[1] != 1:
        raise BadRequest(f"input {TEXT!r}: shape must be [rows] or [rows, 1]")
    _check_rows(TEXT, len(data), limits)
    for i, text in enumerate(data):
        if not isinstance(text, str):
            raise BadRequest(f"input {TEXT!r} row {i}: expected a string, got "
                             f"{type(text).__name__}")
        size = len(text.encode("utf-8"))  # msgspec already refused invalid UTF-8/surrogates
        if size > limits.max_text_bytes:
            raise BadRequest(f"input {TEXT!r} row {i}: {size} bytes; the limit is "
                             f"{limits.max_text_bytes}")
    return list(data)


def _token_rows(ids: RequestInput, mask: RequestInput, limits: Limits,
                truncate: bool) -> list[np.ndarray]:
    for tensor in (ids, mask):
        if tensor.datatype != "INT64":
            raise BadRequest(f"input {tensor.name!r} must have datatype INT64, got "
                             f"{tensor.datatype}")
    if ids.shape != mask.shape:
        raise BadRequest(f"{IDS!r} shape {ids.shape} differs from {MASK!r} shape {mask.shape}")
    id_data, mask_data = _shape_rows(ids, (2,)), _shape_rows(mask, (2,))
    rows, seq = ids.shape
    _check_rows(IDS, rows, limits)
    try:
        id_array = np.asarray(id_data, dtype=np.int64).reshape(rows, seq)
        mask_array = np.asarray(mask_data, dtype=np.int64).reshape(rows, seq)
    except (TypeError, ValueError, OverflowError) as exc:
        raise BadRequest("token tensors must hold integers") from exc
    if any(isinstance(v, bool | float) for v in id_data[:1] + mask_data[:1]):
        raise BadRequest("token tensors must hold integers")
    if not np.isin(mask_array, (0, 1)).all():
        raise BadRequest(f"{MASK!r} must hold only 0 and 1")
    if (id_array < 0).any() or (limits.vocab_size and (id_array >= limits.vocab_size).any()):
        raise BadRequest(f"{IDS!r} must lie in [0, {limits.vocab_size})")
    out = []
    for i in range(rows):
        row = id_array[i][mask_array[i] == 1]
        if len(row) == 0:
            raise BadRequest(f"row {i} has no tokens (attention_mask all 0)")
        if len(row) > limits.max_length:
            if not truncate:
                raise BadRequest(f"row {i} has {len(row)} tokens; the model takes "
                                 f"{limits.max_length} (parameters.truncate=false)")
            row = row[:limits.max_length]
        out.append(row)
    return out


def encode_response(response: InferResponse) -> bytes:
    return msgspec.json.encode(response)
