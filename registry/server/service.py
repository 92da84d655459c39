"""``registry serve``: the gRPC sync service (Sync + Fetch), gRPC health, token auth.

Desired releases are pushed: a watcher notices commits made by other processes (``registry
publish``/``promote``/``rollback`` write the same SQLite file) through ``PRAGMA data_version``
and sends each connected node the releases that changed for it. All SQLite work runs on one
worker thread, off the event loop. What nodes send up (acks, quality reports, and the budgets
they move) is ``registry.server.intake``'s; the bytes Fetch streams are ``registry.server.fetch``'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from registry.errors import NotPrimary
from registry.fleet import nodes
from registry.fleet.nodes import Held
from registry.releases import waves
from registry.releases.plan import RolloutNode
from registry.server.fetch import Artifacts
from registry.server.intake import Intake, platform
from registry.server.limits import Refusals
from registry.server.metadata import TrustMetadata
from registry.server.metrics import SyncMetrics
from registry.server.push import Pusher
from registry.server.replication import ReplicationService
from registry.server.session import Database, Session, WriteBehind
from registry.server.witness import Witnesses
from registry.settings import RegistrySettings
from registry.store import chain
from registry.store.chain import Head
from serving import tasks
from serving.config.tokens import NODE_ID, NodeToken, TokenVerifier
from serving.protocol.keepalive import KEEPALIVE, Keepalive
from serving.protocol.wire import Malformed, ParseInterceptor
from serving.release.manifest import is_valid_name
from sync.gen import sync_pb2 as pb
from sync.gen import sync_pb2_grpc as pb_grpc
from sync.wire import auth

log = logging.getLogger(__name__)
SERVICE = "tiered.sync.v1.Sync"
MAX_UNWRITTEN = 1_000  # refused-call records (one per interval) kept while the database
# cannot take them
MAX_PENDING_CALLS = 20_000  # calls gRPC holds until the event loop takes them: its default
# (1,000, refused from 3,000 on) cancelled most of 10,000 nodes' streams when they connected at
# once (bench.fleet), and each came back with its backoff: a connect storm of minutes
MAX_UNTAKEN_S = 120  # ... and for this long (default 30 s: a storm of 10,000 is longer here)
MAX_MESSAGE = 1 << 20  # nodes send small messages only: hello, acks, reports


def _shown(text: str, limit: int = 40) -> str:
    """Something a node said, fit for a log line or an error: control characters escaped,
    at most ``limit`` characters of it."""
    return repr(text[:limit]) + ("..." if len(text) > limit else "")


class SyncService(pb_grpc.SyncServicer):
    """The one gRPC servicer of the Sync service; its parts share the open sessions."""

    def __init__(self, settings: RegistrySettings, db: Database, metrics: SyncMetrics) -> None:
        self.settings, self.db, self.metrics = settings, db, metrics
        self.sessions: dict[str, Session] = {}
        self.generations: dict[str, int] = {}  # node id -> token generation, if not 1
        self.refusing: str | None = None  # why nodes are turned away (a standby says whom to ask)
        self.writes = WriteBehind(db, settings.node_write_interval_s)
        self.intake = Intake(settings, db, metrics, self.sessions, self.writes)
        self.artifacts = Artifacts(settings, db, metrics, self.sessions)
        self.metadata = TrustMetadata(settings, db, self.sessions)
        self.pusher = Pusher(db, metrics, self.sessions, self.metadata)
        self.witnesses = Witnesses(db, metrics, self.sessions, self.writes, self.metadata)

    async def Sync(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        first = await context.read()
        if isinstance(first, Malformed):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, first.details)
        if first is grpc.aio.EOF or first.WhichOneof("kind") != "hello":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first message must be "
                                "a hello")
        if self.refusing is not None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, self.refusing)
        session = await self._open(first.hello, context)
        reader = asyncio.create_task(self._read(session, context))
        try:
            await context.write(pb.ServerMessage(welcome=pb.Welcome(
                registry=self.settings.actor,
                report_interval_s=self.settings.report_interval_s)))
            self.metadata.send(session)
            await self.pusher.push(session)
            self.witnesses.send(session)  # after the releases: the head as last told
            session.pushed.set()  # Fetch serves what ``sent`` holds from now on
            while (message := await session.outbox.get()) is not None:
                await context.write(message)
            if session.error is not None:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, session.error)
        finally:
            await tasks.stop(reader)
            await self._close(session)

    async def _open(self, hello: pb.Hello, context: grpc.aio.ServicerContext) -> Session:
        token = await _admitted(hello, context)
        held = [Held(h.model, sorted(h.versions), h.active or None) for h in hello.held
                if is_valid_name(h.model)]
        session = Session(RolloutNode(token.node_id, token.tier, token.region), context.peer(),
                          {h.model: h.active for h in held if h.active}, token.generation,
                          root_version=max(0, hello.root_version))
        superseded = self.sessions.get(session.node.node_id)
        if superseded is not None:  # a reconnect before the old stream timed out, or a clash
            log.warning("node %s connected again from %s; closing its stream from %s (two "
                        "nodes sharing one id would keep taking turns)", hello.node_id,
                        session.peer, superseded.peer)
            superseded.close()
        self.sessions[session.node.node_id] = session
        self.metrics.connections.inc()
        self.metrics.connected.set(len(self.sessions))
        self.writes.add(nodes.hello(session.node, session.peer, held, platform(hello.platform)))
        if hello.HasField("witness"):
            await self.witnesses.shown(session, hello.witness)
        log.info("node %s (%s, %s) connected from %s holding %s", session.node.node_id,
                 session.node.tier, session.node.region, session.peer, session.active)
        return session

    async def _close(self, session: Session) -> None:
        node_id = session.node.node_id
        if self.sessions.get(node_id) is session:
            del self.sessions[node_id]
            self.writes.add(nodes.goodbye(node_id))
            self.metrics.disconnections.inc()
            log.info("node %s disconnected", node_id)
            self.intake.gone(node_id)
        self.metrics.connected.set(len(self.sessions))

    async def load_generations(self) -> None:
        """Token generations (raised by ``registry node revoke``): a revoked node's stream is
        closed, and its old token refused from now on."""
        self.generations = await self.db.run(self.db.nodes.generations)
        for node_id, session in list(self.sessions.items()):
            if self.generations.get(node_id, 1) != session.generation:
                log.warning("node %s: token revoked; closing its stream", node_id)
                session.close()

    async def _read(self, session: Session, context: grpc.aio.ServicerContext) -> None:
        try:
            while (message := await context.read()) is not grpc.aio.EOF:
                if isinstance(message, Malformed):
                    session.error = message.details
                    break
                kind = message.WhichOneof("kind")
                if kind == "hello":
                    session.error = "hello sent twice on one stream"
                    break
                if kind == "ack":
                    await self.intake.ack(session, message.ack)
                elif kind == "report":
                    await self.intake.report(session, message.report)
                elif kind == "trust":
                    if message.trust.error:  # it holds less than was sent: all of it next time
                        session.trust_sent = (0, "", "")
                    self.writes.add(nodes.trust_state(session.node.node_id, message.trust))
        except (grpc.RpcError, asyncio.InvalidStateError, ValueError) as exc:
            log.info("stream from %s ended: %s", session.node.node_id, exc)
        except Exception:  # e.g. the database: end this stream, the node reconnects
            log.exception("handling a message from %s failed", session.node.node_id)
        finally:
            session.close()

    async def Fetch(self, request: pb.FetchRequest,
                    context: grpc.aio.ServicerContext) -> AsyncIterator[pb.Chunk]:
        # closed with the call: its count of fetches in flight drops now, not at collection
        async with contextlib.aclosing(self.artifacts.fetch(request, context)) as chunks:
            async for chunk in chunks:
                yield chunk

    async def ChunkIndex(self, request: pb.FetchRequest,
                         context: grpc.aio.ServicerContext) -> pb.IndexReply:
        return await self.artifacts.index(request, context)

    async def Chunks(self, request: pb.ChunksRequest,
                     context: grpc.aio.ServicerContext) -> AsyncIterator[pb.ChunkData]:
        async with contextlib.aclosing(self.artifacts.send_chunks(request, context)) as sent:
            async for chunk in sent:
                yield chunk



class SyncServer:
    """Explicit start/stop; the entry point (``registry serve``) owns the signals.

    Why one class: it owns the gRPC server and the background tasks around it (watching the
    database, stepping rollouts, keeping the TUF timestamp fresh, flushing refusals), which
    share the service's sessions and stop in one order."""

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
        self.port = 0
        self._server: grpc.aio.Server | None = None
        self._watcher: asyncio.Task[None] | None = None
        self.refusals = Refusals(settings.refusal_limit, settings.refusal_interval_s)
        self._unwritten: list[dict[str, Any]] = []
        self._flusher: asyncio.Task[None] | None = None
        self._steerer: asyncio.Task[None] | None = None
        self._trustee: asyncio.Task[None] | None = None
        self._teller: asyncio.Task[None] | None = None

    async def start(self) -> int:
        await self.db.open()
        await self._advance()
        await self.db.run(self.db.nodes.all_disconnected)
        await self.service.load_generations()
        await self.service.intake.load_policies()
        server = grpc.aio.server(
            # the token is checked first; both see the tolerant deserializer (wire.py)
            interceptors=[auth.TokenInterceptor(self.verifier, self._denied),
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
        self._watcher = asyncio.create_task(self._watch())
        self._flusher = asyncio.create_task(self._flush_refusals())
        self._steerer = asyncio.create_task(self._steer())
        self._trustee = asyncio.create_task(self._keep_fresh())
        self._teller = asyncio.create_task(self._tell())
        self.service.writes.start()
        return self.port

    async def _denied(self, method: str, peer: str) -> None:
        """Per refused call: a counter and, at most twice per peer and interval, a log line;
        the audit record comes in aggregate (``_flush_refusals``), off this path."""
        self.metrics.denied.inc()
        said = self.refusals.note(method, peer)
        if said is not None:
            log.warning("%s", said)

    async def _flush_refusals(self) -> None:
        while True:
            await asyncio.sleep(self.settings.refusal_interval_s)
            await self._write_refusals()

    async def _write_refusals(self) -> None:
        """The interval's refusals as one audit record (``registry.server.limits``); rows a
        failed write left are tried again with the next (at most ``MAX_UNWRITTEN`` kept)."""
        rows = (self._unwritten + self.refusals.drain())[-MAX_UNWRITTEN:]
        if not rows:
            return
        try:
            await self.db.run(self.db.nodes.refused_calls, rows)
            self._unwritten = []
        except Exception:  # the database is busy or broken: keep them for the next interval
            log.exception("auditing %d refused-call rows failed; retrying", len(rows))
            self._unwritten = rows

    async def _watch(self) -> None:
        seen = await self.db.run(self.db.data_version)
        while True:
            await asyncio.sleep(self.settings.watch_interval_s)
            try:
                version = await self.db.run(self.db.data_version)
                if version != seen and self.service.refusing is None:
                    await self.service.load_generations()
                    await self._advance()  # before releases: nodes check them against it
                    await self.service.pusher.push_all()
                    await self.service.intake.load_policies()
                    seen = version  # only once pushed: a failed push is tried again
            except Exception:  # a bad moment must not end pushing for good
                log.exception("pushing changes failed; retrying")

    async def _advance(self) -> None:
        """The TUF metadata signed and sent (``registry.server.metadata``), and releases that
        now have their signatures pushed."""
        if await self.service.metadata.advance(signing=self.service.refusing is None):
            await self.service.pusher.push_all()

    async def _keep_fresh(self) -> None:
        interval = min(60.0, max(0.5, self.settings.timestamp_expiry_s / 6))
        while True:
            await asyncio.sleep(interval)
            await self._advance()

    async def _tell(self) -> None:
        """Every ``witness_interval_s``: when the audit chain moved, tell the nodes its new
        head (``registry.server.witness``)."""
        told: Head | None = None
        while True:
            await asyncio.sleep(self.settings.witness_interval_s)
            if self.service.refusing is not None:
                continue
            try:
                head = await self.db.run(lambda: chain.head(self.db.catalog.db.conn))
                if head is not None and head != told:
                    self.service.witnesses.tell(head)
                    told = head
            except Exception:  # a busy database or a bad key file: tell them next time
                log.exception("telling the nodes the audit head failed; retrying")

    async def _steer(self) -> None:
        """The wave rollouts, stepped every ``wave_tick_s`` on the registry that may write (a
        standby's turn comes when it is promoted); their changes are pushed by ``_watch``."""
        while True:
            await asyncio.sleep(self.settings.wave_tick_s)
            if self.service.refusing is not None:
                continue
            try:
                for line in await self.db.run(self.db.steer, time.time()):
                    log.info("rollout: %s", line)
                self.metrics.rollouts(await self.db.run(waves.newest, self.db.catalog.db.conn),
                                      waves.STATES)
            except NotPrimary:
                pass  # lost the lease: the next primary steers
            except Exception:  # a bad moment must not end the rollouts for good
                log.exception("stepping the wave rollouts failed; retrying")

    async def stop(self, grace: float = 5.0) -> None:
        for name in ("", SERVICE):
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        await tasks.stop(self._trustee, self._teller, self._steerer, self._watcher)
        for session in list(self.service.sessions.values()):
            session.close()
        if self._server is not None:
            await self._server.stop(grace)
        if self._flusher is not None:
            await tasks.stop(self._flusher)
            await self._write_refusals()  # the last interval's, once no call can add to it
        await self.service.intake.stop()
        await self.service.writes.stop()  # every stream has ended: its goodbye is queued too
        self.db.close()


async def _admitted(hello: pb.Hello, context: grpc.aio.ServicerContext) -> NodeToken:
    """The token of a node saying hello: its id, tier and region are the token's (the registry
    issued them); a hello that says otherwise is refused, never believed."""
    if not NODE_ID.fullmatch(hello.node_id):
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"invalid node id "
                            f"{_shown(hello.node_id)}")
    token = auth.proven(context)
    proven = token.node_id if token else ""
    if token is None or hello.node_id != proven:
        log.warning("refused a hello as %s from %s: its token is node %s's",
                    _shown(hello.node_id), context.peer(), proven)
        await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"this token is node "
                            f"{proven!r}'s; it cannot say hello as {_shown(hello.node_id)}")
    assert token is not None
    if token.tier not in ("edge", "center"):
        await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"a {token.tier} token "
                            f"opens replication only, not a node's stream")
    for what, said, issued in (("tier", hello.tier, token.tier),
                               ("region", hello.region, token.region)):
        if said != issued:
            log.warning("refused a hello from node %s at %s: it says %s %s, its token was "
                        "issued for %s %s", proven, context.peer(), what, _shown(said),
                        what, issued)
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"node {proven!r}'s "
                                f"token was issued for {what} {issued!r}; its hello says "
                                f"{_shown(said)} (re-provision it with `registry node "
                                f"provision` to change its {what})")
    return token
