"""The Open Inference Protocol (KServe V2) REST codec: request parsing, bounds, responses.

What the inputs mean is the release's: each request input kind (``serving/inputs``: text,
image, tensor) turns the received tensors into model rows. This module only receives them:
every client mistake becomes a ``BadRequest`` with a message that names the field, never a
500.

Bodies come from the network, so nothing is materialised before it is bounded: each tensor's
``data`` is kept as raw JSON until its kind has checked the declared shape, then decoded
straight into typed values (``str``/``bytes`` for BYTES, a numpy array of the datatype for
numbers) of exactly that shape, so a huge declared shape, a shape/data mismatch, a float among
integers and an array nested where a value belongs are refused without building Python objects
for the rest of the body.

Tensor data arrives three ways, all read the same way: as JSON (``data``), as binary after the
JSON header (the binary tensor extension: ``Inference-Header-Content-Length`` and per input
``parameters.binary_data_size``; numeric types raw little-endian, BYTES as 4-byte
little-endian length-prefixed elements), or from the gRPC transport (typed ``contents`` or
``raw_input_contents``). Outputs go back as JSON, or as binary where the request asks for it
(``parameters.binary_data_output``, or ``binary_data`` on a requested output).
"""

from __future__ import annotations

import dataclasses
import math
import re
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Protocol

import msgspec
import numpy as np

from serving.errors import BadRequest
from serving.model.datatypes import NUMERIC

Scalar = str | int | float | bool | None
Int64 = Annotated[int, msgspec.Meta(ge=-(2 ** 63), le=2 ** 63 - 1)]
# what BYTES data decodes into: flat, and nested as rows (shape [rows, columns])
STRINGS: tuple[Any, Any] = (list[str], list[list[str]])
NESTED = re.compile(rb"\s*\[\s*\[")
HEADER_LENGTH = "inference-header-content-length"  # the binary extension's HTTP header
LENGTH = struct.Struct("<I")  # the length prefix of one BYTES element
RAW_TYPES = NUMERIC  # output encodings


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
class Decoded:
    """What a request input kind (``serving/inputs``) made of a request's tensors: one model
    row per request row, and ``forward``, which gives the tensors that carry chosen rows to
    another server in their smallest faithful form (the client's encoded image or text where
    that is what came in)."""

    rows: list[np.ndarray]
    forward: Callable[[list[int]], list[Tensor]]


class Decoder(Protocol):
    """A release's request inputs: received tensors in, model rows out (``serving/inputs``)."""

    def decode(self, tensors: list[Tensor], parameters: dict[str, Any]) -> Decoded: ...


@dataclass(frozen=True)
class Parsed:
    """A validated request: its rows, as the release's input kind decoded them."""

    id: str | None
    parameters: dict[str, Any]
    inputs: Decoded
    outputs: list[str] | None
    binary_all: bool = False  # parameters.binary_data_output
    binary: Mapping[str, bool] = field(default_factory=dict)  # outputs' parameters.binary_data

    @property
    def rows(self) -> int:
        return len(self.inputs.rows)

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

    def parse(self, decoder: Decoder) -> Parsed:
        self.parsed = parse(self.body, decoder, self.header_length)
        return self.parsed


def parse(body: bytes, decoder: Decoder, header_length: str | None = None) -> Parsed:
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
    parsed = validate(request.id, request.parameters, tensors, outputs, decoder)
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
             outputs: list[str] | None, decoder: Decoder) -> Parsed:
    """The request that ``tensors`` make, every transport's, decoded by the release's kind."""
    names = [t.name for t in tensors]
    if len(set(names)) != len(names):
        raise BadRequest(f"duplicate input names: {names}")
    return Parsed(request_id, parameters, decoder.decode(tensors, parameters), outputs)


