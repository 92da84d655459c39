"""Content-defined chunks of release artifacts: what a node fetches when it already holds most
of a release.

``registry publish`` cuts every artifact with FastCDC (``pyfastcdc``, the 2020 algorithm, fixed
parameters and gear table, so the same bytes always give the same cuts) and records, in the
artifact's entry of the signed manifest, the sha256 of its *chunk index*: each chunk's sha256
and length, in file order. A node fetches the index (checked against that digest), finds the
chunks it already holds in any version in its store (cutting those files the same way), fetches
only the others, zstd-compressed, each checked against its digest, and assembles the file, whose
whole sha256 it checks as before. Chunks cut at content, not at fixed offsets, so bytes inserted
or removed early in a file move only the chunks around them.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import zstandard
from pyfastcdc import FastCDC

from serving.release.manifest import Chunking

MAGIC = b"TCDC1\n"
ENTRY = struct.Struct(">32sI")  # sha256, length
MIN_SIZE, AVG_SIZE, MAX_SIZE = 16 * 1024, 64 * 1024, 256 * 1024
ZSTD_LEVEL = 3
# zstd's worst case for incompressible input is a few bytes per 128 KiB block; a chunk's
# compressed form larger than this is refused before it is decompressed
OVERHEAD = 1024


class ChunkError(ValueError):
    """An index or chunk that does not fit what the signed manifest says."""


@dataclass(frozen=True)
class Chunk:
    digest: bytes  # sha256 of the uncompressed bytes
    offset: int
    size: int

    @property
    def hex(self) -> str:
        return self.digest.hex()


def chunker(chunking: Chunking | None = None) -> FastCDC:
    c = chunking
    return FastCDC(c.avg_size if c else AVG_SIZE, min_size=c.min_size if c else MIN_SIZE,
                   max_size=c.max_size if c else MAX_SIZE, normalized_chunking=1, seed=0)


def cut(path: Path, chunking: Chunking | None = None) -> list[Chunk]:
    """``path``'s chunks with their sha256 (an empty file has none)."""
    if path.stat().st_size == 0:
        return []
    return [Chunk(hashlib.sha256(c.data).digest(), c.offset, c.length)
            for c in chunker(chunking).cut_file(str(path))]


def encode_index(chunks: Iterable[Chunk]) -> bytes:
    return MAGIC + b"".join(ENTRY.pack(c.digest, c.size) for c in chunks)


def describe(index: bytes, chunks: list[Chunk]) -> Chunking:
    """The manifest's record of an index made with this module's parameters."""
    return Chunking(index_sha256=hashlib.sha256(index).hexdigest(), count=len(chunks),
                    min_size=MIN_SIZE, avg_size=AVG_SIZE, max_size=MAX_SIZE)


def decode_index(data: bytes, chunking: Chunking, size: int) -> list[Chunk]:
    """The chunks an index lists, once it is proven to be the one the manifest names and to
    describe a file of ``size`` bytes in chunks no longer than the chunking allows."""
    if hashlib.sha256(data).hexdigest() != chunking.index_sha256:
        raise ChunkError("the chunk index does not have the sha256 the manifest names")
    body = data[len(MAGIC):]
    if not data.startswith(MAGIC) or len(body) != chunking.count * ENTRY.size:
        raise ChunkError(f"the chunk index is not {chunking.count} entries")
    chunks, offset = [], 0
    for digest, length in ENTRY.iter_unpack(body):
        if not 0 < length <= chunking.max_size:
            raise ChunkError(f"a chunk of {length} bytes (the most is {chunking.max_size})")
        chunks.append(Chunk(digest, offset, length))
        offset += length
    if offset != size:
        raise ChunkError(f"the chunk index covers {offset} bytes, the artifact has {size}")
    return chunks


def compress(data: bytes | memoryview) -> bytes:
    return zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(data)


def decompress(data: bytes, chunk: Chunk) -> bytes:
    """``chunk``'s bytes from their compressed form, checked against its digest; never more
    than its length is allocated."""
    if len(data) > chunk.size + OVERHEAD:
        raise ChunkError(f"chunk {chunk.hex[:12]}: {len(data)} compressed bytes for "
                         f"{chunk.size}")
    try:
        raw = zstandard.ZstdDecompressor().decompress(data, max_output_size=chunk.size)
    except zstandard.ZstdError as exc:
        raise ChunkError(f"chunk {chunk.hex[:12]}: not a zstd frame ({exc})") from exc
    if len(raw) != chunk.size or hashlib.sha256(raw).digest() != chunk.digest:
        raise ChunkError(f"chunk {chunk.hex[:12]}: its bytes have another sha256")
    return raw


def read(path: Path, chunk: Chunk) -> bytes | None:
    """``chunk``'s bytes from a local file at ``chunk.offset`` when they are there unchanged."""
    with path.open("rb") as f:
        f.seek(chunk.offset)
        data = f.read(chunk.size)
    return data if hashlib.sha256(data).digest() == chunk.digest else None


def where(files: Iterable[Path], chunking: Chunking) -> dict[bytes, tuple[Path, Chunk]]:
    """Digest -> (file, chunk) of every chunk of ``files``, cut with ``chunking``'s
    parameters (the files a node holds; the first file with a chunk wins)."""
    found: dict[bytes, tuple[Path, Chunk]] = {}
    for path in files:
        for chunk in cut(path, chunking):
            found.setdefault(chunk.digest, (path, chunk))
    return found


def batches(chunks: list[tuple[int, Chunk]], max_bytes: int) -> Iterator[list[int]]:
    """Positions of ``chunks`` grouped so that each group asks for at most ``max_bytes``."""
    group: list[int] = []
    total = 0
    for position, chunk in chunks:
        if group and total + chunk.size > max_bytes:
            yield group
            group, total = [], 0
        group.append(position)
        total += chunk.size
    if group:
        yield group
