"""What a chunk on the wire must satisfy before its bytes are written: both sides of a Fetch
stream (a node's download, a standby's copy of the primary's blobs) check it."""

from __future__ import annotations

from sync.gen import sync_pb2 as pb


def misfit(chunk: pb.Chunk, offset: int, size: int) -> str | None:
    """Why a chunk must not be written (None: it fits). The manifest's size (signed, when the
    node checks signatures) bounds the file: checked before each write, so a registry that
    streams on never makes the ``.part`` larger than the artifact."""
    if chunk.offset != offset or chunk.size != size:
        return f"chunk at {chunk.offset} of {chunk.size}, expected {offset} of {size}"
    if not chunk.data:
        return f"empty chunk at {offset} of {size}"
    if offset + len(chunk.data) > size:
        return (f"chunk of {len(chunk.data)} bytes at {offset} runs past the artifact's "
                f"{size} bytes")
    return None