def check_rows(tensor: Tensor, ranks: tuple[int, ...], max_rows: int) -> int:
    """The tensor's row count (its first dimension), its shape refused before any of its data
    is decoded: the rank, negative or empty dimensions, more rows than ``max_rows``. The other
    dimensions are the kind's to bound, so a declared ``[256, 8000]`` or ``[2**40, 1]`` costs
    nothing."""
    if len(tensor.shape) not in ranks or any(d < 0 for d in tensor.shape):
        raise BadRequest(f"input {tensor.name!r}: shape {tensor.shape} is not valid here")
    rows = tensor.shape[0]
    if rows == 0:
        raise BadRequest(f"input {tensor.name!r} is an empty batch")
    if rows > max_rows:
        raise BadRequest(f"input {tensor.name!r} has {rows} rows; the limit is {max_rows}")
    return rows


def strings(tensor: Tensor) -> list[str]:
    """A BYTES tensor's elements as UTF-8 text, flat."""
    if tensor.raw is not None:
        return [_utf8(v, tensor.name) for v in _split_bytes(tensor, math.prod(tensor.shape))]
    if tensor.values is not None:
        return [_utf8(v, tensor.name) for v in _counted(tensor, tensor.values)]
    return _json_strings(tensor)


def blobs(tensor: Tensor) -> list[bytes]:
    """A BYTES tensor's elements as bytes, flat (JSON carries them as strings: their UTF-8)."""
    if tensor.raw is not None:
        return [bytes(v) for v in _split_bytes(tensor, math.prod(tensor.shape))]
    if tensor.values is not None:
        return [bytes(v) for v in _counted(tensor, tensor.values)]
    return [v.encode("utf-8") for v in _json_strings(tensor)]


def array(tensor: Tensor) -> np.ndarray:
    """A numeric tensor's data as an array of its declared shape and datatype (native byte
    order); the wrong count, values that do not fit the datatype, or data of another type are
    refused. The caller has bounded the shape."""
    kind = NUMERIC.get(tensor.datatype)
    if kind is None:
        raise BadRequest(f"input {tensor.name!r}: {tensor.datatype!r} is not a numeric V2 "
                         f"datatype")
    dtype, count = np.dtype(kind), math.prod(tensor.shape)
    if tensor.raw is not None:
        if len(tensor.raw) != dtype.itemsize * count:
            raise BadRequest(f"input {tensor.name!r}: shape {tensor.shape} of "
                             f"{tensor.datatype} takes {dtype.itemsize * count} bytes, the "
                             f"binary data has {len(tensor.raw)}")
        flat = np.frombuffer(tensor.raw, dtype=dtype).astype(dtype.newbyteorder("="))
    elif tensor.values is not None:
        flat = _fit(np.asarray(_counted(tensor, tensor.values)), dtype, tensor)
    else:
        flat = _fit(_json_numbers(tensor), dtype, tensor)
    return flat.reshape(tensor.shape)


def _counted(tensor: Tensor, values: Sequence[Any]) -> Sequence[Any]:
    expected = math.prod(tensor.shape)
    if len(values) != expected:
        raise BadRequest(f"input {tensor.name!r}: shape {tensor.shape} holds {expected} "
                         f"elements but its contents have {len(values)}")
    return values


def _fit(values: np.ndarray, dtype: np.dtype[Any], tensor: Tensor) -> np.ndarray:
    """``values`` (as decoded: bool, int64 or float64) as ``dtype``, refused where a value
    does not fit: a float among integers, an integer out of the datatype's range."""
    if values.size == 0:
        return values.astype(dtype.newbyteorder("="))
    if dtype.kind == "b":
        if values.dtype.kind != "b":
            raise BadRequest(f"input {tensor.name!r} must hold booleans ({tensor.datatype})")
    elif dtype.kind in "iu":
        if values.dtype.kind not in "iu":
            raise BadRequest(f"input {tensor.name!r} must hold integers ({tensor.datatype})")
        info = np.iinfo(dtype)
        if values.min() < info.min or values.max() > info.max:
            raise BadRequest(f"input {tensor.name!r}: values must lie in [{info.min}, "
                             f"{info.max}] ({tensor.datatype})")
    elif values.dtype.kind not in "iuf":
        raise BadRequest(f"input {tensor.name!r} must hold numbers ({tensor.datatype})")
    return values.astype(dtype.newbyteorder("="))


FLAT_TYPES: dict[str, Any] = {"b": list[bool], "i": list[Int64], "u": list[Int64],
                              "f": list[float]}


