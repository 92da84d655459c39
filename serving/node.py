"""What runs beside a tier's HTTP app: the model store watcher, the sync subscriber, the Consul
registration and the Consul watches the tier asked for. Started and stopped by the lifespan.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from serving import discovery
from sync.subscriber import Subscriber

if TYPE_CHECKING:
    from serving.app import Service

log = logging.getLogger(__name__)


class Node:
    def __init__(self, service: Service) -> None:
        self.service = service
        self.settings = s = service.settings
        self.consul = None
        if s.consul_http_addr:
            token = s.consul_http_token.get_secret_value() if s.consul_http_token else None
            self.consul = discovery.client(s.consul_http_addr, token)
        self.registries: list[discovery.Instance] = []
        self.subscriber: Subscriber | None = None
        if s.registry or self.consul is not None:
            m = service.metrics
            self.subscriber = Subscriber(s, service.repository, m.quality, m.registry,
                                         m.prefix, self._registry_target)
        self.registration: discovery.Registration | None = None
        self._tasks: list[asyncio.Task[None]] = []

    def _registry_target(self) -> str | None:
        """The static ``--registry``, else the first passing registry Consul lists."""
        if self.settings.registry:
            return self.settings.registry
        return self.registries[0].target if self.registries else None

    async def start(self) -> None:
        # serve what the store holds first (edge autonomy), then subscribe for what is new
        repository = self.service.repository
        await repository.refresh()
        self._spawn(repository.watch())
        if self.subscriber is not None:
            self._spawn(self.subscriber.run())
        if self.consul is not None:
            self._register()
            for name, on_change in self.service.watches().items():
                self._spawn(discovery.Watch(self.consul, name, on_change).run())
            if not self.settings.registry:
                self._spawn(discovery.Watch(self.consul, discovery.SERVICES["registry"],
                                            self._registries).run())

    def _register(self) -> None:
        s, tier = self.settings, self.service.repository.tier
        assert self.consul is not None
        self.registration = discovery.Registration(
            self.consul, discovery.SERVICES[tier], s.node_id, s.advertised, s.port,
            discovery.http_check(f"{s.scheme}://{s.advertised}:{s.port}/v2/health/ready",
                                 tls=s.tls_cert is not None),
            tags=[tier, f"region-{s.region}"], meta=self._meta)
        self._spawn(self.registration.run())

    def _meta(self) -> dict[str, str]:
        repository = self.service.repository
        versions = ",".join(f"{m}={repository.default_version(m)}" for m in repository.models())
        return {"tier": repository.tier, "region": self.settings.region,
                "node_id": self.settings.node_id, "versions": versions or "-"}

    def _registries(self, instances: list[discovery.Instance]) -> None:
        self.registries = instances

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        self._tasks.append(asyncio.create_task(work))

    async def stop(self) -> None:
        for task in self._tasks:  # first, so the registration loop cannot register again
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.registration is not None:
            await self.registration.deregister()
        if self.subscriber is not None:
            await self.subscriber.close()
        if self.consul is not None:
            await self.consul.close()
