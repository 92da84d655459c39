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

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Protocol

import msgspec
import numpy as np

from serving.errors import BadRequest
from serving.model.datatypes import NUMERIC
from serving.protocol.tensors import (
    Int64,
    Tensor,
    array,
    binary,
    blobs,
    check_rows,
    raw,
    strings,
)

__all__ = ["HEADER_LENGTH", "NUMERIC", "Decoded", "Decoder", "HttpRequest", "InferRequest",
           "InferResponse", "Parsed", "ResponseOutput", "Tensor", "array", "binary", "blobs",
           "check_rows", "decode", "encode_http", "encode_response", "parse", "raw",
           "raw_bytes", "strings", "validate"]

Scalar = str | int | float | bool | None
HEADER_LENGTH = "inference-header-content-length"  # the binary extension's HTTP header
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
    return validate(request.id, request.parameters, tensors, outputs, decoder, binary_all,
                    binary)


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
             outputs: list[str] | None, decoder: Decoder, binary_all: bool = False,
             binary: Mapping[str, bool] | None = None) -> Parsed:
    """The request that ``tensors`` make, every transport's, decoded by the release's kind."""
    names = [t.name for t in tensors]
    if len(set(names)) != len(names):
        raise BadRequest(f"duplicate input names: {names}")
    return Parsed(request_id, parameters, decoder.decode(tensors, parameters), outputs,
                  binary_all, binary or {})


def _numpy(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise NotImplementedError(f"cannot encode {type(value).__name__}")


ENCODER = msgspec.json.Encoder(enc_hook=_numpy)


def encode_response(response: InferResponse) -> bytes:
    return ENCODER.encode(response)


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
