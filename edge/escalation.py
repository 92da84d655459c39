"""Escalation client: unsure rows to a center in one batched V2 call (REST or gRPC), failing
over cleanly.

Centers are tried in turn, skipping those whose circuit is open. A 503 with Retry-After opens
that center's circuit for that long (back-pressure: the edge does not hammer it). When no
center answers, the caller answers from the edge, marked degraded.
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import msgspec
import numpy as np

from edge.breaker import CircuitBreaker
from edge.errors import CenterUnavailable
from edge.settings import GRPC_SCHEMES, TLS_SCHEMES
from serving.fleet.discovery import CENTER_TLS_NAME
from serving.model.text import pad
from serving.protocol import v2
from serving.telemetry import tracing

# The TLS server name of a center's certificate (registry.pki): checked in the handshake,
# before the request, so a registry's certificate from the same CA cannot pass for a center.
CENTER_NAME = CENTER_TLS_NAME

@dataclass(frozen=True)
class CenterAnswer:
    probabilities: np.ndarray
    version: str
    url: str


class _Refused(Exception):
    """One center did not answer usably; ``unhealthy``: it counts against its circuit
    (``cooldown``: for that long, as its back-pressure asked)."""

    def __init__(self, reason: str, unhealthy: bool = True, cooldown: float | None = None):
        super().__init__(reason)
        self.unhealthy, self.cooldown = unhealthy, cooldown


class CenterClient:
    def __init__(self, urls: list[str], timeout_s: float, failures: int, reset_s: float,
                 transport: httpx.AsyncBaseTransport | None = None,
                 ca: Path | None = None) -> None:
        """``urls``: ``http(s)://host:port`` (V2 REST) or ``grpc(s)://host:port`` (gRPC V2).
        ``ca``: the fleet CA; then only HTTPS / gRPC-over-TLS centers with a center-role
        certificate."""
        self.urls = [u.rstrip("/") for u in urls]
        self.ca = ca
        self.timeout_s = timeout_s
        self.pinned = ca is not None
        self.extensions = {"sni_hostname": CENTER_NAME} if self.pinned else {}
        self._failures, self._reset_s = failures, reset_s
        self.breakers = {url: CircuitBreaker(failures, reset_s) for url in self.urls}
        verify: ssl.SSLContext | bool = (ssl.create_default_context(cafile=str(ca))
                                         if ca is not None else True)
        self.http = httpx.AsyncClient(timeout=timeout_s, transport=transport, verify=verify,
                                      limits=httpx.Limits(max_connections=64))
        self.grpc = GrpcCenters(ca)
        self._turn = 0

    def set_urls(self, urls: list[str]) -> None:
        """Follow discovery: keep the breakers of centers that stay, forget the others."""
        self.urls = [u.rstrip("/") for u in urls]
        self.breakers = {url: self.breakers.get(url) or CircuitBreaker(self._failures,
                                                                       self._reset_s)
                         for url in self.urls}
        self.grpc.keep(self.urls)

    def _order(self) -> list[str]:
        """Round-robin start so escalations spread over centers."""
        urls = self.urls
        self._turn = (self._turn + 1) % max(1, len(urls))
        return urls[self._turn:] + urls[:self._turn]

    async def classify(self, model: str, texts: list[str] | None, rows: list[np.ndarray],
                       request_id: str | None, labels: int) -> CenterAnswer:
        call = _Call(model, texts, rows, request_id, labels)
        reasons = []
        breakers = self.breakers  # set_urls replaces the dict: this call keeps a coherent view
        for url in self._order():
            breaker = breakers[url]
            if not breaker.allow():
                reasons.append(f"{url}: circuit open")
                continue
            if self.pinned and not url.startswith(TLS_SCHEMES):
                breaker.failure()
                reasons.append(f"{url}: not TLS (center_ca is set)")
                continue
            try:
                if url.startswith(GRPC_SCHEMES):
                    answer = await self.grpc.classify(url, call, self.timeout_s)
                else:
                    answer = await self._http(url, call)
            except _Refused as exc:
                if exc.unhealthy:
                    breaker.failure(cooldown=exc.cooldown)
                reasons.append(f"{url}: {exc}")
                continue
            breaker.success()
            return answer
        raise CenterUnavailable("; ".join(reasons) or "no center configured")

    async def _http(self, url: str, call: _Call) -> CenterAnswer:
        target = f"{url}/v2/models/{call.model}/infer"
        headers = {"content-type": "application/json"}
        if call.request_id:
            headers["x-request-id"] = call.request_id
        with tracing.span("POST", tracing.SpanKind.CLIENT, **{
                "http.request.method": "POST", "url.full": target,
                "tiered.escalated": len(call.rows)}) as span:
            tracing.inject(headers)  # the center's span is this call's child
            try:
                response = await self.http.post(target, content=call.json(), headers=headers,
                                                extensions=self.extensions)
            except httpx.HTTPError as exc:
                if span is not None:
                    span.set_attributes({"error.type": type(exc).__name__})
                raise _Refused(type(exc).__name__) from exc
            if span is not None:
                span.set_attribute("http.response.status_code", response.status_code)
        if response.status_code != 200:
            raise _Refused(f"HTTP {response.status_code}",
                           # a 4xx (a model the center does not have yet, say) says nothing
                           # about its health; a 503's Retry-After is its back-pressure
                           unhealthy=response.status_code >= 500,
                           cooldown=_retry_after(response.headers.get("retry-after"))
                           if response.status_code == 503 else None)
        try:
            return _answer(response, url, len(call.rows), call.labels)
        except (ValueError, KeyError, msgspec.DecodeError) as exc:
            raise _Refused(f"unusable answer ({exc})") from exc

    def circuits(self) -> dict[str, str]:
        return {url: breaker.state for url, breaker in self.breakers.items()}

    async def close(self) -> None:
        await self.http.aclose()
        await self.grpc.close()


@dataclass
class _Call:
    """One escalation, encoded for a transport when first needed."""

    model: str
    texts: list[str] | None
    rows: list[np.ndarray]
    request_id: str | None
    labels: int
    _json: bytes | None = None

    _message: Any = None  # a ModelInferRequest (the stubs load lazily: see GrpcCenters)

    def json(self) -> bytes:
        if self._json is None:
            self._json = msgspec.json.encode(_request(self.texts, self.rows))
        return self._json

    def message(self) -> Any:
        """The gRPC ModelInferRequest, raw contents, built once however many centers are
        tried."""
        if self._message is None:
            from serving.gen import grpc_predict_v2_pb2 as pb  # see GrpcCenters

            request = pb.ModelInferRequest(model_name=self.model, id=self.request_id or "")
            for name, datatype, data in _tensors(self.texts, self.rows):
                request.inputs.add(name=name, datatype=datatype, shape=list(np.shape(data)))
                request.raw_input_contents.append(v2.raw(datatype, data))
            request.outputs.add(name="probabilities")
            self._message = request
        return self._message


class GrpcCenters:
    """gRPC V2 calls to centers (``grpc://`` / ``grpcs://`` URLs), one channel per center.

    The generated stubs (package ``inference``) are imported on first use, not with this
    module: one process can hold one ``inference`` package, and a program that imports the
    edge's modules may hold tritonclient's."""

    def __init__(self, ca: Path | None) -> None:
        self.ca = ca
        self.channels: dict[str, grpc.aio.Channel] = {}
        self._closing: set[asyncio.Task[None]] = set()

    def channel(self, url: str) -> grpc.aio.Channel:
        found = self.channels.get(url)
        if found is None:
            target = url.split("://", 1)[1]
            if url.startswith("grpcs://"):
                credentials = grpc.ssl_channel_credentials(
                    self.ca.read_bytes() if self.ca is not None else None)
                found = grpc.aio.secure_channel(target, credentials, options=[
                    ("grpc.ssl_target_name_override", CENTER_NAME)] if self.ca else [])
            else:
                found = grpc.aio.insecure_channel(target)
            self.channels[url] = found
        return found

    def keep(self, urls: list[str]) -> None:
        """Close the channels of centers no longer listed."""
        for url in set(self.channels) - set(urls):
            task = asyncio.get_running_loop().create_task(self.channels.pop(url).close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def classify(self, url: str, call: _Call, timeout_s: float) -> CenterAnswer:
        from serving.gen import grpc_predict_v2_pb2 as pb  # see the class docstring

        request = call.message()
        metadata: dict[str, str] = {"x-request-id": call.request_id} if call.request_id else {}
        method = "inference.GRPCInferenceService/ModelInfer"
        with tracing.span(method, tracing.SpanKind.CLIENT, **{
                "rpc.system": "grpc", "rpc.service": "inference.GRPCInferenceService",
                "rpc.method": "ModelInfer", "server.address": url,
                "tiered.escalated": len(call.rows)}) as span:
            tracing.inject(metadata)
            try:
                response = await self.channel(url).unary_unary(
                    f"/{method}", request_serializer=pb.ModelInferRequest.SerializeToString,
                    response_deserializer=pb.ModelInferResponse.FromString)(
                    request, timeout=timeout_s, metadata=tuple(metadata.items()))
            except grpc.aio.AioRpcError as exc:
                if span is not None:
                    span.set_attribute("rpc.grpc.status_code", exc.code().value[0])
                raise _refused(exc) from None
        try:
            names = [o.name for o in response.outputs]
            raw = response.raw_output_contents[names.index("probabilities")]
            probabilities = np.frombuffer(raw, dtype="<f4").astype(np.float32).reshape(
                len(call.rows), call.labels)
        except (ValueError, IndexError) as exc:
            raise _Refused(f"unusable answer ({exc})") from exc
        return CenterAnswer(probabilities, response.model_version, url)

    async def close(self) -> None:
        channels, self.channels = list(self.channels.values()), {}
        await asyncio.gather(*(c.close() for c in channels), *self._closing)


def _retry_after(value: object) -> float | None:
    """A center's back-pressure (``Retry-After`` header or ``retry-after`` trailer): whole
    seconds, else none."""
    return float(value) if isinstance(value, str) and value.isdigit() else None


def _refused(exc: grpc.aio.AioRpcError) -> _Refused:
    code = exc.code()
    cooldown = (_retry_after(dict(exc.trailing_metadata() or ()).get("retry-after"))
                if code == grpc.StatusCode.UNAVAILABLE else None)
    # the caller's mistakes (a model the center does not have yet, say) say nothing about the
    # center's health; everything else does
    client_side = code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
                           grpc.StatusCode.FAILED_PRECONDITION)
    return _Refused(f"gRPC {code.name}", unhealthy=not client_side, cooldown=cooldown)


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


def _answer(response: httpx.Response, url: str, rows: int, labels: int) -> CenterAnswer:
    data = msgspec.json.decode(response.content)
    output = next(o for o in data["outputs"] if o["name"] == "probabilities")
    probabilities = np.asarray(output["data"], dtype=np.float32).reshape(rows, labels)
    return CenterAnswer(probabilities, str(data.get("model_version", "")), url)
