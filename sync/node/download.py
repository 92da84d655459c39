"""Resumable, verified artifact downloads into ``<store>/.downloads/``.

Chunks are appended to ``<sha256>.part``; a broken stream is retried from the file's size, so
bytes already received are never asked for again. A finished file is checked against its
sha256 and only then renamed to ``<sha256>``; a mismatch deletes it (the next try starts over).
The manifest's size bounds the file: a chunk that would run past it (or is empty, or claims
another size) deletes the ``.part`` and fails the transfer before it is written.
An artifact some installed version already has is copied locally instead of downloaded.
A chunked artifact is fetched by chunks first (``sync.node.chunked``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import grpc

from serving.release.manifest import Artifact
from serving.release.store import InstalledReleases, file_sha256
from sync.gen import sync_pb2 as pb
from sync.gen import sync_pb2_grpc as pb_grpc
from sync.node.chunked import ByChunks, Whole
from sync.node.transfer import DownloadMetrics
from sync.wire.chunk import misfit
from sync.wire.errors import TransferError
from sync.wire.rate import Rate

log = logging.getLogger(__name__)
STALE_SECONDS = 24 * 3600
RESUMES = 5  # broken streams retried (resuming) before the release attempt fails
CODES_NOT_RETRIED = {grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT,
                     grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.OUT_OF_RANGE,
                     grpc.StatusCode.PERMISSION_DENIED}


class Downloader:
    def __init__(self, stub: Callable[[], pb_grpc.SyncStub], metadata: list[tuple[str, str]],
                 store: InstalledReleases, metrics: DownloadMetrics,
                 limit: Rate | None = None) -> None:
        """``stub`` gives the current registry's stub (it changes when discovery moves it);
        ``limit``: the most this node receives (its ``SYNC_MBIT_S``)."""
        self.stub, self.metadata, self.store, self.metrics = stub, metadata, store, metrics
        self.limit = limit
        self.folder = store.root / ".downloads"
        self.chunked = ByChunks(self)

    async def get(self, artifact: Artifact) -> Path:
        """A verified local copy of ``artifact`` (downloaded, resumed or reused)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        final = self.folder / artifact.sha256
        if final.is_file() and final.stat().st_size == artifact.size:
            return final
        local = self.store.find(artifact.sha256)
        if local is not None:
            await asyncio.to_thread(shutil.copyfile, local, final)
            self.metrics.local.inc(artifact.size)
            return await self.verified(final, final, artifact)
        if artifact.chunks is not None:
            try:
                return await self.chunked.get(artifact, artifact.chunks)
            except Whole as exc:
                log.warning("fetching %s whole: %s", artifact.file, exc)
        part = self.folder / f"{artifact.sha256}.part"
        for attempt in range(RESUMES + 1):
            try:
                await self._fetch(artifact, part)
                break
            except grpc.aio.AioRpcError as exc:
                if exc.code() in CODES_NOT_RETRIED or attempt == RESUMES:
                    raise TransferError(f"fetch {artifact.file}: {exc.code().name} "
                                        f"{exc.details()}") from exc
                log.info("fetch of %s broke at %d bytes (%s); resuming", artifact.file,
                         part.stat().st_size if part.exists() else 0, exc.code().name)
                await asyncio.sleep(min(0.2 * 2 ** attempt, 3))
        return await self.verified(part, final, artifact)

    async def _fetch(self, artifact: Artifact, part: Path) -> None:
        offset = part.stat().st_size if part.is_file() else 0
        if offset > artifact.size:
            part.unlink()
            offset = 0
        if offset:
            self.metrics.resumed.inc()
        request = pb.FetchRequest(sha256=artifact.sha256, offset=offset)
        # written off the event loop (it also serves inference requests), each chunk flushed
        # to the file before the next is read, so a resume never skips bytes
        with part.open("ab") as out:
            async for chunk in self.stub().Fetch(request, metadata=self.metadata):
                problem = misfit(chunk, offset, artifact.size)
                if problem is not None:  # a rogue or broken registry: nothing of it is kept
                    part.unlink(missing_ok=True)
                    raise TransferError(f"fetch {artifact.file}: {problem}; the partial "
                                        f"download was deleted")
                await asyncio.to_thread(_append, out, chunk.data)
                offset += len(chunk.data)
                self.metrics.bytes.inc(len(chunk.data))
                if self.limit is not None:
                    await self.limit.take(len(chunk.data))
            await asyncio.to_thread(os.fsync, out.fileno())
        if offset != artifact.size:
            raise TransferError(f"fetch {artifact.file}: stream ended at {offset} of "
                                f"{artifact.size} bytes")

    async def verified(self, path: Path, final: Path, artifact: Artifact) -> Path:
        digest = await asyncio.to_thread(file_sha256, path)
        if digest != artifact.sha256:
            path.unlink(missing_ok=True)
            self.metrics.corrupt.inc()
            raise TransferError(f"{artifact.file}: received bytes have sha256 {digest[:12]}…, "
                                f"expected {artifact.sha256[:12]}…; discarded")
        os.replace(path, final)
        return final

    def sweep(self, max_age_s: float = STALE_SECONDS) -> int:
        """Delete downloads nobody finished for a day (a partial file younger than that is
        kept: a restarted node resumes it)."""
        if not self.folder.is_dir():
            return 0
        stale = [p for p in self.folder.iterdir()
                 if time.time() - p.stat().st_mtime > max_age_s]
        for path in stale:
            if path.is_dir():  # chunks kept for a download nobody finished
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        return len(stale)

    def take(self, artifact: Artifact, destination: Path) -> None:
        """ModelStore.install's fetch: move the verified download into the staging folder."""
        os.replace(self.folder / artifact.sha256, destination)



def _append(out: BinaryIO, data: bytes) -> None:
    out.write(data)
    out.flush()

