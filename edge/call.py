"""One escalation call to one center: what is sent, what comes back, how it can be refused,
and the client every transport implements (``edge.http_center``, ``edge.grpc_center``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import msgspec
import numpy as np

from serving.fleet.discovery import CENTER_TLS_NAME
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
    are tried). ``inputs``: the rows in the smallest faithful form their input kind gives
    (``v2.Decoded.forward``: the client's texts or encoded images, else binary tensors)."""

    model: str
    inputs: list[v2.Tensor]
    rows: int
    request_id: str | None
    labels: int
    _body: tuple[bytes, int] | None = None
    _message: Any = None  # a ModelInferRequest (the stubs load lazily: see edge.grpc_center)

    def body(self) -> tuple[bytes, int]:
        """The REST body with the binary tensor extension, and its JSON header's length."""
        if self._body is None:
            header = msgspec.json.encode({
                "inputs": [{"name": t.name, "shape": t.shape, "datatype": t.datatype,
                            "parameters": {"binary_data_size": len(t.raw or b"")}}
                           for t in self.inputs],
                "outputs": [{"name": "probabilities"}]})
            self._body = (header + b"".join(bytes(t.raw or b"") for t in self.inputs),
                          len(header))
        return self._body

    def message(self) -> Any:
        """The gRPC ModelInferRequest, raw contents."""
        if self._message is None:
            from serving.gen import grpc_predict_v2_pb2 as pb  # see edge.grpc_center

            request = pb.ModelInferRequest(model_name=self.model, id=self.request_id or "")
            for tensor in self.inputs:
                request.inputs.add(name=tensor.name, datatype=tensor.datatype,
                                   shape=tensor.shape)
                request.raw_input_contents.append(bytes(tensor.raw or b""))
            request.outputs.add(name="probabilities")
            self._message = request
        return self._message


def retry_after(value: object) -> float | None:
    """A center's back-pressure (``Retry-After`` header or ``retry-after`` trailer): whole
    seconds, else none."""
    return float(value) if isinstance(value, str) and value.isdigit() else None
