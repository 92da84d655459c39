"""Escalation client: unsure rows to a center in one batched V2 call, failing over cleanly.

Centers are tried in turn, skipping those whose circuit is open. A 503 with Retry-After opens
that center's circuit for that long (back-pressure: the edge does not hammer it). When no
center answers, the caller answers from the edge, marked degraded.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import httpx
import msgspec
import numpy as np

from edge.breaker import CircuitBreaker
from edge.errors import CenterUnavailable
from serving import tracing, v2
from serving.text import pad

# The TLS server name of a center's certificate (registry.pki): checked in the handshake,
# before the request, so a registry's certificate from the same CA cannot pass for a center.
CENTER_NAME = "center.tiered.invalid"

@dataclass(frozen=True)
class CenterAnswer:
    probabilities: np.ndarray
    version: str
    url: str


class CenterClient:
    def __init__(self, urls: list[str], timeout_s: float, failures: int, reset_s: float,
                 transport: httpx.AsyncBaseTransport | None = None,
                 ca: Path | None = None) -> None:
        """``ca``: the fleet CA; then only HTTPS centers with a center-role certificate."""
        self.urls = [u.rstrip("/") for u in urls]
        self.pinned = ca is not None
        self.extensions = {"sni_hostname": CENTER_NAME} if self.pinned else {}
        self._failures, self._reset_s = failures, reset_s
        self.breakers = {url: CircuitBreaker(failures, reset_s) for url in self.urls}
        verify: ssl.SSLContext | bool = (ssl.create_default_context(cafile=str(ca))
                                         if ca is not None else True)
        self.http = httpx.AsyncClient(timeout=timeout_s, transport=transport, verify=verify,
                                      limits=httpx.Limits(max_connections=64))
        self._turn = 0

    def set_urls(self, urls: list[str]) -> None:
        """Follow discovery: keep the breakers of centers that stay, forget the others."""
        self.urls = [u.rstrip("/") for u in urls]
        self.breakers = {url: self.breakers.get(url) or CircuitBreaker(self._failures,
                                                                       self._reset_s)
                         for url in self.urls}

    def _order(self) -> list[str]:
        """Round-robin start so escalations spread over centers."""
        urls = self.urls
        self._turn = (self._turn + 1) % max(1, len(urls))
        return urls[self._turn:] + urls[:self._turn]

    async def classify(self, model: str, texts: list[str] | None, rows: list[np.ndarray],
                       request_id: str | None, labels: int) -> CenterAnswer:
        body = msgspec.json.encode(_request(texts, rows))
        headers = {"content-type": "application/json"}
        if request_id:
            headers["x-request-id"] = request_id
        reasons = []
        breakers = self.breakers  # set_urls replaces the dict: this call keeps a coherent view
        for url in self._order():
            breaker = breakers[url]
            if not breaker.allow():
                reasons.append(f"{url}: circuit open")
                continue
            if self.pinned and not url.startswith("https://"):
                breaker.failure()
                reasons.append(f"{url}: not HTTPS (center_ca is set)")
                continue
            target = f"{url}/v2/models/{model}/infer"
            with tracing.span("POST", tracing.SpanKind.CLIENT, **{
                    "http.request.method": "POST", "url.full": target,
                    "tiered.escalated": len(rows)}) as call:
                sent = dict(headers)
                tracing.inject(sent)  # the center's span is this call's child
                try:
                    response = await self.http.post(target, content=body, headers=sent,
                                                    extensions=self.extensions)
                except httpx.HTTPError as exc:
                    breaker.failure()
                    reasons.append(f"{url}: {type(exc).__name__}")
                    if call is not None:
                        call.set_attributes({"error.type": type(exc).__name__})
                    continue
                if call is not None:
                    call.set_attribute("http.response.status_code", response.status_code)
            if response.status_code != 200:
                _judge(breaker, response)
                reasons.append(f"{url}: HTTP {response.status_code}")
                continue
            try:
                answer = _answer(response, url, len(rows), labels)
            except (ValueError, KeyError, msgspec.DecodeError) as exc:
                breaker.failure()
                reasons.append(f"{url}: unusable answer ({exc})")
                continue
            breaker.success()
            return answer
        raise CenterUnavailable("; ".join(reasons) or "no center configured")

    def circuits(self) -> dict[str, str]:
        return {url: breaker.state for url, breaker in self.breakers.items()}

    async def close(self) -> None:
        await self.http.aclose()


def _request(texts: list[str] | None, rows: list[np.ndarray]) -> dict[str, object]:
    if texts is not None:
        inputs = [{"name": v2.TEXT, "shape": [len(texts)], "datatype": "BYTES", "data": texts}]
    else:
        enc = pad(rows)
        shape = list(enc.input_ids.shape)
        inputs = [{"name": v2.IDS, "shape": shape, "datatype": "INT64",
                   "data": enc.input_ids.ravel().tolist()},
                  {"name": v2.MASK, "shape": shape, "datatype": "INT64",
                   "data": enc.attention_mask.ravel().tolist()}]
    return {"inputs": inputs, "outputs": [{"name": "probabilities"}]}


def _judge(breaker: CircuitBreaker, response: httpx.Response) -> None:
    if response.status_code == 503:
        retry = response.headers.get("retry-after", "")
        breaker.failure(cooldown=float(retry) if retry.isdigit() else None)
    elif response.status_code >= 500:
        breaker.failure()
    # a 4xx (say, a model the center does not have yet) says nothing about its health


def _answer(response: httpx.Response, url: str, rows: int, labels: int) -> CenterAnswer:
    data = msgspec.json.decode(response.content)
    output = next(o for o in data["outputs"] if o["name"] == "probabilities")
    probabilities = np.asarray(output["data"], dtype=np.float32).reshape(rows, labels)
    return CenterAnswer(probabilities, str(data.get("model_version", "")), url)
