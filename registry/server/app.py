"""The ``registry serve`` entry point: owns the signals, the metrics endpoint and the server."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal

import uvloop

from registry.ha import changes, leader
from registry.server import replication
from registry.server.metrics import SyncMetrics, serve_http
from registry.server.rpc import SyncServer
from registry.server.session import Database
from registry.settings import RegistrySettings
from registry.store.db import transaction
from registry.store.role import set_role
from registry.trust import anchor
from serving import tasks
from serving.fleet import discovery
from serving.telemetry.logs import configure

log = logging.getLogger(__name__)


async def serve(settings: RegistrySettings) -> None:
    # a node that missed three reports is gone from the fleet's gauges (as from the budgets)
    metrics = SyncMetrics(node_series=settings.node_series,
                          stale_after_s=3 * settings.report_interval_s)
    http = None
    if settings.metrics_port is not None:
        http = serve_http(metrics, settings.host, settings.metrics_port)
    server = SyncServer(settings, metrics)
    port = await server.start()
    tls = "TLS" if settings.tls_cert else "plaintext"
    log.info("registry serving sync on %s:%s (%s)%s", settings.host, port, tls,
             f", metrics on :{http.server_port}" if http else "",
             extra={"fields": {"grpc_port": port, "metrics_port":
                               http.server_port if http else None}})
    roles = Roles(settings, server, metrics, port)
    await roles.start()
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    await stopping.wait()
    log.info("stopping")
    await roles.stop()
    await server.stop(grace=5)
    if http is not None:
        http.shutdown()


class Roles:
    """What this registry is and does about it: standalone (registered as ``tiered-registry``,
    serving nodes), a standby (refusing nodes and writes, following its primary, registered as
    ``tiered-registry-standby``), or the primary of an HA group (``registry.ha.leader``).

    Why one class: a change of role moves four things together (the role in the database,
    whether nodes are served, which Consul service is registered, whether a follower runs);
    apart, one could change without the others (a primary registered as a standby)."""

    def __init__(self, settings: RegistrySettings, server: SyncServer, metrics: SyncMetrics,
                 port: int) -> None:
        self.settings, self.server, self.metrics, self.port = settings, server, metrics, port
        self.registry_id = replication.default_id(settings, port)
        server.registry_id = self.registry_id
        self.address = discovery.host_port(settings.advertised, port)
        self.leadership: leader.Leadership | None = None
        self.electing: asyncio.Task[None] | None = None
        self.follower: replication.Follower | None = None
        self.following: asyncio.Task[None] | None = None
        self.registration: discovery.Registration | None = None
        self.registering: asyncio.Task[None] | None = None
        self.primary_of: str | None = None  # the static --follow target, or Consul's holder
        self.pruning: asyncio.Task[None] | None = None
        metrics.replication(self)

    @property
    def db(self) -> Database:
        return self.server.db

    async def start(self) -> None:
        s = self.settings
        self.pruning = asyncio.create_task(self.prune())
        if s.ha:
            self.leadership = leader.Leadership(
                s, self.registry_id, self.address, self.db.run,
                lambda: self.db.catalog.db, self._promote, self._demote)
            await self._demote(None)  # a standby until the lock says otherwise
            self.electing = asyncio.create_task(self.leadership.run())
        elif s.follow:
            await self._demote(s.follow)
        else:
            await self._set_role("standalone", None)
            await self._register(discovery.SERVICES["registry"])

    async def _set_role(self, role: str, leader_address: str | None) -> None:
        def change() -> None:
            with transaction(self.db.catalog.db) as conn:
                set_role(conn, role, registry_id=self.registry_id,
                         leader=leader_address)

        await self.db.run(change)

    async def _promote(self, term: int, previous: str | None) -> None:
        """The lock is ours (the role and lease are in the database already): stop following,
        record the promotion in the audit chain, serve nodes, register as the registry."""
        await self._stop_following()
        settings = self.settings

        def record() -> None:
            with anchor.audited(self.db.catalog.db, self.db.anchor) as conn:
                leader.promotion_record(conn, settings.actor, self.registry_id, term, previous)

        await self.db.run(record)
        self.server.service.refusing = None
        self.primary_of = self.address
        await self._register(discovery.SERVICES["registry"])
        log.info("primary for term %d (previous primary: %s)", term, previous or "none")

    async def _demote(self, primary: str | None) -> None:
        """Follow ``primary`` (None: unknown yet): refuse nodes and writes, register as a
        standby."""
        self.primary_of = primary
        await self._set_role("standby", primary)
        self.server.service.refusing = (f"this registry is a standby; the primary is "
                                        f"{primary or 'being elected'}")
        for session in list(self.server.service.sessions.values()):
            session.close()
        await self._register(discovery.SERVICES["registry-standby"])
        if self.following is None:
            self.follower = replication.Follower(self.settings, self.db, self.registry_id,
                                               self._target)
            self.following = asyncio.create_task(self.follower.run())

    def _target(self) -> str | None:
        if self.primary_of is None or self.primary_of == self.address:
            return None
        return self.primary_of

    async def _stop_following(self) -> None:
        await tasks.stop(self.following)
        self.following = None

    async def _register(self, name: str) -> None:
        if not self.settings.consul_http_addr:
            return
        address = self.settings.consul_http_addr
        if self.registration is not None and self.registration.name == name:
            return
        await self._deregister()
        settings, port = self.settings, self.port
        token = settings.consul_http_token
        client = discovery.client(address, token.get_secret_value() if token else None)
        target = f"{settings.advertised}:{port}"
        self.registration = discovery.Registration(
            client, name, f"registry-{settings.advertised}-{port}", settings.advertised, port,
            discovery.grpc_check(target, tls=settings.tls_cert is not None), tags=["registry"],
            meta=lambda: {"tier": "registry", "registry_id": self.registry_id,
                          "metrics_port": str(settings.metrics_port or "")})
        self.registering = asyncio.create_task(self.registration.run())

    async def _deregister(self) -> None:
        if self.registration is None or self.registering is None:
            return
        await tasks.stop(self.registering)  # first, so it cannot register again
        with contextlib.suppress(*leader.ERRORS):
            await self.registration.deregister()
        await self.registration.consul.close()
        self.registration = self.registering = None

    async def prune(self, every_s: float = 60.0) -> None:
        """Keep ``changes_kept`` captured changes, on any role (nothing else deletes them)."""
        kept = self.settings.changes_kept

        def once() -> int:
            with transaction(self.db.catalog.db) as conn:
                return changes.prune(conn, kept)

        while True:
            try:
                deleted = await self.db.run(once)
                if deleted:
                    log.info("pruned %d captured changes (keeping %d)", deleted, kept)
            except Exception:  # a busy database: the next minute
                log.exception("pruning captured changes failed")
            await asyncio.sleep(every_s)

    async def stop(self) -> None:
        await tasks.stop(self.pruning, self.electing)
        if self.leadership is not None:
            await self.leadership.stop()
        await self._stop_following()
        await self._deregister()


def run(settings: RegistrySettings) -> None:
    configure("registry", "INFO", None, 10 * 1024 * 1024, 3)
    uvloop.run(serve(settings))
