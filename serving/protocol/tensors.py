"""Tensor data as the V2 protocol carries it, in its three forms (JSON ``data``, binary after
the JSON header or gRPC's ``raw_input_contents``, gRPC's typed ``contents``), read into typed
values of exactly the declared shape: strings or bytes for ``BYTES``, a numpy array for the
numeric datatypes. Nothing is decoded before the caller (an input kind) has bounded the shape;
the wrong count of values, or values of the wrong type, are a ``BadRequest``.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec
import numpy as np

from serving.errors import BadRequest
from serving.model.datatypes import NUMERIC

Int64 = Annotated[int, msgspec.Meta(ge=-(2 ** 63), le=2 ** 63 - 1)]
# what BYTES data decodes into: flat, and nested as rows (shape [rows, columns])
STRINGS: tuple[Any, Any] = (list[str], list[list[str]])
NESTED = re.compile(rb"\s*\[\s*\[")
LENGTH = struct.Struct("<I")  # the length prefix of one BYTES element


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
    dtype, count = np.dtype(kind), math.prod(tensor.shape)  # little-endian, as sent
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
    elif values.dtype.kind == "f" and dtype.itemsize < values.dtype.itemsize:
        # a finite float64 past FP32's (or FP16's) range would become inf in the cast
        top = float(np.finfo(dtype).max)
        if np.nanmax(np.abs(values), initial=0.0) > top:
            raise BadRequest(f"input {tensor.name!r}: values must lie in [{-top:g}, {top:g}] "
                             f"({tensor.datatype})")
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


def raw(datatype: str, data: Any) -> bytes:
    """Tensor data in the binary form (the binary extension's and gRPC's ``raw_*_contents``):
    numbers little-endian, BYTES elements each a 4-byte length and its bytes (UTF-8 for
    text)."""
    if datatype == "BYTES":
        encoded = [v if isinstance(v, bytes) else str(v).encode("utf-8") for v in data]
        return b"".join(LENGTH.pack(len(e)) + e for e in encoded)
    return np.asarray(data, dtype=NUMERIC[datatype]).tobytes()
