"""A node's membership of the fleet: its Consul registration, the Consul services its tier
follows, the registries Consul lists, and the background workers it is handed (the sync
subscriber). It imports neither the transports nor the sync package: the entry point wires them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, Protocol

import consul.aio

from serving import tasks
from serving.config.settings import ServingSettings
from serving.fleet import discovery
from serving.fleet.discovery import OnChange
from serving.runtime.repository import Repository

log = logging.getLogger(__name__)


class Worker(Protocol):
    async def run(self) -> None: ...  # until cancelled

    async def close(self) -> None: ...


class Node:
    def __init__(self, settings: ServingSettings, repository: Repository,
                 watches: dict[str, OnChange]) -> None:
        self.settings, self.repository, self.watches = settings, repository, watches
        self.consul: consul.aio.Consul | None = None  # created in start(), inside the loop
        self.registries: list[discovery.Instance] = []
        self.workers: list[Worker] = []
        self.registration: discovery.Registration | None = None
        self._tasks: list[asyncio.Task[None]] = []
        # False in the second and later of several workers (serving.transport.workers): they
        # follow the services the tier watches but neither register nor run the node's workers
        # (sync)
        self.primary = True

    @property
    def discovers(self) -> bool:
        """Whether this node follows Consul (else only what its settings name)."""
        return bool(self.settings.consul_http_addr)

    def add(self, worker: Worker) -> None:
        """Run ``worker`` from start to stop."""
        self.workers.append(worker)

    def registry_target(self) -> str | None:
        """The static ``--registry``, else the first passing registry Consul lists."""
        if self.settings.registry:
            return self.settings.registry
        return self.registries[0].target if self.registries else None

    async def start(self) -> None:
        s = self.settings
        for worker in self.workers if self.primary else []:
            self._spawn(worker.run())
        if not self.discovers:
            return
        token = s.consul_http_token.get_secret_value() if s.consul_http_token else None
        self.consul = discovery.client(s.consul_http_addr or "", token)
        if self.primary:
            self._register()
        for name, on_change in self.watches.items():
            self._spawn(discovery.Watch(self.consul, name, on_change).run())
        if not s.registry:
            self._spawn(discovery.Watch(self.consul, discovery.SERVICES["registry"],
                                        self._registries).run())

    def _register(self) -> None:
        s, tier = self.settings, self.repository.tier
        assert self.consul is not None
        tls = s.tls_cert is not None
        grpc = ([discovery.grpc_check(discovery.host_port(s.advertised, s.grpc_port), tls=tls)]
                if s.grpc_port else [])
        self.registration = discovery.Registration(
            self.consul, discovery.SERVICES[tier], s.node_id, s.advertised, s.port,
            discovery.http_check(f"{s.scheme}://{s.advertised}:{s.port}/v2/health/ready",
                                 tls=tls),
            tags=[tier, f"region-{s.region}"], meta=self._meta, extra_checks=grpc)
        self._spawn(self.registration.run())

    def _meta(self) -> dict[str, str]:
        repository = self.repository
        versions = ",".join(f"{m}={repository.default_version(m)}" for m in repository.models())
        grpc = {"grpc_port": str(self.settings.grpc_port)} if self.settings.grpc_port else {}
        return {"tier": repository.tier, "region": self.settings.region,
                "node_id": self.settings.node_id, "versions": versions or "-", **grpc}

    def _registries(self, instances: list[discovery.Instance]) -> None:
        self.registries = instances

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        self._tasks.append(asyncio.create_task(work))

    async def stop(self) -> None:
        await tasks.stop(*self._tasks)  # first, so the registration loop cannot register again
        if self.registration is not None:
            await self.registration.deregister()
        for worker in self.workers if self.primary else []:
            await worker.close()
        if self.consul is not None:
            await self.consul.close()
