"""The Fetch RPC's work: an artifact some release ships, streamed from the blob store in
chunks from the offset asked for (a resumed download), with at most
``REGISTRY_FETCHES_PER_NODE`` fetches in flight per node.

A node is served only what it was sent: an artifact of a release pushed to its open Sync
stream (``Session.sent``), and of that release only its own tier's model (its token's tier)
plus the tokenizer and probe every tier needs. An edge token cannot download the center's
model, nor a release never rolled out to it (a canary for other nodes, an old version)."""

from __future__ import annotations

import asyncio
import logging
import re
from collections import Counter
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING

import grpc

from registry.blobs import BlobStore, chunks
from registry.catalog import Catalog
from registry.settings import RegistrySettings
from serving.protocol.wire import Malformed
from sync import auth
from sync.gen import sync_pb2 as pb
from sync.metrics import SyncMetrics

if TYPE_CHECKING:
    from registry.server import Database, Session

log = logging.getLogger(__name__)
SHA256 = re.compile(r"[0-9a-f]{64}")
SHARED_ROLES = ("tokenizer", "probe")  # every tier installs these with its model
PUSH_WAIT_S = 10.0  # a Fetch that races a new stream's first push waits this long for it


def shipped_by(catalog: Catalog, sha256: str) -> list[tuple[str, int, str]]:
    """(model, version, role) of every release file with these bytes."""
    return [(r[0], int(r[1]), r[2]) for r in catalog.db.execute(
        "SELECT model, version, role FROM artifacts WHERE sha256 = ?", [sha256]).fetchall()]


class Artifacts:
    """Artifact bytes for nodes: only what a release ships, never more at once than allowed."""

    def __init__(self, settings: RegistrySettings, db: Database, metrics: SyncMetrics,
                 sessions: dict[str, Session]) -> None:
        self.settings, self.db, self.metrics = settings, db, metrics
        self.sessions = sessions  # node id -> its open Sync stream (the server's own dict)
        self.blobs = BlobStore(settings.blobs)
        self.fetching: Counter[str] = Counter()  # node id -> Fetch calls in flight

    async def fetch(self, request: pb.FetchRequest,
                    context: grpc.aio.ServicerContext) -> AsyncGenerator[pb.Chunk, None]:
        if isinstance(request, Malformed):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.details)
        sha, offset = request.sha256, request.offset
        if not SHA256.fullmatch(sha):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "sha256 must be 64 lowercase "
                                "hex digits")
        token = auth.proven(context)
        node = token.node_id if token else ""
        session = await self._session(node, context)
        size = await self.db.run(self.db.catalog.artifact_size, sha)
        if size is None or not self.blobs.has(sha):
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no release ships artifact {sha}")
        assert size is not None
        await self._check_sent(session, sha, context)
        if not 0 <= offset <= size:
            await context.abort(grpc.StatusCode.OUT_OF_RANGE, f"offset {offset} is outside the "
                                f"artifact (0..{size})")
        if self.fetching[node] >= self.settings.fetches_per_node:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"node {node} already has "
                                f"{self.fetching[node]} fetches in flight (the most "
                                f"REGISTRY_FETCHES_PER_NODE allows); retry when one ends")
        self.metrics.fetches.labels("true" if offset else "false").inc()
        log.debug("node %s fetches %s from %d", node, sha[:12], offset)
        self.fetching[node] += 1
        try:
            async for at, data in chunks(self.blobs.path(sha), offset, size,
                                         self.settings.chunk_bytes):
                yield pb.Chunk(offset=at, data=data, size=size)
                self.metrics.bytes_sent.inc(len(data))
        finally:
            self.fetching[node] -= 1
            if not self.fetching[node]:
                del self.fetching[node]

    async def _session(self, node: str, context: grpc.aio.ServicerContext) -> Session:
        """``node``'s open Sync stream, once its first push is queued. None open is refused
        FAILED_PRECONDITION, which a node's downloader retries (it is reconnecting)."""
        session = self.sessions.get(node)
        if session is not None:
            try:
                await asyncio.wait_for(session.pushed.wait(), PUSH_WAIT_S)
            except TimeoutError:
                session = None
        if session is None or self.sessions.get(node) is not session:
            log.warning("refused a Fetch by node %s from %s: it has no open Sync stream", node,
                        context.peer())
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"node {node!r} has no "
                                f"open Sync stream: artifacts are served only for releases "
                                f"pushed to it (say hello first)")
        assert session is not None
        return session

    async def _check_sent(self, session: Session, sha: str,
                          context: grpc.aio.ServicerContext) -> None:
        """PERMISSION_DENIED unless ``sha`` is a file of a release pushed to ``session`` that
        its tier installs."""
        node = session.node
        uses = await self.db.run(shipped_by, self.db.catalog, sha)
        pushed = [(m, v, r) for m, v, r in uses if session.sent.get(m) == v]
        if any(r in (node.tier, *SHARED_ROLES) for _, _, r in pushed):
            return
        if pushed:
            model, version, role = pushed[0]
            why = (f"it is the {role} model of {model} version {version}; node "
                   f"{node.node_id!r} is a {node.tier} node and is served only its own tier's")
        else:
            why = f"no release pushed to node {node.node_id!r} ships it"
        log.warning("refused a Fetch of %s by node %s (%s) from %s: %s", sha[:12],
                    node.node_id, node.tier, session.peer, why)
        await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"artifact {sha[:12]}...: {why}")
