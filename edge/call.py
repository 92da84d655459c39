"""One escalation call to one center: what is sent, what comes back, how it can be refused,
and the client every transport implements (``edge.http_center``, ``edge.grpc_center``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import msgspec
import numpy as np

from serving.fleet.discovery import CENTER_TLS_NAME
from serving.model.text import pad
from serving.protocol import v2

# The TLS server name of a center's certificate (registry.trust.pki): checked in the handshake,
# before the request, so a registry's certificate from the same CA cannot pass for a center.
CENTER_NAME = CENTER_TLS_NAME


@dataclass(frozen=True)
class CenterAnswer:
    probabilities: np.ndarray
    version: str
    url: str


class Refused(Exception):
    """One center did not answer usably; ``unhealthy``: it counts against its circuit
    (``cooldown``: for that long, as its back-pressure asked)."""

    def __init__(self, reason: str, unhealthy: bool = True, cooldown: float | None = None):
        super().__init__(reason)
        self.unhealthy, self.cooldown = unhealthy, cooldown


class CenterClient(Protocol):
    """One center over one transport: one call, no retries (``edge.escalation`` fails over)."""

    url: str

    async def classify(self, call: Call) -> CenterAnswer:
        """The center's answer; raises Refused."""
        ...

    async def close(self) -> None: ...


@dataclass
class Call:
    """One escalation, encoded for a transport when first needed (once however many centers
    are tried)."""

    model: str
    texts: list[str] | None
    rows: list[np.ndarray]
    request_id: str | None
    labels: int
    _json: bytes | None = None
    _message: Any = None  # a ModelInferRequest (the stubs load lazily: see edge.grpc_center)

    def json(self) -> bytes:
        if self._json is None:
            self._json = msgspec.json.encode(_request(self.texts, self.rows))
        return self._json

    def message(self) -> Any:
        """The gRPC ModelInferRequest, raw contents."""
        if self._message is None:
            from serving.gen import grpc_predict_v2_pb2 as pb  # see edge.grpc_center

            request = pb.ModelInferRequest(model_name=self.model, id=self.request_id or "")
            for name, datatype, data in _tensors(self.texts, self.rows):
                request.inputs.add(name=name, datatype=datatype, shape=list(np.shape(data)))
                request.raw_input_contents.append(v2.raw(datatype, data))
            request.outputs.add(name="probabilities")
            self._message = request
        return self._message


def retry_after(value: object) -> float | None:
    """A center's back-pressure (``Retry-After`` header or ``retry-after`` trailer): whole
    seconds, else none."""
    return float(value) if isinstance(value, str) and value.isdigit() else None


def _tensors(texts: list[str] | None, rows: list[np.ndarray]) -> list[tuple[str, str, Any]]:
    """The escalation's inputs, whichever encoding carries them: the texts, or the token rows
    padded into ids and mask. (name, datatype, data)."""
    if texts is not None:
        return [(v2.TEXT, "BYTES", texts)]
    enc = pad(rows)
    return [(v2.IDS, "INT64", enc.input_ids), (v2.MASK, "INT64", enc.attention_mask)]


def _request(texts: list[str] | None, rows: list[np.ndarray]) -> dict[str, object]:
    inputs = [{"name": name, "shape": list(np.shape(data)), "datatype": datatype,
               "data": data if datatype == "BYTES" else data.ravel().tolist()}
              for name, datatype, data in _tensors(texts, rows)]
    return {"inputs": inputs, "outputs": [{"name": "probabilities"}]}
