"""``registry serve``: the gRPC sync service (Sync + Fetch), gRPC health, token auth.

Desired releases are pushed: a watcher notices commits made by other processes (``registry
publish``/``promote``/``rollback`` write the same SQLite file) through ``PRAGMA data_version``
and sends each connected node the releases that changed for it. All SQLite work runs on one
worker thread, off the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
from google.protobuf.json_format import MessageToDict
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from registry import anchor, audit, budgets
from registry.audit import Head
from registry.blobs import BlobStore
from registry.budgets import Policy, Seen
from registry.catalog import Catalog, Node, Target
from registry.db import connect
from registry.nodes import STATES, Held, Measured, NodeBook
from registry.settings import RegistrySettings
from serving.config.tokens import NODE_ID, Verifier
from serving.protocol.budget import Budget
from serving.protocol.wire import Malformed, ParseInterceptor
from serving.release import probe
from serving.release.manifest import is_valid_name
from sync import auth, directive
from sync.gen import sync_pb2 as pb
from sync.gen import sync_pb2_grpc as pb_grpc
from sync.limits import Refusals
from sync.metrics import SyncMetrics

log = logging.getLogger(__name__)
T = TypeVar("T")
SHA256 = re.compile(r"[0-9a-f]{64}")
FEATURE = re.compile(r"[a-z0-9_]{1,32}")
MACHINE = re.compile(r"[A-Za-z0-9_.-]{1,32}")
MAX_FEATURES = 64
SERVICE = "tiered.sync.v1.Sync"
MAX_UNWRITTEN = 100_000  # refused-call rows kept while the database cannot take them
MAX_MESSAGE = 1 << 20  # nodes send small messages only: hello, acks, reports
KEEPALIVE = [("grpc.keepalive_time_ms", 10_000), ("grpc.keepalive_timeout_ms", 5_000),
             ("grpc.keepalive_permit_without_calls", 1),
             ("grpc.http2.min_recv_ping_interval_without_data_ms", 5_000)]


class Database:
    """The registry database on one thread: sqlite3 connections belong to the thread that
    opened them, and a write waiting for a publisher's lock must not stall the event loop."""

    def __init__(self, settings: RegistrySettings) -> None:
        self.settings = settings
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="registry-db")
        self.catalog: Catalog
        self.nodes: NodeBook
        self.anchor: anchor.Anchor

    async def open(self) -> None:
        def opened() -> None:
            db = connect(self.settings.database)
            self.anchor = anchor.for_settings(self.settings)
            self.anchor.signer  # noqa: B018 - loads the key now: directives are signed with it
            self.catalog = Catalog(db, self.settings.actor, self.anchor)
            self.nodes = NodeBook(db, self.anchor)

        await self.run(opened)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    def desired(self, nodes: list[Node]) -> tuple[list[list[Target]], Head | None]:
        """Every node's desired releases and the audit chain's head, from one snapshot (a
        read transaction): the head signed into each directive is the one they came from."""
        conn = self.catalog.db.conn
        conn.execute("BEGIN")
        try:
            return [self.catalog.desired(n) for n in nodes], audit.head(conn)
        finally:
            conn.execute("COMMIT")

    def data_version(self) -> int:
        return int(self.catalog.db.execute("PRAGMA data_version").fetchone()[0])

    def close(self) -> None:
        self._thread.submit(lambda: self.catalog.db.conn.close()).result()
        self._thread.shutdown()


@dataclass
class Session:
    node: Node
    peer: str
    active: dict[str, int]  # what the node said it serves at hello
    generation: int  # of the token it connected with
    outbox: asyncio.Queue[pb.ServerMessage | None] = field(default_factory=asyncio.Queue)
    sent: dict[str, int] = field(default_factory=dict)  # model -> version pushed or held
    budgets: dict[str, Budget] = field(default_factory=dict)  # model -> last budget pushed
    error: str | None = None  # a protocol violation: the stream ends INVALID_ARGUMENT

    def close(self) -> None:
        self.outbox.put_nowait(None)


