"""Downloads are bounded by the manifest's size, against a rogue registry on real gRPC.

A real ``grpc.aio`` Sync server on 127.0.0.1 answers Fetch with far more bytes than the
artifact has (or chunks that claim another size); the node's Downloader must stop at the
first chunk that does not fit, delete the ``.part`` and fail the transfer, and the ``.part``
must never have grown past the artifact's size.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from prometheus_client import CollectorRegistry

from serving.release.manifest import Artifact
from serving.release.store import InstalledReleases
from sync.gen import sync_pb2 as pb
from sync.gen import sync_pb2_grpc as pb_grpc
from sync.node.download import Downloader
from sync.node.transfer import DownloadMetrics
from sync.wire.errors import TransferError

pytestmark = [pytest.mark.integration]
DATA = b"0123456789"  # the 10-byte artifact of the finding
ARTIFACT = Artifact("model.onnx", hashlib.sha256(DATA).hexdigest(), len(DATA), "onnx", "int8")
CHUNK = 1 << 20
FLOOD = 40  # chunks of 1 MiB: the 41,943,040-byte .part of the finding, were it written


class Rogue(pb_grpc.SyncServicer):
    """Streams ``FLOOD`` MiB, each chunk at the right offset, claiming ``claimed`` as the size;
    notes the .part's size before each chunk it sends."""

    def __init__(self, part: Path, claimed: int, first: bytes = b"") -> None:
        self.part, self.claimed, self.first = part, claimed, first
        self.seen: list[int] = []
        self.sent = 0

    async def Fetch(self, request: pb.FetchRequest,
                    context: grpc.aio.ServicerContext) -> AsyncIterator[pb.Chunk]:
        offset = request.offset
        if self.first:
            yield pb.Chunk(offset=offset, data=self.first, size=self.claimed)
            offset += len(self.first)
        for _ in range(FLOOD):
            self.seen.append(self.part.stat().st_size if self.part.exists() else 0)
            yield pb.Chunk(offset=offset, data=b"x" * CHUNK, size=self.claimed)
            self.sent += 1
            offset += CHUNK


async def _download(tmp_path: Path, rogue: Rogue) -> TransferError:
    server = grpc.aio.server()
    pb_grpc.add_SyncServicer_to_server(rogue, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    stub = pb_grpc.SyncStub(channel)
    downloads = Downloader(lambda: stub, [], InstalledReleases(tmp_path / "store"),
                           DownloadMetrics("edge", CollectorRegistry()))
    try:
        with pytest.raises(TransferError) as failed:
            await downloads.get(ARTIFACT)
        return failed.value
    finally:
        await channel.close()
        await server.stop(None)


def _part(tmp_path: Path) -> Path:
    return tmp_path / "store" / ".downloads" / f"{ARTIFACT.sha256}.part"


@pytest.mark.parametrize(("claimed", "first", "reason"), [
    (len(DATA), b"", "runs past the artifact's 10 bytes"),  # honest size, endless data
    (len(DATA), DATA[:4], "runs past the artifact's 10 bytes"),  # some fits, then too much
    (FLOOD * CHUNK, b"", "expected 0 of 10"),  # a chunk claiming another size
])
def test_a_registry_sending_more_than_the_size_is_cut_off(
        tmp_path: Path, claimed: int, first: bytes, reason: str) -> None:
    rogue = Rogue(_part(tmp_path), claimed, first)
    error = asyncio.run(_download(tmp_path, rogue))
    assert reason in str(error) and "partial download was deleted" in str(error)
    assert not _part(tmp_path).exists()
    assert not (tmp_path / "store" / ".downloads" / ARTIFACT.sha256).exists()
    assert max(rogue.seen) <= ARTIFACT.size
    assert rogue.sent < FLOOD  # the node hung up; gRPC flow control stopped the rest


def test_empty_chunks_do_not_spin_forever(tmp_path: Path) -> None:
    class Empty(Rogue):
        async def Fetch(self, request: pb.FetchRequest,
                        context: Any) -> AsyncIterator[pb.Chunk]:
            while True:
                yield pb.Chunk(offset=request.offset, data=b"", size=len(DATA))

    error = asyncio.run(_download(tmp_path, Empty(_part(tmp_path), len(DATA))))
    assert "empty chunk at 0 of 10" in str(error) and not _part(tmp_path).exists()
