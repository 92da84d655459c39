"""Escalation: unsure rows to a center in one batched V2 call, failing over cleanly.

Centers are tried in turn (round-robin start), skipping those whose circuit is open. A 503
with Retry-After (or gRPC UNAVAILABLE with a retry-after trailer) opens that center's circuit
for that long (back-pressure: the edge does not hammer it). When no center answers, the caller
answers from the edge, marked degraded. Each center is reached by a single-center client
(``edge.http_center``, ``edge.grpc_center``), which also holds its transport's TLS pinning.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from edge.breaker import CircuitBreaker
from edge.call import Call, CenterAnswer, CenterClient, Refused
from edge.centers import CenterURL
from edge.errors import CenterUnavailable
from edge.grpc_center import GrpcCenter
from edge.http_center import HttpCenter, http_pool
from serving.protocol import v2

__all__ = ["CenterAnswer", "CenterUnavailable", "Centers", "Transports"]


class Transports:
    """Makes the client of one center by its URL's transport; owns what REST centers share
    (one connection pool, verified against the fleet CA when ``ca`` is set)."""

    def __init__(self, timeout_s: float, ca: Path | None,
                 http: httpx.AsyncBaseTransport | None = None) -> None:
        """``http``: the REST pool's transport (tests pass a mock)."""
        self.timeout_s, self.ca = timeout_s, ca
        self.http = http_pool(timeout_s, ca, http)

    def connect(self, center: CenterURL) -> CenterClient:
        if center.transport == "grpc":
            return GrpcCenter(center, self.timeout_s, self.ca)
        return HttpCenter(center, self.http, pinned=self.ca is not None)

    async def close(self) -> None:
        await self.http.aclose()


class Centers:
    """The centers escalations go to: failover across single-center clients, a circuit breaker
    each. Follows discovery (``set_urls``); ``configured``: the ``center_url`` list, used
    while discovery lists none."""

    def __init__(self, transports: Transports, configured: list[CenterURL], failures: int,
                 reset_s: float) -> None:
        self.transports, self.configured = transports, configured
        self._failures, self._reset_s = failures, reset_s
        self.clients: dict[str, CenterClient] = {}
        self.centers: dict[str, CenterURL] = {}  # url -> what its client was made for
        self.breakers: dict[str, CircuitBreaker] = {}
        self._closing: set[asyncio.Task[None]] = set()
        self._turn = 0
        self.set_urls(configured)

    @property
    def urls(self) -> list[str]:
        return list(self.clients)

    def set_urls(self, centers: list[CenterURL]) -> None:
        """Follow discovery: keep the clients and breakers of centers that stay, close the
        others' clients."""
        wanted = {c.url: c for c in centers}
        # a client is kept only for the very same center (a URL now claimed by another node
        # id must be checked for that node's TLS name)
        clients = {url: self.clients[url] if self.centers.get(url) == c and url in self.clients
                   else self.transports.connect(c) for url, c in wanted.items()}
        self.breakers = {url: self.breakers.get(url) or CircuitBreaker(self._failures,
                                                                       self._reset_s)
                         for url in clients}
        dropped = [c for url, c in self.clients.items() if clients.get(url) is not c]
        self.clients, self.centers = clients, wanted
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop: none of them opened a connection (they open in one)
            return
        for client in dropped:
            task = loop.create_task(client.close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    def follow(self, discovered: list[CenterURL]) -> None:
        """The centers discovery says are passing; the configured ones when none is."""
        self.set_urls(discovered or self.configured)

    def _order(self) -> list[str]:
        """Round-robin start so escalations spread over centers."""
        urls = self.urls
        self._turn = (self._turn + 1) % max(1, len(urls))
        return urls[self._turn:] + urls[:self._turn]

    async def classify(self, model: str, inputs: list[v2.Tensor], rows: int,
                       request_id: str | None, labels: int) -> CenterAnswer:
        """The first answer of a center whose circuit lets the call through for ``rows`` rows
        carried by ``inputs``; raises CenterUnavailable (every reason) when none answers."""
        call = Call(model, inputs, rows, request_id, labels)
        reasons = []
        # set_urls replaces both dicts: this call keeps a coherent view
        clients, breakers = self.clients, self.breakers
        for url in self._order():
            breaker = breakers[url]
            if not breaker.allow():
                reasons.append(f"{url}: circuit open")
                continue
            try:
                answer = await clients[url].classify(call)
            except Refused as exc:
                if exc.unhealthy:
                    breaker.failure(cooldown=exc.cooldown)
                reasons.append(f"{url}: {exc}")
                continue
            breaker.success()
            return answer
        raise CenterUnavailable("; ".join(reasons) or "no center configured")

    def circuits(self) -> dict[str, str]:
        return {url: breaker.state for url, breaker in self.breakers.items()}

    async def close(self) -> None:
        clients, self.clients = list(self.clients.values()), {}
        await asyncio.gather(*(c.close() for c in clients), *self._closing)
        await self.transports.close()
