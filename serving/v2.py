"""The Open Inference Protocol (KServe V2) REST codec: request parsing, validation, responses.

Text arrives as one ``BYTES`` input named ``text`` (a list of strings); token tensors arrive as
``INT64`` inputs ``input_ids`` and ``attention_mask``. Every client mistake becomes a
``BadRequest`` with a message that names the field, never a 500.

Bodies come from the network, so nothing is materialised before it is bounded: each tensor's
``data`` is kept as raw JSON until its declared shape has passed the row and sequence limits,
then decoded straight into typed lists (``str`` for BYTES, 64-bit ``int`` for INT64) of exactly
that shape, so a huge declared shape, a shape/data mismatch, a float or bool among token ids
and an array nested where a value belongs are refused without building Python objects for
the rest of the body.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec
import numpy as np

from serving.errors import BadRequest

TEXT, IDS, MASK = "text", "input_ids", "attention_mask"
Scalar = str | int | float | bool | None
Int64 = Annotated[int, msgspec.Meta(ge=-(2 ** 63), le=2 ** 63 - 1)]
# what each datatype's data decodes into: flat, and nested as rows (shape [rows, columns])
STRINGS: tuple[Any, Any] = (list[str], list[list[str]])
INTEGERS: tuple[Any, Any] = (list[Int64], list[list[Int64]])
NESTED = re.compile(rb"\s*\[\s*\[")


class RequestInput(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    shape: Annotated[list[Int64], msgspec.Meta(max_length=8)]
    datatype: str
    data: msgspec.Raw  # decoded by ``_data`` once the shape is known to be within the limits
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
    max_sequence: int = 0  # longest declared (padded) token row; 0: max_length


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
    except RecursionError as exc:  # msgspec's own guard against deep nesting, raised cleanly
        raise BadRequest("malformed JSON: arrays or objects nested too deeply") from exc


@dataclass(frozen=True, slots=True)
class JsonRequest:
    """A V2 JSON request body as the REST transport received it (a ``dataplane.Request``)."""

    body: bytes

    @property
    def size(self) -> int:
        return len(self.body)

    def parse(self, limits: Limits) -> Parsed:
        return parse(self.body, limits)


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


def _check_shape(tensor: RequestInput, rank: tuple[int, ...], limits: Limits) -> None:
    """Refuse a shape before any of its data is decoded: the rows (and, for token tensors,
    the padded sequence length) bound the elements, so a declared ``[256, 8000]`` or
    ``[2**40, 1]`` costs nothing."""
    if len(tensor.shape) not in rank or any(d < 0 for d in tensor.shape):
        raise BadRequest(f"input {tensor.name!r}: shape {tensor.shape} is not valid here")
    rows = tensor.shape[0]
    if rows == 0:
        raise BadRequest(f"input {tensor.name!r} is an empty batch")
    if rows > limits.max_rows:
        raise BadRequest(f"input {tensor.name!r} has {rows} rows; the limit is {limits.max_rows}")


def _data(tensor: RequestInput, types: tuple[Any, Any], kind: str) -> list[Any]:
    """The tensor's data, flat: decoded as a flat list or, for a rank-2 shape, as rows (nested
    row-major) of the datatype's values; anything else, or the wrong count, is refused."""
    shape, raw = tensor.shape, tensor.data
    nested = len(shape) == 2 and NESTED.match(raw) is not None
    try:
        data: list[Any] = msgspec.json.decode(raw, type=types[nested])
    except msgspec.ValidationError as exc:
        raise BadRequest(f"input {tensor.name!r} must hold {kind}, flat or as rows of "
                         f"shape {shape}: {exc}") from exc
    except msgspec.DecodeError as exc:  # not reached: the request decoded (kept for safety)
        raise BadRequest(f"malformed JSON in input {tensor.name!r}: {exc}") from exc
    except RecursionError as exc:
        raise BadRequest("malformed JSON: arrays or objects nested too deeply") from exc
    if nested:
        if len(data) != shape[0] or any(len(row) != shape[1] for row in data):
            raise BadRequest(f"input {tensor.name!r}: nested data does not have shape {shape}")
        return [value for row in data for value in row]
    expected = math.prod(shape)
    if expected != len(data):
        raise BadRequest(f"input {tensor.name!r}: shape {shape} holds {expected} "
                         f"elements but data has {len(data)}")
    return data


def _texts(tensor: RequestInput, limits: Limits) -> list[str]:
    if tensor.datatype != "BYTES":
        raise BadRequest(f"input {TEXT!r} must have datatype BYTES, got {tensor.datatype}")
    _check_shape(tensor, (1, 2), limits)
    if len(tensor.shape) == 2 and tensor.shape[1] != 1:
        raise BadRequest(f"input {TEXT!r}: shape must be [rows] or [rows, 1]")
    data: list[str] = _data(tensor, STRINGS, "strings (BYTES)")
    for i, text in enumerate(data):
        size = len(text.encode("utf-8"))  # msgspec already refused invalid UTF-8/surrogates
        if size > limits.max_text_bytes:
            raise BadRequest(f"input {TEXT!r} row {i}: {size} bytes; the limit is "
                             f"{limits.max_text_bytes}")
    return data


def _token_rows(ids: RequestInput, mask: RequestInput, limits: Limits,
                truncate: bool) -> list[np.ndarray]:
    for tensor in (ids, mask):
        if tensor.datatype != "INT64":
            raise BadRequest(f"input {tensor.name!r} must have datatype INT64, got "
                             f"{tensor.datatype}")
    if ids.shape != mask.shape:
        raise BadRequest(f"{IDS!r} shape {ids.shape} differs from {MASK!r} shape {mask.shape}")
    _check_shape(ids, (2,), limits)
    rows, seq = ids.shape
    longest = limits.max_sequence or limits.max_length
    if seq > longest:
        raise BadRequest(f"input {IDS!r}: {seq} tokens per row; the limit is {longest} (the "
                         f"model takes {limits.max_length}, padding included)")
    id_array = np.asarray(_data(ids, INTEGERS, "integers (INT64)"), dtype=np.int64)
    mask_array = np.asarray(_data(mask, INTEGERS, "integers (INT64)"), dtype=np.int64)
    id_array, mask_array = id_array.reshape(rows, seq), mask_array.reshape(rows, seq)
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
