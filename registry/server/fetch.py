"""The Fetch, ChunkIndex and Chunks RPCs' work: an artifact some release ships, streamed from
the blob store from the offset asked for (a resumed download), or its chunk index and the
chunks a node lacks, compressed; at most ``REGISTRY_FETCHES_PER_NODE`` transfers in flight per
node, and at most ``REGISTRY_EGRESS_MBIT_S`` (all nodes) and ``REGISTRY_SITE_MBIT_S`` (each
region) sent.

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

from registry.errors import RegistryError
from registry.releases.catalog import Catalog
from registry.server.metrics import SyncMetrics
from registry.settings import RegistrySettings
from registry.store.blobs import BlobStore, chunks
from registry.store.chunkstore import ChunkStore
from serving.protocol.wire import Malformed
from serving.release import chunks as chunk_index
from serving.release.chunks import ChunkError
from serving.release.manifest import Artifact
from sync.gen import sync_pb2 as pb
from sync.wire import auth
from sync.wire.rate import Rate, rate

if TYPE_CHECKING:
    from registry.server.session import Database, Session

log = logging.getLogger(__name__)
SHA256 = re.compile(r"[0-9a-f]{64}")
SHARED_ROLES = ("tokenizer", "probe")  # every tier installs these with its model
PUSH_WAIT_S = 10.0  # a Fetch that races a new stream's first push waits this long for it


def shipped_by(catalog: Catalog, sha256: str) -> list[tuple[str, int, str]]:
    """(model, version, role) of every release file with these bytes."""
    return [(r[0], int(r[1]), r[2]) for r in catalog.db.execute(
        "SELECT model, version, role FROM artifacts WHERE sha256 = ?", [sha256]).fetchall()]


def pushed_artifact(catalog: Catalog, sent: dict[str, int], tier: str,
                    sha256: str) -> Artifact | None:
    """The manifest entry of ``sha256`` in a release pushed to a node (``sent``: model ->
    version) that its tier installs."""
    for model, version, role in shipped_by(catalog, sha256):
        if sent.get(model) == version and role in (tier, *SHARED_ROLES):
            return catalog.resolve(model, str(version)).manifest.by_role()[role]
    return None


class Artifacts:
    """Artifact bytes for nodes: only what a release ships, never more at once than allowed.

    Why one class: Fetch, ChunkIndex and Chunks serve the same thing three ways, and share the
    checks on the node (its open stream, what was pushed to it, its tier), its count of
    transfers in flight and the egress and per-site rate limits."""

    def __init__(self, settings: RegistrySettings, db: Database, metrics: SyncMetrics,
                 sessions: dict[str, Session]) -> None:
        self.settings, self.db, self.metrics = settings, db, metrics
        self.sessions = sessions  # node id -> its open Sync stream (the server's own dict)
        self.blobs = BlobStore(settings.blobs)
        self.chunks = ChunkStore(self.blobs)
        self.fetching: Counter[str] = Counter()  # node id -> Fetch calls in flight
        self.egress = rate(settings.egress_mbit_s)
        self.sites: dict[str, Rate] = {}  # region -> its link's limit

    async def _sent(self, session: Session, n: int) -> None:
        """Count ``n`` bytes sent to ``session``'s node and keep to the rate limits."""
        self.metrics.bytes_sent.inc(n)
        if self.egress is not None:
            await self.egress.take(n)
        if self.settings.site_mbit_s > 0:
            region = session.node.region
            if region not in self.sites:
                self.sites[region] = Rate(self.settings.site_mbit_s)
            await self.sites[region].take(n)

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
        await self._one_more(node, context)
        self.metrics.fetches.labels("true" if offset else "false").inc()
        log.debug("node %s fetches %s from %d", node, sha[:12], offset)
        try:
            async for at, data in chunks(self.blobs.path(sha), offset, size,
                                         self.settings.chunk_bytes):
                yield pb.Chunk(offset=at, data=data, size=size)
                await self._sent(session, len(data))
        finally:
            self._one_less(node)

    async def _one_more(self, node: str, context: grpc.aio.ServicerContext) -> None:
        if self.fetching[node] >= self.settings.fetches_per_node:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"node {node} already has "
                                f"{self.fetching[node]} fetches in flight (the most "
                                f"REGISTRY_FETCHES_PER_NODE allows); retry when one ends")
        self.fetching[node] += 1

    def _one_less(self, node: str) -> None:
        self.fetching[node] -= 1
        if not self.fetching[node]:
            del self.fetching[node]

    async def _chunked(self, request: pb.FetchRequest | pb.ChunksRequest,
                       context: grpc.aio.ServicerContext) -> tuple[Session, Artifact]:
        """The session and the chunked artifact ``request`` names, once the node may have it
        (else the call is aborted as Fetch would be)."""
        if isinstance(request, Malformed):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.details)
        sha = request.sha256
        if not SHA256.fullmatch(sha):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "sha256 must be 64 lowercase "
                                "hex digits")
        token = auth.proven(context)
        session = await self._session(token.node_id if token else "", context)
        await self._check_sent(session, sha, context)
        artifact = await self.db.run(pushed_artifact, self.db.catalog, session.sent,
                                     session.node.tier, sha)
        if artifact is None or artifact.chunks is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"artifact {sha[:12]}... is not "
                                f"chunked: fetch it whole")
        assert artifact is not None
        return session, artifact

    async def _index(self, artifact: Artifact,
                     context: grpc.aio.ServicerContext) -> tuple[bytes, list[chunk_index.Chunk]]:
        try:
            return await asyncio.to_thread(self.chunks.index, artifact)
        except (RegistryError, ChunkError, OSError) as exc:
            log.error("chunk index of %s: %s", artifact.sha256[:12], exc)
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no chunk index for "
                                f"{artifact.sha256[:12]}... here: fetch it whole")
            raise  # unreachable: abort raises

    async def index(self, request: pb.FetchRequest,
                    context: grpc.aio.ServicerContext) -> pb.IndexReply:
        _, artifact = await self._chunked(request, context)
        data, _ = await self._index(artifact, context)
        return pb.IndexReply(index=data)

    async def send_chunks(self, request: pb.ChunksRequest,
                          context: grpc.aio.ServicerContext) -> AsyncGenerator[pb.ChunkData, None]:
        session, artifact = await self._chunked(request, context)
        _, listed = await self._index(artifact, context)
        wanted = list(request.chunks)
        if len(set(wanted)) != len(wanted) or any(i >= len(listed) for i in wanted):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"chunks must be distinct "
                                f"positions below {len(listed)}")
        node = session.node.node_id
        await self._one_more(node, context)
        self.metrics.chunk_calls.inc()
        try:
            for position in wanted:
                data = await asyncio.to_thread(self.chunks.read, artifact, listed[position])
                yield pb.ChunkData(chunk=position, data=data)
                self.metrics.chunks_sent.inc()
                await self._sent(session, len(data))
        finally:
            self._one_less(node)

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
