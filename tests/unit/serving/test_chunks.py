"""Content-defined chunks: the same bytes cut the same way, an edit moves only the chunks
around it, and an index or chunk that is not what the manifest says is refused before use."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import pytest
import zstandard

from serving.release import chunks
from serving.release.chunks import ChunkError


def _file(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.fixture
def data() -> bytes:
    return random.Random(1).randbytes(3 * 1024 * 1024)


def test_cuts_are_stable_cover_the_file_and_keep_to_the_sizes(tmp_path: Path, data: bytes) -> None:
    cuts = chunks.cut(_file(tmp_path / "a", data))
    assert cuts == chunks.cut(_file(tmp_path / "b", data))
    assert sum(c.size for c in cuts) == len(data) and cuts[0].offset == 0
    assert all(c.size <= chunks.MAX_SIZE for c in cuts)
    assert all(c.size >= chunks.MIN_SIZE for c in cuts[:-1])
    assert 20 < len(cuts) < 100  # about 3 MiB / 64 KiB
    assert all(c.digest == hashlib.sha256(data[c.offset:c.offset + c.size]).digest()
               for c in cuts)
    assert chunks.cut(_file(tmp_path / "empty", b"")) == []


def test_an_insertion_early_in_a_file_moves_only_the_chunks_around_it(
        tmp_path: Path, data: bytes) -> None:
    old = {c.digest for c in chunks.cut(_file(tmp_path / "old", data))}
    edited = data[:100_000] + b"seventeen new bytes" + data[100_000:]
    new = chunks.cut(_file(tmp_path / "new", edited))
    fresh = [c for c in new if c.digest not in old]
    assert len(fresh) <= 2 and sum(c.size for c in fresh) <= 2 * chunks.MAX_SIZE


def test_an_index_is_refused_unless_it_is_the_one_the_manifest_names(
        tmp_path: Path, data: bytes) -> None:
    cuts = chunks.cut(_file(tmp_path / "a", data))
    index = chunks.encode_index(cuts)
    chunking = chunks.describe(index, cuts)
    assert chunks.decode_index(index, chunking, len(data)) == cuts
    with pytest.raises(ChunkError, match="sha256"):
        chunks.decode_index(index[:-1] + b"\0", chunking, len(data))
    with pytest.raises(ChunkError, match="covers"):  # the digest is right, the size is not
        chunks.decode_index(index, chunking, len(data) + 1)
    with pytest.raises(ChunkError, match="covers"):  # nor an index covering *more* bytes than
        chunks.decode_index(index, chunking, len(data) - 1)  # the artifact the node accepted
    # an index listing a chunk longer than the chunking allows, even with a matching digest
    long = chunks.encode_index([chunks.Chunk(b"\0" * 32, 0, chunks.MAX_SIZE + 1)])
    with pytest.raises(ChunkError, match="the most is"):
        chunks.decode_index(long, chunks.describe(long, cuts[:1]), chunks.MAX_SIZE + 1)


def test_a_chunk_is_refused_when_its_bytes_or_frame_are_wrong(data: bytes) -> None:
    raw = data[:50_000]
    chunk = chunks.Chunk(hashlib.sha256(raw).digest(), 0, len(raw))
    assert chunks.decompress(chunks.compress(raw), chunk) == raw
    with pytest.raises(ChunkError, match="another sha256"):
        chunks.decompress(chunks.compress(raw[:-1] + b"x"), chunk)
    with pytest.raises(ChunkError, match="not a zstd frame"):
        chunks.decompress(b"not zstd at all", chunk)
    with pytest.raises(ChunkError, match="compressed bytes"):
        chunks.decompress(b"\0" * (len(raw) + chunks.OVERHEAD + 1), chunk)
    # a frame that would expand past the chunk's length is not expanded
    bomb = zstandard.ZstdCompressor().compress(b"\0" * (64 * 1024 * 1024))
    with pytest.raises(ChunkError):
        chunks.decompress(bomb, chunk)