class SyncService(pb_grpc.SyncServicer):
    def __init__(self, settings: RegistrySettings, db: Database, metrics: SyncMetrics) -> None:
        self.settings, self.db, self.metrics = settings, db, metrics
        self.blobs = BlobStore(settings.blobs)
        self.sessions: dict[str, Session] = {}
        self.fetching: Counter[str] = Counter()  # node id -> Fetch calls in flight
        self.seen: dict[str, dict[str, Seen]] = {}  # model -> node id -> its last report
        self.policies: dict[str, Policy] = {}  # model -> the operator's cascade policy

    async def Sync(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        first = await context.read()
        if isinstance(first, Malformed):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, first.details)
        if first is grpc.aio.EOF or first.WhichOneof("kind") != "hello":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first message must be "
                                "a hello")
        session = await self._open(first.hello, context)
        reader = asyncio.create_task(self._read(session, context))
        try:
            await context.write(pb.ServerMessage(welcome=pb.Welcome(
                registry=self.settings.actor,
                report_interval_s=self.settings.report_interval_s)))
            await self.push(session)
            while (message := await session.outbox.get()) is not None:
                await context.write(message)
            if session.error is not None:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, session.error)
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            await self._close(session)

    async def _open(self, hello: pb.Hello, context: grpc.aio.ServicerContext) -> Session:
        if not NODE_ID.fullmatch(hello.node_id):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"invalid node id "
                                f"{hello.node_id[:64]!r}")
        token = auth.proven(context)
        proven = token.node_id if token else ""
        if hello.node_id != proven:
            log.warning("refused a hello as %s from %s: its token is node %s's",
                        hello.node_id[:64], context.peer(), proven)
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"this token is node "
                                f"{proven!r}'s; it cannot say hello as {hello.node_id[:64]!r}")
        if hello.tier not in ("edge", "center"):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "tier must be edge or center")
        held = [Held(h.model, sorted(h.versions), h.active or None) for h in hello.held
                if is_valid_name(h.model)]
        session = Session(Node(hello.node_id, hello.tier, hello.region[:64] or "local"),
                          context.peer(), {h.model: h.active for h in held if h.active},
                          token.generation if token else 0)
        superseded = self.sessions.get(session.node.node_id)
        if superseded is not None:  # a reconnect before the old stream timed out, or a clash
            log.warning("node %s connected again from %s; closing its stream from %s (two "
                        "nodes sharing one id would keep taking turns)", hello.node_id,
                        session.peer, superseded.peer)
            superseded.close()
        self.sessions[session.node.node_id] = session
        self.metrics.connected.set(len(self.sessions))
        await self.db.run(self.db.nodes.connected, session.node, session.peer, held,
                          platform(hello.platform))
        log.info("node %s (%s, %s) connected from %s holding %s", session.node.node_id,
                 session.node.tier, session.node.region, session.peer, session.active)
        return session

    async def _close(self, session: Session) -> None:
        node_id = session.node.node_id
        if self.sessions.get(node_id) is session:
            del self.sessions[node_id]
            await self.db.run(self.db.nodes.disconnected, node_id)
            log.info("node %s disconnected", node_id)
            for model, seen in self.seen.items():  # its capacity or traffic is gone
                if seen.pop(node_id, None) is not None:
                    self.rebalance(model)
        self.metrics.connected.set(len(self.sessions))

    async def push(self, session: Session) -> None:
        """Queue every release whose desired version changed for this node since last time."""
        (targets,), head = await self.db.run(self.db.desired, [session.node])
        self._queue(session, targets, head)

    async def push_all(self) -> None:
        """After a change: every node's desired releases in one database call, then queued."""
        sessions = list(self.sessions.values())
        desired, head = await self.db.run(self.db.desired, [s.node for s in sessions])
        for session, targets in zip(sessions, desired, strict=True):
            self._queue(session, targets, head)

    def _queue(self, session: Session, targets: list[Target], head: Head | None) -> None:
        for t in targets:
            if session.sent.get(t.model) == t.version:
                continue
            session.sent[t.model] = t.version
            if session.active.pop(t.model, None) == t.version:
                continue  # it already serves that version
            release = pb.Release(model=t.model, version=t.version, alias=t.alias,
                                 manifest=t.manifest, manifest_sha256=t.manifest_sha256,
                                 signature=t.signature, signing_key_id=t.key_id)
            if head is not None:  # there is always one: a desired release was audited
                release.directive, release.directive_signature = directive.sign(
                    self.db.anchor.signer, directive.Directive(
                        session.node.node_id, t.model, t.version, t.manifest_sha256, head.seq,
                        head.hash))
            session.outbox.put_nowait(pb.ServerMessage(release=release))
            self.metrics.pushes.inc()
            log.info("pushing %s version %s (%s) to %s", t.model, t.version, t.alias,
                     session.node.node_id)

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
                    await self._ack(session, message.ack)
                elif kind == "report":
                    await self._report(session, message.report)
        except (grpc.RpcError, asyncio.InvalidStateError, ValueError) as exc:
            log.info("stream from %s ended: %s", session.node.node_id, exc)
        except Exception:  # e.g. the database: end this stream, the node reconnects
            log.exception("handling a message from %s failed", session.node.node_id)
        finally:
            session.close()

    async def _ack(self, session: Session, ack: pb.Ack) -> None:
        # proto3 enums are open: a value this registry does not know parses, Name() raises
        state = pb.AckState.Name(ack.state) if ack.state in pb.AckState.values() else "?"
        if state not in STATES or not is_valid_name(ack.model) or ack.version < 1:
            log.warning("ignoring malformed ack from %s: %s", session.node.node_id, ack)
            return
        self.metrics.acks.labels(state).inc()
        log.info("%s: %s version %s %s%s", session.node.node_id, ack.model, ack.version, state,
                 f" ({ack.reason})" if ack.reason else "")
        measured = None
        if ack.fidelity_rows:
            if not (math.isfinite(ack.fidelity) and 0 <= ack.fidelity <= 1 and
                    ack.fidelity_rows <= probe.MAX_ROWS):
                log.warning("ignoring malformed ack from %s: fidelity %r on %s rows",
                            session.node.node_id, ack.fidelity, ack.fidelity_rows)
                return
            measured = Measured(ack.fidelity, ack.fidelity_rows, platform(ack.platform))
        await self.db.run(self.db.nodes.acknowledged, session.node, ack.model, ack.version,
                          state, ack.reason[:1000], measured)

    async def _report(self, session: Session, report: pb.QualityReport) -> None:
        if not is_valid_name(report.model):
            return
        data = MessageToDict(report, preserving_proto_field_name=True,
                             always_print_fields_with_no_presence=True)
        for key in ("version", "requests", "rows", "audit_rows"):  # proto JSON writes 64-bit
            data[key] = int(data[key])  # ints as strings
        if not (math.isfinite(report.fidelity) and 0 <= report.fidelity <= 1):
            data["fidelity"] = 0.0
        for key, value in data.items():  # proto JSON writes NaN and infinities as strings
            if isinstance(value, str) and key != "model":
                data[key] = 0.0
        n = session.node
        self.metrics.report([n.node_id, n.tier, n.region, report.model, str(report.version)],
                            data)
        await self.db.run(self.db.nodes.reported, n.node_id, report.model, data)
        self.seen.setdefault(report.model, {})[n.node_id] = Seen.of(
            n.node_id, n.tier, time.monotonic(), data)
        self.rebalance(report.model)

    def rebalance(self, model: str) -> None:
        """Recompute ``model``'s escalation budgets; push those that moved enough."""
        seen = self.seen.get(model, {})
        policy = self.policies.get(model, Policy(split=self.settings.budget_split))
        found = budgets.split(policy, list(seen.values()),
                              time.monotonic(), 3 * self.settings.report_interval_s)
        for node_id, budget in found.items():
            session = self.sessions.get(node_id)
            if session is None or not budgets.changed(session.budgets.get(model), budget):
                continue
            session.budgets[model] = budget
            session.outbox.put_nowait(pb.ServerMessage(budget=pb.Budget(
                model=model, controlled=budget.controlled, rows_per_s=budget.rows_per_s,
                capacity_rows_s=budget.capacity_rows_s, share=budget.share)))
            log.info("budget for %s on %s: %s", model, node_id,
                     f"{budget.rows_per_s:.1f} rows/s of {budget.capacity_rows_s:.1f}"
                     if budget.controlled else "none (calibrated threshold)")

    async def load_policies(self) -> None:
        """The operators' cascade policies (``registry cascade``); budgets follow them."""
        self.policies = await self.db.run(lambda: budgets.policies(self.db.catalog.db))
        for model in list(self.seen):
            self.rebalance(model)

    async def Fetch(self, request: pb.FetchRequest,
                    context: grpc.aio.ServicerContext) -> AsyncIterator[pb.Chunk]:
        if isinstance(request, Malformed):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.details)
        sha, offset = request.sha256, request.offset
        if not SHA256.fullmatch(sha):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "sha256 must be 64 lowercase "
                                "hex digits")
        size = await self.db.run(self.db.catalog.artifact_size, sha)
        if size is None or not self.blobs.has(sha):
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no release ships artifact {sha}")
        assert size is not None
        if not 0 <= offset <= size:
            await context.abort(grpc.StatusCode.OUT_OF_RANGE, f"offset {offset} is outside the "
                                f"artifact (0..{size})")
        token = auth.proven(context)
        node = token.node_id if token else ""
        if self.fetching[node] >= self.settings.fetches_per_node:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"node {node} already has "
                                f"{self.fetching[node]} fetches in flight (the most "
                                f"REGISTRY_FETCHES_PER_NODE allows); retry when one ends")
        self.metrics.fetches.labels("true" if offset else "false").inc()
        self.fetching[node] += 1
        try:
            with self.blobs.path(sha).open("rb") as blob:
                blob.seek(offset)
                while offset < size:
                    data = await asyncio.to_thread(blob.read, min(self.settings.chunk_bytes,
                                                                  size - offset))
                    if not data:
                        break
                    yield pb.Chunk(offset=offset, data=data, size=size)
                    offset += len(data)
                    self.metrics.bytes_sent.inc(len(data))
        finally:
            self.fetching[node] -= 1
            if not self.fetching[node]:
                del self.fetching[node]