def _json_numbers(tensor: Tensor) -> np.ndarray:
    """JSON data, flat or nested row-major to the declared shape, as bool, int64 or float64;
    flat data is decoded straight into the datatype's Python type (a bool or a float among
    integers is refused there)."""
    raw, shape = tensor.json or b"", tensor.shape
    what, kind = _what(tensor.datatype), np.dtype(NUMERIC[tensor.datatype]).kind
    nested = NESTED.match(raw) is not None
    try:
        data = msgspec.json.decode(raw, type=list[Any] if nested else FLAT_TYPES[kind])
    except msgspec.ValidationError as exc:
        raise BadRequest(f"input {tensor.name!r} must hold {what} ({tensor.datatype}), flat "
                         f"or nested: {exc}") from exc
    except (msgspec.DecodeError, RecursionError) as exc:
        raise BadRequest(f"malformed JSON in input {tensor.name!r}") from exc
    try:
        values = np.asarray(data)
    except ValueError as exc:  # ragged
        raise BadRequest(f"input {tensor.name!r}: nested data does not have shape "
                         f"{shape}") from exc
    if values.dtype == object or values.dtype.kind not in "biuf" or \
            (nested and kind != "b" and _has_bool(data)):
        raise BadRequest(f"input {tensor.name!r} must hold {what} ({tensor.datatype})")
    if nested and list(values.shape) != list(shape):
        raise BadRequest(f"input {tensor.name!r}: nested data does not have shape {shape}")
    if values.size != math.prod(shape):
        raise BadRequest(f"input {tensor.name!r}: shape {shape} holds {math.prod(shape)} "
                         f"elements but data has {values.size}")
    return values.ravel()


def _has_bool(data: list[Any]) -> bool:
    return any(isinstance(v, bool) or (isinstance(v, list) and _has_bool(v)) for v in data)


def _what(datatype: str) -> str:
    kind = np.dtype(NUMERIC[datatype]).kind
    return {"b": "booleans", "i": "integers", "u": "integers"}.get(kind, "numbers")


def _split_bytes(tensor: Tensor, count: int) -> list[memoryview]:
    """``count`` BYTES elements from binary data: each a 4-byte little-endian length and that
    many bytes; exactly the data's length."""
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
        out.append(raw[offset:offset + size])
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


def _json_strings(tensor: Tensor) -> list[str]:
    """JSON data decoded as a flat list or, for a rank-2 shape, as rows (nested row-major) of
    strings; anything else, or the wrong count, is refused."""
    shape, raw = tensor.shape, tensor.json or b""
    nested = len(shape) == 2 and NESTED.match(raw) is not None
    try:
        data: list[Any] = msgspec.json.decode(raw, type=STRINGS[nested])
    except msgspec.ValidationError as exc:
        raise BadRequest(f"input {tensor.name!r} must hold strings (BYTES), flat or as rows "
                         f"of shape {shape}: {exc}") from exc
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


def binary(name: str, datatype: str, data: Any, shape: list[int] | None = None) -> Tensor:
    """A tensor in the binary form, e.g. to forward rows to another server: ``data`` a list
    of str/bytes for BYTES, else an array."""
    if datatype == "BYTES":
        return Tensor(name, shape or [len(data)], datatype, raw=raw(datatype, data))
    values = np.asarray(data, dtype=NUMERIC[datatype])
    return Tensor(name, shape or list(values.shape), datatype, raw=values.tobytes())


def _numpy(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise NotImplementedError(f"cannot encode {type(value).__name__}")


ENCODER = msgspec.json.Encoder(enc_hook=_numpy)


def encode_response(response: InferResponse) -> bytes:
    return ENCODER.encode(response)


def raw(datatype: str, data: Any) -> bytes:
    """Tensor data in the binary form (the binary extension's and gRPC's ``raw_*_contents``):
    numbers little-endian, BYTES elements each a 4-byte length and its bytes (UTF-8 for
    text)."""
    if datatype == "BYTES":
        encoded = [v if isinstance(v, bytes) else str(v).encode("utf-8") for v in data]
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
