"""The node's chunked download against a registry of this test's making, on real gRPC.

A real ``grpc.aio`` Sync server on 127.0.0.1 serves one artifact's chunk index and chunks,
cut and compressed by the real code, with the faults a flaky link or a broken registry brings:
a chunk whose bytes are damaged in transit, a stream cut part way, a chunk not asked for, an
index that is not the manifest's. The node holds version 1 (most of the chunks); the artifact of
version 2 must come out byte for byte, fetching only what it lacks.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from prometheus_client import CollectorRegistry

from serving.release import chunks
from serving.release.chunks import Chunk
from serving.release.manifest import Artifact
from serving.release.store import InstalledReleases, ModelStore
from sync.gen import sync_pb2 as pb
from sync.gen import sync_pb2_grpc as pb_grpc
from sync.node.download import Downloader
from sync.node.transfer import DownloadMetrics
from sync.wire.errors import TransferError
from tests.unit.serving.test_store import manifest

pytestmark = [pytest.mark.integration]
OLD = random.Random(2).randbytes(2 * 1024 * 1024)
NEW = OLD[:700_000] + random.Random(3).randbytes(90_000) + OLD[760_000:]  # a head replaced


def _artifact(tmp_path: Path, data: bytes) -> tuple[Artifact, list[Chunk], bytes]:
    path = tmp_path / "new.onnx"
    path.write_bytes(data)
    cuts = chunks.cut(path)
    index = chunks.encode_index(cuts)
    artifact = Artifact("model.onnx", hashlib.sha256(data).hexdigest(), len(data), "onnx",
                        "int8", chunks=chunks.describe(index, cuts))
    return artifact, cuts, index


class Registry(pb_grpc.SyncServicer):
    """Serves ``data`` by chunks (and whole); ``damage``: positions whose chunk is damaged the
    first time it is sent; ``cut_after``: the first Chunks call breaks after that many."""

    def __init__(self, data: bytes, cuts: list[Chunk], index: bytes) -> None:
        self.data, self.cuts, self.index = data, cuts, index
        self.requests: list[list[int]] = []
        self.damage: set[int] = set()
        self.cut_after: int | None = None
        self.extra: int | None = None  # a position sent without being asked for
        self.sent_bytes = 0
        self.whole = 0

    async def ChunkIndex(self, request: pb.FetchRequest,
                         context: grpc.aio.ServicerContext) -> pb.IndexReply:
        return pb.IndexReply(index=self.index)

    async def Chunks(self, request: pb.ChunksRequest,
                     context: grpc.aio.ServicerContext) -> AsyncIterator[pb.ChunkData]:
        self.requests.append(list(request.chunks))
        for n, position in enumerate([*request.chunks, *([self.extra] if self.extra else [])]):
            if self.cut_after is not None and n == self.cut_after:
                self.cut_after = None
                await context.abort(grpc.StatusCode.UNAVAILABLE, "link lost")
            c = self.cuts[position]
            raw = self.data[c.offset:c.offset + c.size]
            if position in self.damage:
                self.damage.discard(position)
                raw = raw[:-1] + bytes([raw[-1] ^ 1])
            data = chunks.compress(raw)
            self.sent_bytes += len(data)
            yield pb.ChunkData(chunk=position, data=data)

    async def Fetch(self, request: pb.FetchRequest,
                    context: grpc.aio.ServicerContext) -> AsyncIterator[pb.Chunk]:
        self.whole += 1
        yield pb.Chunk(offset=0, data=self.data, size=len(self.data))


def _holding_v1(tmp_path: Path) -> ModelStore:
    """A store whose version 1 has ``OLD`` as its edge model."""
    store = ModelStore(tmp_path / "store")
    old = Artifact("model.onnx", hashlib.sha256(OLD).hexdigest(), len(OLD), "onnx")
    v1 = manifest(1)
    v1 = type(v1)(**{**{f: getattr(v1, f) for f in v1.__struct_fields__}, "edge": old,
                     "probe": None})
    store.install(v1, "edge", lambda a, d: d.write_bytes(
        OLD if a.file == "model.onnx" else b"{}" if a.file == "tokenizer.json" else b""),
        activate=True)
    return store


async def _get(registry: Registry, store: InstalledReleases,
               artifact: Artifact) -> tuple[Path, CollectorRegistry]:
    server = grpc.aio.server()
    pb_grpc.add_SyncServicer_to_server(registry, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    stub = pb_grpc.SyncStub(channel)
    metrics = CollectorRegistry()
    try:
        got = await Downloader(lambda: stub, [], store, DownloadMetrics("edge", metrics)).get(
            artifact)
        return got, metrics
    finally:
        await channel.close()
        await server.stop(None)


def _metric(metrics: CollectorRegistry, name: str) -> float:
    return metrics.get_sample_value(f"edge_sync_{name}_total") or 0.0


def test_a_node_holding_v1_fetches_only_the_chunks_v2_adds(tmp_path: Path) -> None:
    artifact, cuts, index = _artifact(tmp_path, NEW)
    registry = Registry(NEW, cuts, index)
    store = _holding_v1(tmp_path)
    got, metrics = asyncio.run(_get(registry, store, artifact))
    assert got.read_bytes() == NEW and registry.whole == 0
    asked = [p for call in registry.requests for p in call]
    asked_bytes = sum(cuts[p].size for p in asked)
    print(f"{len(asked)} of {len(cuts)} chunks asked for, {asked_bytes} of {len(NEW)} bytes; "
          f"{registry.sent_bytes} compressed bytes sent")
    assert 0 < len(asked) <= 4 and asked_bytes < 0.25 * len(NEW)
    assert _metric(metrics, "bytes_received") == registry.sent_bytes
    assert _metric(metrics, "bytes_reused") == len(NEW) - asked_bytes
    assert not (store.root / ".downloads" / f"{artifact.sha256}.chunks").exists()


def test_an_empty_store_gets_every_chunk(tmp_path: Path) -> None:
    artifact, cuts, index = _artifact(tmp_path, NEW)
    registry = Registry(NEW, cuts, index)
    got, _ = asyncio.run(_get(registry, InstalledReleases(tmp_path / "empty"), artifact))
    assert got.read_bytes() == NEW
    assert sorted(p for call in registry.requests for p in call) == list(range(len(cuts)))


def test_a_damaged_chunk_is_refused_and_fetched_again(tmp_path: Path) -> None:
    artifact, cuts, index = _artifact(tmp_path, NEW)
    registry = Registry(NEW, cuts, index)
    registry.damage = {0, len(cuts) - 1}
    got, metrics = asyncio.run(_get(registry, InstalledReleases(tmp_path / "empty"), artifact))
    assert got.read_bytes() == NEW
    assert _metric(metrics, "chunks_refused") == 2
    assert sorted(registry.requests[1]) == [0, len(cuts) - 1]  # the second round: only those


def test_a_chunk_that_stays_damaged_ends_in_a_whole_fetch_never_in_bad_bytes(
        tmp_path: Path) -> None:
    artifact, cuts, index = _artifact(tmp_path, NEW)

    class Broken(Registry):
        def __init__(self) -> None:
            super().__init__(NEW, cuts, index)

        async def Chunks(self, request: pb.ChunksRequest,
                         context: grpc.aio.ServicerContext) -> AsyncIterator[pb.ChunkData]:
            self.damage = {0}
            async for message in super().Chunks(request, context):
                yield message

    registry = Broken()
    got, metrics = asyncio.run(_get(registry, InstalledReleases(tmp_path / "empty"), artifact))
    assert got.read_bytes() == NEW and registry.whole == 1
    assert _metric(metrics, "chunks_refused") == 6  # the first try and five more, then whole


def test_a_cut_stream_resumes_with_the_chunks_not_yet_kept(tmp_path: Path) -> None:
    artifact, cuts, index = _artifact(tmp_path, NEW)
    registry = Registry(NEW, cuts, index)
    registry.cut_after = 10
    got, metrics = asyncio.run(_get(registry, InstalledReleases(tmp_path / "empty"), artifact))
    assert got.read_bytes() == NEW and _metric(metrics, "fetch_resumed") == 1
    first, second = registry.requests
    assert len(first) == len(cuts) and sorted(second) == sorted(first[10:])


def test_a_chunk_not_asked_for_ends_the_transfer(tmp_path: Path) -> None:
    artifact, cuts, index = _artifact(tmp_path, NEW)
    registry = Registry(NEW, cuts, index)
    registry.extra = 1
    store = _holding_v1(tmp_path)  # holds chunk 1: it is never asked for
    with pytest.raises(TransferError, match="not asked for"):
        asyncio.run(_get(registry, store, artifact))
    assert not (store.root / ".downloads" / artifact.sha256).exists()


def test_an_index_that_is_not_the_manifest_s_means_a_whole_fetch(tmp_path: Path) -> None:
    artifact, cuts, index = _artifact(tmp_path, NEW)
    registry = Registry(NEW, cuts, index[:-1] + b"\0")
    got, metrics = asyncio.run(_get(registry, InstalledReleases(tmp_path / "empty"), artifact))
    assert got.read_bytes() == NEW and registry.whole == 1 and not registry.requests
    assert _metric(metrics, "chunks_refused") == 1
