"""What a download reports and what a chunked download needs of the node's downloader: kept
apart from both (``sync.node.download``, ``sync.node.chunked``) so neither imports the other's
module to name its types."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter

from serving.release.manifest import Artifact
from serving.release.store import InstalledReleases
from sync.gen import sync_pb2_grpc as pb_grpc
from sync.wire.rate import Rate


class DownloadMetrics:
    def __init__(self, prefix: str, registry: CollectorRegistry) -> None:
        self.bytes = Counter(f"{prefix}_sync_bytes_received", "Artifact bytes received from "
                             "the registry", registry=registry)
        self.local = Counter(f"{prefix}_sync_bytes_reused", "Artifact bytes copied from a "
                             "version already in the store instead of downloaded",
                             registry=registry)
        self.resumed = Counter(f"{prefix}_sync_fetch_resumed", "Fetch calls that resumed a "
                               "partial download (offset > 0), and chunked downloads resumed "
                               "with the chunks already received", registry=registry)
        self.corrupt = Counter(f"{prefix}_sync_corrupt_downloads", "Downloads discarded because "
                               "their sha256 did not match", registry=registry)
        self.refused_chunks = Counter(f"{prefix}_sync_chunks_refused", "Chunks received and "
                                      "refused (not a zstd frame, or another sha256), then "
                                      "fetched again", registry=registry)
        self.chunks = Counter(f"{prefix}_sync_chunks_received", "Chunks received and kept",
                              registry=registry)


class Fetcher(Protocol):
    """The downloader as ``ByChunks`` uses it."""

    folder: Path
    metrics: DownloadMetrics
    metadata: list[tuple[str, str]]
    store: InstalledReleases
    limit: Rate | None
    stub: Callable[[], pb_grpc.SyncStub]

    async def verified(self, path: Path, final: Path, artifact: Artifact) -> Path: ...
