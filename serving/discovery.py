"""Consul: every process registers itself with a health check; edges follow centers and the
registry through the health API (passing instances only, blocking queries).

Consul is reached at ``CONSUL_HTTP_ADDR`` with ``CONSUL_HTTP_TOKEN`` (Consul's own names, read
into each service's settings). Without an address nothing here runs and the static settings
(``EDGE_CENTER_URL``, ``EDGE_REGISTRY``) apply. When the agent is unreachable, registrations
are retried and watchers keep the last list they had.
"""

from __future__ import annotations

import asyncio
import logging
import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

with warnings.catch_warnings():  # py-consul's aio module passes aiohttp a deprecated argument
    warnings.simplefilter("ignore", DeprecationWarning)
    import consul
    import consul.aio

log = logging.getLogger(__name__)
SERVICES = {"edge": "tiered-edge", "center": "tiered-center", "registry": "tiered-registry"}
CHECK_INTERVAL = "1s"
CHECK_TIMEOUT = "1s"
# Consul reaps a critical instance only after a minute whatever is asked below that.
DEREGISTER_AFTER = "1m"
RECHECK_S = 2.0  # how often a registration is confirmed (re-registered after an agent restart)
WAIT = "30s"  # blocking query wait
ERRORS = (aiohttp.ClientError, consul.ConsulException, TimeoutError, OSError, ValueError)


@dataclass(frozen=True)
class Instance:
    service_id: str
    address: str
    port: int
    tags: tuple[str, ...] = ()
    meta: dict[str, str] = field(default_factory=dict, compare=False, hash=False)
    passing: bool = True  # every check passing (a Watch with passing_only lists only these)

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}"

    @property
    def target(self) -> str:
        return f"{self.address}:{self.port}"


def client(address: str, token: str | None) -> consul.aio.Consul:
    host, _, port = address.removeprefix("http://").rpartition(":")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        # a bound on every call: a blocking query waits WAIT (+ jitter), a hung agent no longer
        return consul.aio.Consul(host=host or "127.0.0.1", port=int(port or 8500), token=token,
                                 connections_timeout=45)


@dataclass
class Registration:
    """One service instance on the local agent: registered, confirmed every few seconds
    (so an agent that restarted without its state gets it back, and new meta is published),
    deregistered on shutdown."""

    consul: consul.aio.Consul
    name: str
    service_id: str
    address: str
    port: int
    check: dict[str, Any]
    tags: list[str]
    meta: Callable[[], dict[str, str]]
    _published: dict[str, str] | None = None

    async def run(self) -> None:
        while True:
            try:
                await self.ensure()
            except ERRORS as exc:
                log.warning("consul: cannot register %s: %s", self.service_id, exc)
                self._published = None
            await asyncio.sleep(RECHECK_S)

    async def ensure(self) -> None:
        meta = self.meta()
        services = await self.consul.agent.services()
        if self.service_id in services and meta == self._published:
            return
        await self.consul.agent.service.register(
            self.name, service_id=self.service_id, address=self.address, port=self.port,
            tags=self.tags, meta=meta, check=self.check)
        if self._published is None:
            log.info("consul: registered %s as %s at %s:%s", self.service_id, self.name,
                     self.address, self.port)
        self._published = meta

    async def deregister(self) -> None:
        try:
            await self.consul.agent.service.deregister(self.service_id)
        except ERRORS as exc:
            log.warning("consul: cannot deregister %s: %s", self.service_id, exc)


def http_check(url: str, tls: bool = False) -> dict[str, Any]:
    """An HTTP(S) health check; over HTTPS the agent does not verify the certificate (it only
    asks whether the node is ready; edges verify centers themselves, against the fleet CA)."""
    check = consul.Check.http(url, CHECK_INTERVAL, timeout=CHECK_TIMEOUT,
                              deregister=DEREGISTER_AFTER)
    return check | ({"TLSSkipVerify": True} if tls else {})


def grpc_check(target: str, tls: bool = False) -> dict[str, Any]:
    """A gRPC health check; over TLS the agent does not verify the certificate (nodes do)."""
    check = consul.Check.grpc(target, CHECK_INTERVAL, timeout=CHECK_TIMEOUT,
                              deregister=DEREGISTER_AFTER)
    return check | ({"GRPCUseTLS": True, "TLSSkipVerify": True} if tls else {})


OnChange = Callable[[list[Instance]], Awaitable[None] | None]


@dataclass
class Watch:
    """The passing instances of one service (every registered one with ``passing_only``
    False, each marked), followed with blocking queries. When Consul is unreachable the last
    list stays in force (``on_change`` is not called)."""

    consul: consul.aio.Consul
    service: str
    on_change: OnChange
    instances: list[Instance] | None = None
    passing_only: bool = True

    async def run(self) -> None:
        index, delay = None, 0.5
        while True:
            try:
                index, nodes = await self.consul.health.service(
                    self.service, passing=self.passing_only, index=index, wait=WAIT)
            except ERRORS as exc:
                log.warning("consul: watching %s failed (%s); keeping %d known instances",
                            self.service, exc, len(self.instances or []))
                index = None
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
                continue
            delay = 0.5
            found = sorted({_instance(n) for n in nodes}, key=lambda i: i.service_id)
            if found != self.instances:
                self.instances = found
                log.info("consul: %s passing: %s%s", self.service,
                         [i.target for i in found if i.passing] or "none",
                         "" if self.passing_only else
                         f", failing: {[i.target for i in found if not i.passing]}")
                result = self.on_change(found)
                if result is not None:
                    await result


def _instance(node: dict[str, Any]) -> Instance:
    service = node["Service"]
    address = service.get("Address") or node["Node"]["Address"]
    passing = all(c.get("Status") == "passing" for c in node.get("Checks") or ())
    return Instance(service["ID"], address, int(service["Port"]), tuple(service.get("Tags") or ()),
                    dict(service.get("Meta") or {}), passing)
