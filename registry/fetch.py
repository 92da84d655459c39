"""The Fetch RPC's work: an artifact some release ships, streamed from the blob store in
chunks from the offset asked for (a resumed download), with at most
``REGISTRY_FETCHES_PER_NODE`` fetches in flight per node."""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING

import grpc

from registry.blobs import BlobStore
from registry.settings import RegistrySettings
from serving.protocol.wire import Malformed
from sync import auth
from sync.gen import sync_pb2 as pb
from sync.metrics import SyncMetrics

if TYPE_CHECKING:
    from registry.server import Database

SHA256 = re.compile(r"[0-9a-f]{64}")


class Artifacts:
    """Artifact bytes for nodes: only what a release ships, never more at once than allowed."""

    def __init__(self, settings: RegistrySettings, db: Database, metrics: SyncMetrics) -> None:
        self.settings, self.db, self.metrics = settings, db, metrics
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
