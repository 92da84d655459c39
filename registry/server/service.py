"""The node streams of the Sync service: who may open one (its token's node, one stream per
node), what each is sent (welcome, TUF metadata, releases, the audit head), and where what nodes
send up goes (``registry.server.intake``); Fetch's bytes are ``registry.server.fetch``'s."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc

from registry.fleet import nodes
from registry.fleet.nodes import Held
from registry.releases.plan import RolloutNode
from registry.server.fetch import Artifacts
from registry.server.intake import Intake, platform
from registry.server.metadata import TrustMetadata
from registry.server.metrics import SyncMetrics
from registry.server.push import Pusher
from registry.server.session import Database, Session, WriteBehind
from registry.server.witness_teller import WitnessTeller
from registry.settings import RegistrySettings
from serving import tasks
from serving.config.tokens import NODE_ID, NodeToken
from serving.protocol.wire import Malformed
from serving.release.manifest import is_valid_name
from sync.gen import sync_pb2 as pb
from sync.gen import sync_pb2_grpc as pb_grpc
from sync.wire import auth

log = logging.getLogger(__name__)


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
        self.witnesses = WitnessTeller(db, metrics, self.sessions, self.writes, self.metadata)

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
                          root_version=max(0, hello.root_version),
                          holds={h.model for h in held})
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
