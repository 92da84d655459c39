"""A chunked artifact's download (its manifest entry has ``chunks``): its chunk index, checked
against the digest the signed manifest names; then only the chunks no file in the store has,
zstd-compressed, each checked against its digest before it is kept in
``.downloads/<sha256>.chunks/``. A broken stream or a refused chunk costs only the chunks not yet
kept: the next try asks for the rest. The file is then assembled from the kept and the held
chunks and checked whole, as a whole download is. A registry that cannot serve chunks (an older
one, or one whose chunk store cannot reproduce the index), or a chunk refused on every try,
raises ``Whole``: the file is fetched whole instead.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from pathlib import Path

import grpc

from serving.release import chunks
from serving.release.chunks import Chunk, ChunkError
from serving.release.manifest import Artifact, Chunking
from sync.gen import sync_pb2 as pb
from sync.node.transfer import Fetcher
from sync.wire.errors import TransferError

log = logging.getLogger(__name__)
RESUMES = 5  # rounds of asking for the chunks still missing, after the first
CODES_NOT_RETRIED = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNAUTHENTICATED,
                     grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.PERMISSION_DENIED}
# the registry has no chunks for this artifact (an older registry, or its chunk store cannot
# reproduce the index): the file is fetched whole
CODES_WHOLE = {grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.NOT_FOUND}
CHUNKS_PER_CALL_BYTES = 8 * 1024 * 1024  # uncompressed bytes asked for in one Chunks call


class Whole(Exception):
    """Chunks cannot be had for this artifact: fetch it whole."""


class ByChunks:
    def __init__(self, node: Fetcher) -> None:
        self.node = node
        self._cuts: dict[tuple[str, tuple[int, int, int]], list[Chunk]] = {}  # held files' cuts

    async def get(self, artifact: Artifact, chunking: Chunking) -> Path:
        index = await self._index(artifact, chunking)
        held = await asyncio.to_thread(self._held, chunking)
        kept = self.node.folder / f"{artifact.sha256}.chunks"
        kept.mkdir(exist_ok=True)
        broke = any(kept.iterdir())  # chunks kept by a try this process or an earlier made
        for attempt in range(RESUMES + 2):
            wanted = _missing(index, held, kept)
            if not wanted:
                break
            if broke:
                self.node.metrics.resumed.inc()
                broke = False
            if attempt > RESUMES:
                raise Whole(f"{len(wanted)} chunks still missing after {RESUMES + 1} tries")
            if attempt:
                await asyncio.sleep(min(0.2 * 2 ** (attempt - 1), 3))
            try:
                for group in chunks.batches(wanted, CHUNKS_PER_CALL_BYTES):
                    await self._fetch_chunks(artifact, index, group, kept)
            except grpc.aio.AioRpcError as exc:
                if exc.code() in CODES_WHOLE:
                    raise Whole(f"{exc.code().name} {exc.details()}") from exc
                if exc.code() in CODES_NOT_RETRIED:
                    raise TransferError(f"chunks of {artifact.file}: {exc.code().name} "
                                        f"{exc.details()}") from exc
                broke = True
                log.info("chunks of %s broke off (%s); resuming with the chunks kept",
                         artifact.file, exc.code().name)
        part = self.node.folder / f"{artifact.sha256}.part"
        reused = await asyncio.to_thread(_assemble, part, index, held, kept)
        self.node.metrics.local.inc(reused)
        try:
            return await self.node.verified(part, self.node.folder / artifact.sha256, artifact)
        finally:  # whether it checked out or not: a bad kept chunk is never used again
            shutil.rmtree(kept, ignore_errors=True)

    async def _index(self, artifact: Artifact, chunking: Chunking) -> list[Chunk]:
        try:
            reply = await self.node.stub().ChunkIndex(pb.FetchRequest(sha256=artifact.sha256),
                                                 metadata=self.node.metadata)
        except grpc.aio.AioRpcError as exc:
            if exc.code() in CODES_NOT_RETRIED:
                raise TransferError(f"chunk index of {artifact.file}: {exc.code().name} "
                                    f"{exc.details()}") from exc
            raise Whole(f"no chunk index ({exc.code().name} {exc.details()})") from exc
        try:
            return chunks.decode_index(reply.index, chunking, artifact.size)
        except ChunkError as exc:  # a broken or rogue registry: the whole file is checked too
            self.node.metrics.refused_chunks.inc()
            raise Whole(f"its chunk index was refused: {exc}") from exc

    def _held(self, chunking: Chunking) -> dict[bytes, tuple[Path, Chunk]]:
        """Where each chunk of the files the store holds is (each file cut once per set of
        parameters; files no longer held are forgotten)."""
        found: dict[bytes, tuple[Path, Chunk]] = {}
        sizes = (chunking.min_size, chunking.avg_size, chunking.max_size)
        cuts: dict[tuple[str, tuple[int, int, int]], list[Chunk]] = {}
        for sha, path in self.node.store.held():
            key = (sha, sizes)
            cuts[key] = self._cuts.get(key) or chunks.cut(path, chunking)
            for chunk in cuts[key]:
                found.setdefault(chunk.digest, (path, chunk))
        self._cuts = cuts
        return found

    async def _fetch_chunks(self, artifact: Artifact, index: list[Chunk], group: list[int],
                            kept: Path) -> None:
        """Ask for the chunks at ``group``'s positions; keep each that checks out."""
        asked = set(group)
        request = pb.ChunksRequest(sha256=artifact.sha256, chunks=group)
        async for message in self.node.stub().Chunks(request, metadata=self.node.metadata):
            if message.chunk not in asked:  # not asked for, or twice: nothing more of it
                raise TransferError(f"chunks of {artifact.file}: the registry sent chunk "
                                    f"{message.chunk}, which was not asked for")
            asked.discard(message.chunk)
            self.node.metrics.bytes.inc(len(message.data))
            if self.node.limit is not None:
                await self.node.limit.take(len(message.data))
            chunk = index[message.chunk]
            try:
                data = await asyncio.to_thread(chunks.decompress, message.data, chunk)
            except ChunkError as exc:
                self.node.metrics.refused_chunks.inc()
                log.warning("refused chunk %d of %s: %s", message.chunk, artifact.file, exc)
                continue
            await asyncio.to_thread(_keep, kept / chunk.hex, data)
            self.node.metrics.chunks.inc()

