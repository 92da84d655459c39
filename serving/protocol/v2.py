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

Tensor data arrives three ways, all checked the same way (:func:`validate`): as JSON (``data``),
as binary after the JSON header (the binary tensor extension: ``Inference-Header-Content-Length``
and per input ``parameters.binary_data_size``; numeric types raw little-endian, BYTES as 4-byte
little-endian length-prefixed elements), or from the gRPC transport (typed ``contents`` or
``raw_input_contents``). Outputs go back as JSON, or as binary where the request asks for it
(``parameters.binary_data_output``, or ``binary_data`` on a requested output).
"""

from __future__ import annotations

import dataclasses
import math
import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

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
HEADER_LENGTH = "inference-header-content-length"  # the binary extension's HTTP header
LENGTH = struct.Struct("<I")  # the length prefix of one BYTES element
RAW_TYPES = {"FP32": "<f4", "FP64": "<f8", "INT64": "<i8", "INT32": "<i4"}  # output encodings


class RequestInput(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    shape: Annotated[list[Int64], msgspec.Meta(max_length=8)]
    datatype: str
    # decoded by ``_data`` once the shape is known to be within the limits; empty when the
    # data comes as binary (``parameters.binary_data_size``)
    data: msgspec.Raw = msgspec.Raw()
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
    data: Any  # a list, or a numpy array (JSON: its values; binary: its little-endian bytes)


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


@dataclass(frozen=True, slots=True)
class Tensor:
    """One input tensor as a transport received it, its data not decoded yet: exactly one of
    ``json`` (a JSON array), ``raw`` (binary) or ``values`` (typed, from gRPC ``contents``)."""

    name: str
    shape: list[int]
    datatype: str
    json: bytes | None = None
    raw: bytes | memoryview | None = None
    values: Sequence[Any] | None = None


@dataclass(frozen=True)
class Parsed:
    """A validated request: either texts or token rows (ids without padding)."""

    id: str | None
    parameters: dict[str, Any]
    texts: list[str] | None
    token_rows: list[np.ndarray] | None
    outputs: list[str] | None
    binary_all: bool = False  # parameters.binary_data_output
    binary: Mapping[str, bool] = field(default_factory=dict)  # outputs' parameters.binary_data

    @property
    def rows(self) -> int:
        return len(self.texts) if self.texts is not None else len(self.token_rows or [])

    def wants_binary(self, output: str) -> bool:
        return self.binary.get(output, self.binary_all)


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


@dataclass(slots=True)
class HttpRequest:
    """A V2 request body as the REST transport received it (a ``dataplane.Request``): JSON, or
    a JSON header of ``header_length`` bytes followed by binary tensor data. ``parsed`` holds
    what ``parse`` found, for the response's encoding."""

    body: bytes
    header_length: str | None = None  # the Inference-Header-Content-Length header, unchecked
    parsed: Parsed | None = None

    @property
    def size(self) -> int:
        return len(self.body)

    def parse(self, limits: Limits) -> Parsed:
        self.parsed = parse(self.body, limits, self.header_length)
        return self.parsed


def parse(body: bytes, limits: Limits, header_length: str | None = None) -> Parsed:
    """A REST request: JSON, or (with ``header_length``) a JSON header and binary data."""
    header, tail = _split_body(body, header_length)
    request = decode(header)
    tensors = _tensors(request.inputs, tail)
    binary_all = request.parameters.get("binary_data_output", False)
    if not isinstance(binary_all, bool):
        raise BadRequest("parameters.binary_data_output must be a boolean")
    binary: dict[str, bool] = {}
    for output in request.outputs or []:
        wanted = output.parameters.get("binary_data")
        if wanted is not None and not isinstance(wanted, bool):
            raise BadRequest(f"output {output.name!r}: parameters.binary_data must be a boolean")
        if wanted is not None:
            binary[output.name] = wanted
    outputs = [o.name for o in request.outputs] if request.outputs is not None else None
    parsed = validate(request.id, request.parameters, tensors, outputs, limits)
    return dataclasses.replace(parsed, binary_all=binary_all, binary=binary)


def _split_body(body: bytes, header_length: str | None) -> tuple[bytes, memoryview]:
    """The JSON header and the binary data after it (none without ``header_length``)."""
    if header_length is None:
        return body, memoryview(b"")
    value = header_length.strip()
    if not (value.isascii() and value.isdigit()) or len(value) > 12:
        raise BadRequest(f"Inference-Header-Content-Length {header_length[:40]!r} is not a "
                         f"byte count")
    length = int(value)
    if not 0 < length <= len(body):
        raise BadRequest(f"Inference-Header-Content-Length is {length}, but the body has "
                         f"{len(body)} bytes")
    return body[:length], memoryview(body)[length:]


