"""``registry serve``'s gRPC server: the Sync and Replication services and gRPC health behind
token auth, with the loops beside them (``registry.server.ticks``), started and stopped in one
order. All SQLite work runs on one worker thread, off the event loop."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from registry.server.limits import RefusalRecords, Refusals
from registry.server.metrics import SyncMetrics
from registry.server.replication import ReplicationService
from registry.server.service import SyncService
from registry.server.session import Database
from registry.server.ticks import Ticks
from registry.settings import RegistrySettings
from serving.config.tokens import TokenVerifier
from serving.protocol.keepalive import KEEPALIVE, Keepalive
from serving.protocol.wire import ParseInterceptor
from sync.gen import sync_pb2_grpc as pb_grpc
from sync.wire import auth

SERVICE = "tiered.sync.v1.Sync"
MAX_PENDING_CALLS = 20_000  # calls gRPC holds until the event loop takes them: its default
# (1,000, refused from 3,000 on) cancelled most of 10,000 nodes' streams when they connected at
# once (bench.fleet), and each came back with its backoff: a connect storm of minutes
MAX_UNTAKEN_S = 120  # ... and for this long (default 30 s: a storm of 10,000 is longer here)
MAX_MESSAGE = 1 << 20  # nodes send small messages only: hello, acks, reports


class SyncServer:
    """Explicit start/stop; the entry point (``registry serve``) owns the signals."""

    def __init__(self, settings: RegistrySettings, metrics: SyncMetrics | None = None,
                 keepalive: Keepalive = KEEPALIVE) -> None:
        """``keepalive``: the pings nodes and standbys send that it permits, and its own to
        them (tests shorten them)."""
        if settings.token is None:
            raise ValueError("registry serve needs its secret: set REGISTRY_TOKEN (or "
                             "REGISTRY_TOKEN_FILE)")
        self.settings, self.keepalive = settings, keepalive
        self.metrics = metrics or SyncMetrics()
        self.db = Database(settings)
        self.service = SyncService(settings, self.db, self.metrics)
        self.verifier = TokenVerifier(settings.token.get_secret_value(),
                                      lambda node_id: self.service.generations.get(node_id, 1))
        self.registry_id = settings.registry_id or ""
        self.replication = ReplicationService(settings, self.db, lambda: self.registry_id)
        self.health = health.aio.HealthServicer()
        self.refused = RefusalRecords(
            Refusals(settings.refusal_limit, settings.refusal_interval_s), self.metrics.denied,
            lambda rows: self.db.run(self.db.nodes.refused_calls, rows))
        self.ticks = Ticks(settings, self.db, self.service, self.metrics)
        self.port = 0
        self._server: grpc.aio.Server | None = None

    async def start(self) -> int:
        await self.db.open()
        await self.ticks.advance()
        await self.db.run(self.db.nodes.all_disconnected)
        await self.service.load_generations()
        await self.service.intake.load_policies()
        server = grpc.aio.server(
            # the token is checked first; both see the tolerant deserializer (wire.py)
            interceptors=[auth.TokenInterceptor(self.verifier, self.refused.note),
                          ParseInterceptor(f"/{SERVICE}/")],
            options=[("grpc.max_receive_message_length", MAX_MESSAGE),
                     *self.keepalive.pinging_server(),
                     ("grpc.server.max_pending_requests", MAX_PENDING_CALLS),
                     ("grpc.server.max_pending_requests_hard_limit", MAX_PENDING_CALLS),
                     ("grpc.server_max_unrequested_time_in_server", MAX_UNTAKEN_S),
                     ("grpc.max_concurrent_streams", self.settings.max_concurrent_streams)])
        pb_grpc.add_SyncServicer_to_server(self.service, server)
        pb_grpc.add_ReplicationServicer_to_server(self.replication, server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        address = f"{self.settings.host}:{self.settings.grpc_port}"
        s = self.settings
        if s.tls_cert is not None and s.tls_key is not None:
            self.port = server.add_secure_port(address, auth.server_credentials(s.tls_cert,
                                                                                s.tls_key))
        else:
            self.port = server.add_insecure_port(address)
        await server.start()
        self._server = server
        for name in ("", SERVICE):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        self.ticks.start()
        self.refused.start()
        self.service.writes.start()
        return self.port

    async def stop(self, grace: float = 5.0) -> None:
        for name in ("", SERVICE):
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.ticks.stop()
        for session in list(self.service.sessions.values()):
            session.close()
        if self._server is not None:
            await self._server.stop(grace)
        await self.refused.stop()  # the last interval's, once no call can add to it
        await self.service.intake.stop()
        await self.service.writes.stop()  # every stream has ended: its goodbye is queued too
        self.db.close()