class SyncServer:
    """Explicit start/stop; the entry point (``registry serve``) owns the signals."""

    def __init__(self, settings: RegistrySettings, metrics: SyncMetrics | None = None) -> None:
        if settings.token is None:
            raise ValueError("registry serve needs its secret: set REGISTRY_TOKEN (or "
                             "REGISTRY_TOKEN_FILE)")
        self.settings = settings
        self.generations: dict[str, int] = {}  # node id -> token generation, if not 1
        self.verifier = Verifier(settings.token.get_secret_value(),
                                 lambda node_id: self.generations.get(node_id, 1))
        self.metrics = metrics or SyncMetrics()
        self.db = Database(settings)
        self.service = SyncService(settings, self.db, self.metrics)
        self.health = health.aio.HealthServicer()
        self.port = 0
        self._server: grpc.aio.Server | None = None
        self._watcher: asyncio.Task[None] | None = None
        self.refusals = Refusals(settings.refusal_limit, settings.refusal_interval_s)
        self._unwritten: list[dict[str, Any]] = []
        self._flusher: asyncio.Task[None] | None = None

    async def start(self) -> int:
        await self.db.open()
        await self.db.run(self.db.nodes.all_disconnected)
        await self._load_generations()
        await self.service.load_policies()
        server = grpc.aio.server(
            # the token is checked first; both see the tolerant deserializer (wire.py)
            interceptors=[auth.TokenInterceptor(self.verifier, self._denied),
                          ParseInterceptor(f"/{SERVICE}/")],
            options=[("grpc.max_receive_message_length", MAX_MESSAGE), *KEEPALIVE,
                     ("grpc.max_concurrent_streams", self.settings.max_concurrent_streams)])
        pb_grpc.add_SyncServicer_to_server(self.service, server)
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
        """The interval's refusals as audit records, one per peer host; rows a failed write
        left are tried again with the next (at most ``MAX_UNWRITTEN`` kept)."""
        rows = (self._unwritten + self.refusals.drain())[-MAX_UNWRITTEN:]
        if not rows:
            return
        try:
            await self.db.run(self.db.nodes.refused_calls, rows)
            self._unwritten = []
        except Exception:  # the database is busy or broken: keep them for the next interval
            log.exception("auditing %d refused-call rows failed; retrying", len(rows))
            self._unwritten = rows

    async def _load_generations(self) -> None:
        """Token generations (raised by ``registry node revoke``): a revoked node's stream is
        closed, and its old token refused from now on."""
        self.generations = await self.db.run(self.db.nodes.generations)
        for node_id, session in list(self.service.sessions.items()):
            if self.generations.get(node_id, 1) != session.generation:
                log.warning("node %s: token revoked; closing its stream", node_id)
                session.close()

    async def _watch(self) -> None:
        seen = await self.db.run(self.db.data_version)
        while True:
            await asyncio.sleep(self.settings.watch_interval_s)
            try:
                version = await self.db.run(self.db.data_version)
                if version != seen:
                    await self._load_generations()
                    await self.service.push_all()
                    await self.service.load_policies()
                    seen = version  # only once pushed: a failed push is tried again
            except Exception:  # a bad moment must not end pushing for good
                log.exception("pushing changes failed; retrying")

    async def stop(self, grace: float = 5.0) -> None:
        for name in ("", SERVICE):
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        for session in list(self.service.sessions.values()):
            session.close()
        if self._server is not None:
            await self._server.stop(grace)
        if self._flusher is not None:
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
            await self._write_refusals()  # the last interval's, once no call can add to it
        self.db.close()


def platform(p: pb.Platform) -> dict[str, Any]:
    """A node's hardware as it said, kept only where it looks like what a node sends: short
    printable names and known-shaped feature flags (what does not fit is dropped)."""
    def text(value: str, limit: int = 128) -> str:
        return "".join(c for c in value[:limit] if c.isprintable())

    features = [f for f in p.features[:MAX_FEATURES] if FEATURE.fullmatch(f)]
    return {"cpu": text(p.cpu), "machine": p.machine if MACHINE.fullmatch(p.machine) else "",
            "features": features, "runtime": text(p.runtime)}
