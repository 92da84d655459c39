"""Chunked releases end to end: a real ``registry serve`` and real edges on loopback.

Releases are published chunked (the default). An edge holding version 1 receives version 2,
whose models differ only in their classifier heads, and downloads only the chunks the heads
changed (counted at the registry); an edge with an empty store gets every chunk; a chunk damaged
in the registry's chunk store is refused and the release still arrives intact; a cut stream
resumes; the node's and the registry's rate limits hold. The tests run in file order on one
registry (the version numbers in the comments).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from examples.sentiment.variants import head_only
from harness.processes import RegistryProcess, start_registry
from serving.release import chunks
from tests.conftest import RegistryCli
from tests.faults import CutProxy
from tests.integration.test_sync import (
    REGISTRY_ENV,
    SYNC_FLAGS,
    TOKEN,
    edge_artifact_bytes,
    metric,
    node_metric,
    served,
    wait_for,
)
from tests.servers import Server, start

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@dataclass
class Chunked:
    root: Path
    cli: RegistryCli
    registry: RegistryProcess
    nodes: list[Server] = field(default_factory=list)

    def edge(self, name: str, *flags: str, registry: str | None = None) -> Server:
        node = start("edge", self.root / name, self.root, "--registry",
                     registry or self.registry.target, *SYNC_FLAGS, *flags,
                     registry_secret=TOKEN)
        self.nodes.append(node)
        return node

    def sent(self) -> float:
        return metric(self.registry.metrics_url, "registry_sync_bytes_sent_total")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, tiny_release: Path) -> Iterator[Chunked]:
    root = tmp_path_factory.mktemp("chunked")
    cli = RegistryCli(root / "registry")
    cli("publish", tiny_release, "--name", "tiny")  # version 1
    fleet = Chunked(root, cli, start_registry(cli.home, root, TOKEN, env=REGISTRY_ENV))
    try:
        yield fleet
    finally:
        for node in fleet.nodes:
            node.stop()
        fleet.registry.stop()


def test_an_empty_store_gets_every_chunk(fleet: Chunked) -> None:
    edge = fleet.edge("edge-1")  # ready: it installed version 1 from nothing
    manifest = fleet.cli("show", "tiny@1", "--json").json()["manifest"]
    assert all(manifest[role]["chunks"]["count"] >= 1 for role in ("edge", "tokenizer", "probe"))
    full = edge_artifact_bytes(fleet.cli, 1)
    received = node_metric(edge, "sync_bytes_received")
    print(f"empty store: {received:.0f} compressed bytes for {full} ({received / full:.1%})")
    assert node_metric(edge, "sync_chunks_received") >= 3
    assert 0 < received <= full * 1.01
    assert metric(fleet.registry.metrics_url, "registry_sync_chunk_calls_total") >= 3


def test_an_edge_holding_v1_fetches_only_the_chunks_a_head_change_touched(
        fleet: Chunked, tiny_release: Path) -> None:
    edge = fleet.nodes[0]
    before = fleet.sent()
    reused = node_metric(edge, "sync_bytes_reused")
    fleet.cli("publish", head_only(tiny_release, fleet.root / "head"), "--name", "tiny")  # v2
    wait_for(lambda: served(edge) == 2, 60, "the edge on version 2")
    full = edge_artifact_bytes(fleet.cli, 2)
    sent = fleet.sent() - before
    print(f"head-only change: the registry sent {sent:.0f} bytes of {full} ({sent / full:.1%})")
    assert sent < 0.2 * full
    assert node_metric(edge, "sync_bytes_reused") - reused > 0.7 * full


def test_a_damaged_chunk_is_refused_and_the_release_arrives_intact(fleet: Chunked) -> None:
    manifest = fleet.cli("show", "tiny@2", "--json").json()["manifest"]
    edge_sha = manifest["edge"]["sha256"]
    index = (fleet.cli.home / "blobs" / "chunks" / "index" / edge_sha[:2] / edge_sha).read_bytes()
    first = index[len(chunks.MAGIC):len(chunks.MAGIC) + 32].hex()
    stored = fleet.cli.home / "blobs" / "chunks" / "zstd" / first[:2] / first
    original = stored.read_bytes()
    stored.write_bytes(chunks.compress(b"not the chunk's bytes"))
    try:
        edge = fleet.edge("edge-damaged")  # ready: version 2 installed, nothing less
    finally:
        stored.write_bytes(original)
    assert node_metric(edge, "sync_chunks_refused") >= 1
    installed = fleet.root / "edge-damaged" / "tiny" / "2" / manifest["edge"]["file"]
    assert hashlib.sha256(installed.read_bytes()).hexdigest() == edge_sha
    # a chunk missing from the chunk store is cut from the blob again
    stored.unlink()
    fresh = fleet.edge("edge-rebuilt")
    assert node_metric(fresh, "sync_chunks_refused") == 0 and stored.is_file()


def test_a_cut_chunk_stream_resumes(fleet: Chunked) -> None:
    proxy = CutProxy(fleet.registry.port)
    try:
        full = edge_artifact_bytes(fleet.cli, 2)
        calls = metric(fleet.registry.metrics_url, "registry_sync_chunk_calls_total")
        proxy.cut_after(full // 3)
        edge = fleet.edge("edge-cut", registry=f"127.0.0.1:{proxy.port}")
        assert served(edge) == 2 and proxy.cuts == 1
        assert node_metric(edge, "sync_fetch_resumed") >= 1
        received = node_metric(edge, "sync_bytes_received")
        print(f"cut at {full // 3} bytes: received {received:.0f} for {full}")
        assert received <= full * 1.01 + 2 * chunks.MAX_SIZE  # chunks in flight at the cut
        assert metric(fleet.registry.metrics_url,
                      "registry_sync_chunk_calls_total") - calls >= 4  # 3 files, one twice
        edge.stop()  # before its proxy goes: it would keep reconnecting to a closed port
        fleet.nodes.remove(edge)
    finally:
        proxy.close()


def test_the_node_rate_limit_holds(fleet: Chunked) -> None:
    started = time.monotonic()
    edge = fleet.edge("edge-slow", "--sync-mbit-s", "1")
    elapsed = time.monotonic() - started
    received = node_metric(edge, "sync_bytes_received")
    # half a second's burst, then 1 Mbit/s: ~8 s for the tiny release, where the node's
    # start-up and an unlimited download take ~3
    least = least_s(received, 1)
    print(f"1 Mbit/s node limit: {received:.0f} bytes in {elapsed:.1f} s (at least {least:.1f})")
    assert elapsed >= least > 6


def test_the_registry_egress_cap_holds(fleet: Chunked) -> None:
    fleet.registry.stop()
    fleet.registry = start_registry(fleet.cli.home, fleet.root, TOKEN, port=fleet.registry.port,
                                    env={**REGISTRY_ENV, "REGISTRY_EGRESS_MBIT_S": "1"})
    before, started = fleet.sent(), time.monotonic()
    fleet.edge("edge-capped")
    elapsed, sent = time.monotonic() - started, fleet.sent() - before
    least = least_s(sent, 1)
    print(f"1 Mbit/s registry egress: {sent:.0f} bytes in {elapsed:.1f} s (at least "
          f"{least:.1f})")
    assert elapsed >= least > 6


def least_s(nbytes: float, mbit_s: float) -> float:
    """The shortest time ``nbytes`` take under a ``mbit_s`` limit (its half-second burst
    first)."""
    rate = mbit_s * 1e6 / 8
    return (nbytes - 0.5 * rate) / rate
