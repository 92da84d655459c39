"""Content-addressed blob store: ``<home>/blobs/sha256/<ab>/<digest>``, each stored once."""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

from registry.errors import IntegrityError, NotFound
from registry.store import private
from serving.release.store import CHUNK, file_sha256

STALE_TEMP_SECONDS = 3600


async def chunks(path: Path, offset: int, end: int,
                 chunk_bytes: int) -> AsyncIterator[tuple[int, bytes]]:
    """``(offset, data)`` pieces of ``path`` from ``offset`` up to ``end`` (or its end of
    file), at most ``chunk_bytes`` each, read off the event loop (it serves other streams)."""
    with path.open("rb") as handle:
        handle.seek(offset)
        while offset < end:
            data = await asyncio.to_thread(handle.read, min(chunk_bytes, end - offset))
            if not data:
                break
            yield offset, data
            offset += len(data)


class BlobStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.tmp = root / "tmp"

    def path(self, sha256: str) -> Path:
        return self.root / "sha256" / sha256[:2] / sha256

    def has(self, sha256: str) -> bool:
        return self.path(sha256).is_file()

    def put(self, source: Path) -> tuple[str, int]:
        """Copy ``source`` in (unless an identical blob exists); return its sha256 and size.

        Copied to a temporary file, hashed from that copy, fsynced, then renamed into place, so
        a crash never leaves a partial file under a digest name.
        """
        private.folders(self.tmp)
        fd, name = tempfile.mkstemp(dir=self.tmp, prefix="put-")  # 0600
        tmp = Path(name)
        try:
            digest = hashlib.sha256()
            with source.open("rb") as src, os.fdopen(fd, "wb") as dst:
                while chunk := src.read(CHUNK):
                    digest.update(chunk)
                    dst.write(chunk)
                dst.flush()
                os.fsync(dst.fileno())
            sha, size = digest.hexdigest(), tmp.stat().st_size
            target = self.path(sha)
            if target.is_file():
                return sha, size
            private.folders(target.parent)
            os.replace(tmp, target)
            return sha, size
        finally:
            tmp.unlink(missing_ok=True)

    def copy_to(self, sha256: str, destination: Path) -> None:
        """Copy a blob out and check that the copy has the digest it is stored under."""
        source = self.path(sha256)
        if not source.is_file():
            raise NotFound(f"blob {sha256} is missing from {self.root}")
        shutil.copyfile(source, destination)
        if file_sha256(destination) != sha256:
            raise IntegrityError(f"blob {sha256} is corrupt: its content has another digest")

    def sweep_temporaries(self) -> int:
        """Remove temporary files that a crashed ``put`` left behind (older than an hour)."""
        if not self.tmp.is_dir():
            return 0
        removed = 0
        for leftover in self.tmp.iterdir():
            if time.time() - leftover.stat().st_mtime > STALE_TEMP_SECONDS:
                leftover.unlink(missing_ok=True)
                removed += 1
        return removed