def _tensors(inputs: list[RequestInput], tail: memoryview) -> list[Tensor]:
    """Each input with its data: JSON ``data``, or its ``binary_data_size`` bytes of the binary
    part, taken in input order; the binary part must be used up exactly."""
    tensors, offset = [], 0
    for item in inputs:
        size = item.parameters.get("binary_data_size")
        if size is None:
            if not len(item.data):
                raise BadRequest(f"input {item.name!r} has neither data nor "
                                 f"parameters.binary_data_size")
            tensors.append(Tensor(item.name, item.shape, item.datatype, json=bytes(item.data)))
            continue
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise BadRequest(f"input {item.name!r}: parameters.binary_data_size must be a "
                             f"non-negative integer")
        if len(item.data):
            raise BadRequest(f"input {item.name!r} has both data and binary data")
        if offset + size > len(tail):
            raise BadRequest(f"input {item.name!r}: {size} bytes of binary data declared at "
                             f"offset {offset}, but the binary part has {len(tail)} bytes")
        tensors.append(Tensor(item.name, item.shape, item.datatype,
                              raw=tail[offset:offset + size]))
        offset += size
    if offset != len(tail):
        raise BadRequest(f"{len(tail) - offset} bytes of binary data follow the last input "
                         f"that declares any (binary_data_size)")
    return tensors


def validate(request_id: str | None, parameters: dict[str, Any], tensors: list[Tensor],
             outputs: list[str] | None, limits: Limits) -> Parsed:
    """The request that ``tensors`` make, every transport's: texts, or token rows."""
    names = [t.name for t in tensors]
    if len(set(names)) != len(names):
        raise BadRequest(f"duplicate input names: {names}")
    by_name = {t.name: t for t in tensors}
    unknown = set(by_name) - {TEXT, IDS, MASK}
    if unknown:
        raise BadRequest(f"unknown input {sorted(unknown)[0]!r}: expected {TEXT!r} (BYTES) or "
                         f"{IDS!r} + {MASK!r} (INT64)")
    if not tensors:
        raise BadRequest(f"no inputs: expected {TEXT!r} (BYTES) or {IDS!r} + {MASK!r} (INT64)")
    truncate = parameters.get("truncate", True)
    if not isinstance(truncate, bool):
        raise BadRequest("parameters.truncate must be a boolean")
    if TEXT in by_name:
        if len(by_name) != 1:
            raise BadRequest(f"send either {TEXT!r} or token tensors, not both")
        texts = _texts(by_name[TEXT], limits)
        return Parsed(request_id, parameters, texts, None, outputs)
    if set(by_name) != {IDS, MASK}:
        raise BadRequest(f"token input needs both {IDS!r} and {MASK!r}")
    rows = _token_rows(by_name[IDS], by_name[MASK], limits, truncate)
    return Parsed(request_id, parameters, None, rows, outputs)


def _check_shape(tensor: Tensor, rank: tuple[int, ...], limits: Limits) -> None:
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


def _data(tensor: Tensor, types: tuple[Any, Any], kind: Literal["BYTES", "INT64"]) -> Any:
    """The tensor's data, flat, from whichever form it came in; the wrong count of values, or
    values of the wrong type, are refused."""
    expected = math.prod(tensor.shape)
    if tensor.raw is not None:
        return (_split_bytes(tensor, expected) if kind == "BYTES"
                else _raw_integers(tensor, expected))
    if tensor.values is not None:
        values = tensor.values
        if len(values) != expected:
            raise BadRequest(f"input {tensor.name!r}: shape {tensor.shape} holds {expected} "
                             f"elements but its contents have {len(values)} of {kind}")
        return [_utf8(v, tensor.name) for v in values] if kind == "BYTES" else list(values)
    return _json_data(tensor, types, kind)


def _split_bytes(tensor: Tensor, count: int) -> list[str]:
    """``count`` BYTES elements from binary data: each a 4-byte little-endian length and that
    many bytes of UTF-8; exactly the data's length."""
    raw, out, offset = memoryview(tensor.raw or b""), [], 0
    for i in range(count):
        if offset + LENGTH.size > len(raw):
            raise BadRequest(f"input {tensor.name!r}: binary data ends before element {i} of "
                             f"{count} (its 4-byte length prefix)")
        (size,) = LENGTH.unpack_from(raw, offset)
        offset += LENGTH.size
        if offset + size > len(raw):
            raise BadRequest(f"input {tensor.name!r}: element {i} declares {size} bytes, but "
                             f"only {len(raw) - offset} remain")
        out.append(_utf8(raw[offset:offset + size], tensor.name))
        offset += size
    if offset != len(raw):
        raise BadRequest(f"input {tensor.name!r}: {len(raw) - offset} bytes of binary data "
                         f"after its {count} elements (shape {tensor.shape})")
    return out


def _utf8(value: bytes | memoryview, name: str) -> str:
    try:
        return bytes(value).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(f"input {name!r}: an element is not valid UTF-8 ({exc.reason} at "
                         f"byte {exc.start})") from None


def _raw_integers(tensor: Tensor, count: int) -> np.ndarray:
    raw = tensor.raw or b""
    if len(raw) != 8 * count:
        raise BadRequest(f"input {tensor.name!r}: shape {tensor.shape} of INT64 takes "
                         f"{8 * count} bytes, the binary data has {len(raw)}")
    return np.frombuffer(raw, dtype="<i8").astype(np.int64, copy=False)


def _json_data(tensor: Tensor, types: tuple[Any, Any], kind: str) -> list[Any]:
    """Decoded as a flat list or, for a rank-2 shape, as rows (nested row-major) of the
    datatype's values; anything else, or the wrong count, is refused."""
    shape, raw = tensor.shape, tensor.json or b""
    nested = len(shape) == 2 and NESTED.match(raw) is not None
    what = "strings (BYTES)" if kind == "BYTES" else "integers (INT64)"
    try:
        data: list[Any] = msgspec.json.decode(raw, type=types[nested])
    except msgspec.ValidationError as exc:
        raise BadRequest(f"input {tensor.name!r} must hold {what}, flat or as rows of "
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


def _texts(tensor: Tensor, limits: Limits) -> list[str]:
    if tensor.datatype != "BYTES":
        raise BadRequest(f"input {TEXT!r} must have datatype BYTES, got {tensor.datatype}")
    _check_shape(tensor, (1, 2), limits)
    if len(tensor.shape) == 2 and tensor.shape[1] != 1:
        raise BadRequest(f"input {TEXT!r}: shape must be [rows] or [rows, 1]")
    data: list[str] = _data(tensor, STRINGS, "BYTES")
    for i, text in enumerate(data):
        size = len(text.encode("utf-8"))  # msgspec already refused invalid UTF-8/surrogates
        if size > limits.max_text_bytes:
            raise BadRequest(f"input {TEXT!r} row {i}: {size} bytes; the limit is "
                             f"{limits.max_text_bytes}")
    return data


def _token_rows(ids: Tensor, mask: Tensor, limits: Limits,
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
    id_array = np.asarray(_data(ids, INTEGERS, "INT64"), dtype=np.int64)
    mask_array = np.asarray(_data(mask, INTEGERS, "INT64"), dtype=np.int64)
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


def _numpy(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise NotImplementedError(f"cannot encode {type(value).__name__}")


ENCODER = msgspec.json.Encoder(enc_hook=_numpy)


def encode_response(response: InferResponse) -> bytes:
    return ENCODER.encode(response)


def raw(datatype: str, data: Any) -> bytes:
    """Tensor data in the binary form (the binary extension's and gRPC's ``raw_*_contents``):
    numbers little-endian, BYTES elements each a 4-byte length and its UTF-8."""
    if datatype == "BYTES":
        encoded = [str(v).encode("utf-8") for v in data]
        return b"".join(LENGTH.pack(len(e)) + e for e in encoded)
    return np.asarray(data, dtype=RAW_TYPES[datatype]).tobytes()


def raw_bytes(output: ResponseOutput) -> bytes:
    """An output's data in the binary form."""
    return raw(output.datatype, output.data)


def encode_http(response: InferResponse, parsed: Parsed | None) -> tuple[bytes, int | None]:
    """The REST body, and the length of its JSON header when outputs follow it as binary
    (``None``: all JSON)."""
    binary = [o for o in response.outputs if parsed is not None and parsed.wants_binary(o.name)]
    if not binary:
        return encode_response(response), None
    chunks = {o.name: raw_bytes(o) for o in binary}
    outputs = [{"name": o.name, "shape": o.shape, "datatype": o.datatype,
                "parameters": {"binary_data_size": len(chunks[o.name])}} if o.name in chunks
               else o for o in response.outputs]
    head: dict[str, Any] = {"model_name": response.model_name,
                            "model_version": response.model_version, "outputs": outputs}
    if response.id is not None:
        head["id"] = response.id
    if response.parameters:
        head["parameters"] = response.parameters
    header = ENCODER.encode(head)
    return header + b"".join(chunks.values()), len(header)
