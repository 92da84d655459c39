"""Escalation to one center over V2 REST (``http://`` / ``https://``)."""

from __future__ import annotations

import ssl
from pathlib import Path

import httpx
import msgspec
import numpy as np

from edge.call import CENTER_NAME, Call, CenterAnswer, Refused, retry_after
from edge.centers import CenterURL
from serving.protocol import v2
from serving.telemetry import tracing


def http_pool(timeout_s: float, ca: Path | None,
              transport: httpx.AsyncBaseTransport | None = None) -> httpx.AsyncClient:
    """The connection pool every REST center shares; ``ca``: certificates must chain to the
    fleet CA (``HttpCenter`` checks the center's name)."""
    verify: ssl.SSLContext | bool = (ssl.create_default_context(cafile=str(ca))
                                     if ca is not None else True)
    return httpx.AsyncClient(timeout=timeout_s, transport=transport, verify=verify,
                             limits=httpx.Limits(max_connections=64))


class HttpCenter:
    """One center's ``/v2/models/{model}/infer``. ``pinned`` (a fleet CA is set): HTTPS only,
    to a certificate carrying the center's TLS name (its node's for a center found in Consul,
    the center role's for a configured URL)."""

    def __init__(self, center: CenterURL, http: httpx.AsyncClient, pinned: bool) -> None:
        self.url, self.center, self.http, self.pinned = center.url, center, http, pinned
        self.extensions = {"sni_hostname": center.tls_name or CENTER_NAME} if pinned else {}

    async def classify(self, call: Call) -> CenterAnswer:
        if self.pinned and not self.center.tls:
            raise Refused("not TLS (center_ca is set)")
        target = f"{self.url}/v2/models/{call.model}/infer"
        content, header_length = call.body()
        headers = {"content-type": "application/octet-stream",
                   v2.HEADER_LENGTH: str(header_length)}
        if call.request_id:
            headers["x-request-id"] = call.request_id
        with tracing.span("POST", tracing.SpanKind.CLIENT, **{
                "http.request.method": "POST", "url.full": target,
                "tiered.escalated": call.rows, "tiered.request_bytes": len(content)}) as span:
            tracing.inject(headers)  # the center's span is this call's child
            try:
                response = await self.http.post(target, content=content, headers=headers,
                                                extensions=self.extensions)
            except httpx.HTTPError as exc:
                if span is not None:
                    span.set_attributes({"error.type": type(exc).__name__})
                raise Refused(type(exc).__name__) from exc
            if span is not None:
                span.set_attribute("http.response.status_code", response.status_code)
        if response.status_code != 200:
            raise Refused(f"HTTP {response.status_code}",
                          # a 4xx (a model the center does not have yet, say) says nothing
                          # about its health; a 503's Retry-After is its back-pressure
                          unhealthy=response.status_code >= 500,
                          cooldown=retry_after(response.headers.get("retry-after"))
                          if response.status_code == 503 else None)
        try:
            return _answer(response, self.url, call.rows, call.labels)
        except (ValueError, KeyError, msgspec.DecodeError) as exc:
            raise Refused(f"unusable answer ({exc})") from exc

    async def close(self) -> None:
        """Nothing of its own: the pool is shared (closed by ``edge.escalation.Centers``)."""


def _answer(response: httpx.Response, url: str, rows: int, labels: int) -> CenterAnswer:
    data = msgspec.json.decode(response.content)
    output = next(o for o in data["outputs"] if o["name"] == "probabilities")
    probabilities = np.asarray(output["data"], dtype=np.float32).reshape(rows, labels)
    return CenterAnswer(probabilities, str(data.get("model_version", "")), url)