def _missing(index: list[Chunk], held: dict[bytes, tuple[Path, Chunk]],
             kept: Path) -> list[tuple[int, Chunk]]:
    """(position, chunk) of the chunks neither held nor kept yet, each distinct chunk once."""
    wanted: dict[bytes, tuple[int, Chunk]] = {}
    for position, chunk in enumerate(index):
        if chunk.digest not in held and chunk.digest not in wanted and \
                not (kept / chunk.hex).is_file():
            wanted[chunk.digest] = (position, chunk)
    return list(wanted.values())


def _keep(path: Path, data: bytes) -> None:
    """A checked chunk, whole or not at all (a resumed download trusts what it finds)."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_bytes(data)
    os.replace(temporary, path)


def _assemble(part: Path, index: list[Chunk], held: dict[bytes, tuple[Path, Chunk]],
              kept: Path) -> int:
    """Write the artifact from its chunks (kept, else read from a held file); the bytes taken
    from held files. A held file that changed since it was cut fails the whole-file check."""
    reused = 0
    with part.open("wb") as out:
        for chunk in index:
            path = kept / chunk.hex
            if path.is_file():
                out.write(path.read_bytes())
                continue
            source, at = held[chunk.digest]
            with source.open("rb") as f:
                f.seek(at.offset)
                out.write(f.read(at.size))
            reused += chunk.size
        out.flush()
        os.fsync(out.fileno())
    return reused
