"""A real edge against a registry of this test's making, on real gRPC, that replays metadata a
real registry signed, mixed and rolled back as a man in the middle or a rogue mirror would.

The metadata comes from a real registry home: version 1 of ``tiny`` (state A), then version 2
(state B), each with its timestamp, snapshot and targets signed as ``registry serve`` signs
them. The edge starts from a store that holds version 1 and a pinned key, as before TUF. What it
must refuse: a timestamp with an older snapshot; a current targets with an older snapshot (and
the release only that targets lists); an older timestamp after a newer one.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import msgspec
import pytest

from harness.processes import BIN, TierProcess, start_tier
from registry.settings import RegistrySettings
from registry.trust import keys, tuf
from sync.gen import sync_pb2 as pb
from sync.gen import sync_pb2_grpc as pb_grpc
from sync.wire import directive
from tests.conftest import RegistryCli
from tests.integration.test_sync import SYNC_FLAGS, TOKEN, served, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]


class Wire(pb_grpc.SyncServicer):
    """One Sync stream at a time: sends what the test queues, keeps what the node sends."""

    def __init__(self) -> None:
        self.outbox: queue.Queue[pb.ServerMessage | None] = queue.Queue()
        self.received: list[pb.NodeMessage] = []

    async def Sync(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        async def read() -> None:
            async for message in request_iterator:
                self.received.append(message)

        reader = asyncio.create_task(read())
        try:
            await context.write(pb.ServerMessage(welcome=pb.Welcome(
                registry="wire", report_interval_s=60)))
            while (message := await asyncio.to_thread(self.outbox.get)) is not None:
                await context.write(message)
        finally:
            reader.cancel()

    def send(self, **kind: Any) -> None:
        self.outbox.put(pb.ServerMessage(**kind))

    def trust_states(self) -> list[pb.TrustState]:
        return [m.trust for m in list(self.received) if m.WhichOneof("kind") == "trust"]

    def acks(self) -> list[pb.Ack]:
        return [m.ack for m in list(self.received) if m.WhichOneof("kind") == "ack"]


@dataclass
class Served:
    wire: Wire
    port: int
    loop: asyncio.AbstractEventLoop
    thread: threading.Thread


@pytest.fixture
def wire() -> Iterator[Served]:
    service = Wire()
    loop = asyncio.new_event_loop()
    ready: queue.Queue[int] = queue.Queue()
    stop = asyncio.Event()

    async def main() -> None:
        server = grpc.aio.server()
        pb_grpc.add_SyncServicer_to_server(service, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        ready.put(port)
        await stop.wait()
        await server.stop(0)

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    served_ = Served(service, ready.get(timeout=10), loop, thread)
    try:
        yield served_
    finally:
        service.outbox.put(None)
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)
        loop.close()


def _metadata(published: tuf.Published, **override: bytes) -> pb.Trust:
    fields = {"timestamp": published.timestamp, "snapshot": published.snapshot,
              "targets": published.targets, **override}
    return pb.Trust(roots=published.roots_after(0), **fields)


def test_mixed_and_rolled_back_metadata_is_refused_by_a_real_edge(
        wire: Served, tmp_path: Path, tiny_release: Path) -> None:
    cli = RegistryCli(tmp_path / "registry")
    cli("publish", tiny_release, "--name", "tiny")
    cli("pull", "tiny@1", "--tier", "edge", "--store", tmp_path / "edge")
    pinned = cli("key", "--path").stdout.strip()
    catalog = cli.catalog()
    key = keys.signer(RegistrySettings(home=cli.home))
    tuf.advance(catalog.db, key, 3600)
    a = tuf.published(catalog.db)
    tiny = catalog.resolve("tiny", "1").manifest
    catalog.create_version(msgspec.structs.replace(tiny, publisher="second"), signer=key)
    tuf.advance(catalog.db, key, 3600)
    b = tuf.published(catalog.db)
    assert a is not None and b is not None and a.timestamp_version < b.timestamp_version
    edge: TierProcess = start_tier(
        "edge", tmp_path / "edge", tmp_path, "--poll-interval-s", "0.2", "--registry",
        f"127.0.0.1:{wire.port}", "--release-key", pinned, *SYNC_FLAGS,
        env={"PATH": str(BIN)}, registry_secret=TOKEN)
    states = wire.wire.trust_states
    try:
        assert served(edge) == 1
        wait_for(lambda: any(m.WhichOneof("kind") == "hello" for m in wire.wire.received), 30,
                 "the edge's hello")
        wire.wire.send(trust=_metadata(a))
        wait_for(lambda: len(states()) >= 1, 30, "the edge's trust state")
        assert (states()[-1].timestamp_version, states()[-1].error) == (a.timestamp_version, "")

        # a current targets with the older snapshot (and timestamp): the targets the snapshot
        # does not name is not taken, so version 2, listed only there, is refused
        wire.wire.send(trust=_metadata(a, targets=b.targets))
        wait_for(lambda: len(states()) >= 2, 30, "the edge's second trust state")
        assert states()[-1].timestamp_version == a.timestamp_version
        row = catalog.resolve("tiny", "2")
        data, signature = directive.sign(key, directive.Directive(
            edge.node, "tiny", 2, row.manifest_sha256, 10, "0" * 64))
        wire.wire.send(release=pb.Release(
            model="tiny", version=2, alias="production", manifest=row.manifest_bytes,
            manifest_sha256=row.manifest_sha256, signature=row.signature or b"",
            directive=data, directive_signature=signature))
        wait_for(lambda: any(a_.version == 2 for a_ in wire.wire.acks()), 30, "the ack")
        (ack,) = [a_ for a_ in wire.wire.acks() if a_.version == 2]
        assert ack.state == pb.REFUSED and "not in the trusted TUF targets" in ack.reason
        assert served(edge) == 1 and not (tmp_path / "edge" / "tiny" / "2").exists()

        # a current timestamp with the older snapshot: the snapshot is refused
        wire.wire.send(trust=_metadata(b, snapshot=a.snapshot))
        wait_for(lambda: len(states()) >= 3, 30, "the edge's third trust state")
        assert "does not match" in states()[-1].error, states()[-1].error

        # state B whole: taken; then state A again: a rollback, refused
        count = len(states())
        wire.wire.send(trust=_metadata(b))
        wait_for(lambda: len(states()) > count, 30, "the edge's answer to state B")
        assert (states()[-1].timestamp_version, states()[-1].error) == (b.timestamp_version, "")
        count = len(states())
        wire.wire.send(trust=_metadata(a))
        wait_for(lambda: len(states()) > count, 30, "the edge's answer to a rollback")
        assert states()[-1].error and states()[-1].timestamp_version == b.timestamp_version
        health = httpx.get(f"{edge.url}/v2/health/ready", timeout=5).json()
        assert health["trust"]["timestamp_version"] == b.timestamp_version
        assert health["trust"]["error"] == states()[-1].error
        time.sleep(0.2)
    finally:
        edge.stop()
