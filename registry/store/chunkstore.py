"""Compressed, content-addressed chunks of the stored artifacts and their chunk indexes:
``<blobs>/chunks/zstd/<ab>/<sha256>`` (one file per distinct chunk, zstd) and
``<blobs>/chunks/index/<ab>/<artifact sha256>``.

They are derived from the whole blobs, which stay what the catalog, replication and backups
hold: ``publish`` writes them, and a registry that lacks them (a standby promoted, a restored
backup, a release published before chunking) cuts the blob again on the first request. The cuts
are deterministic, so the rebuilt index has the digest the signed manifest names; should it not
(another chunker), the node is refused the chunks and fetches the file whole.
"""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path

from registry.errors import IntegrityError, NotFound
from registry.store import private
from registry.store.blobs import BlobStore
from serving.release import chunks
from serving.release.chunks import Chunk, ChunkError
from serving.release.manifest import Artifact, Chunking


class ChunkStore:
    def __init__(self, blobs: BlobStore) -> None:
        self.blobs = blobs
        self.root = blobs.root / "chunks"
        self._building = threading.Lock()  # one cut at a time: the same blob is cut once

    def chunk_path(self, digest: str) -> Path:
        return self.root / "zstd" / digest[:2] / digest

    def index_path(self, sha256: str) -> Path:
        return self.root / "index" / sha256[:2] / sha256

    def build(self, sha256: str) -> Chunking:
        """Cut the blob ``sha256``, store each chunk not stored yet and its index; the
        manifest's record of it."""
        source = self.blobs.path(sha256)
        if not source.is_file():
            raise NotFound(f"blob {sha256} is missing from {self.blobs.root}")
        with self._building:
            cuts = chunks.cut(source)
            with source.open("rb") as f:
                for chunk in cuts:
                    target = self.chunk_path(chunk.hex)
                    if not target.is_file():
                        f.seek(chunk.offset)
                        _write(target, chunks.compress(f.read(chunk.size)))
            index = chunks.encode_index(cuts)
            _write(self.index_path(sha256), index)
        return chunks.describe(index, cuts)

    def index(self, artifact: Artifact) -> tuple[bytes, list[Chunk]]:
        """The artifact's chunk index (its bytes and entries), rebuilt when it is not stored or
        not the one the manifest names."""
        if artifact.chunks is None:
            raise NotFound(f"{artifact.file} ({artifact.sha256[:12]}...) is not chunked")
        path = self.index_path(artifact.sha256)
        for attempt in range(2):
            if attempt or not path.is_file():
                self.build(artifact.sha256)
            data = path.read_bytes()
            try:
                return data, chunks.decode_index(data, artifact.chunks, artifact.size)
            except ChunkError as exc:
                if attempt:
                    raise IntegrityError(f"{artifact.file} ({artifact.sha256[:12]}...): its "
                                         f"chunks cut here do not match the manifest's "
                                         f"index") from exc
        raise AssertionError("unreachable")

    def read(self, artifact: Artifact, chunk: Chunk) -> bytes:
        """One chunk of ``artifact``, compressed (cut from the blob again if it is missing)."""
        path = self.chunk_path(chunk.hex)
        if not path.is_file():
            self.build(artifact.sha256)
        return path.read_bytes()


def _write(target: Path, data: bytes) -> None:
    """Whole or not at all (derived data: not fsynced; a damaged chunk fails the node's digest
    check and the node fetches the file whole)."""
    private.folders(target.parent)
    fd, name = tempfile.mkstemp(dir=target.parent, prefix=".put-")  # 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(name, target)
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise
