"""A standby that follows its primary (``registry serve --follow``), without Consul: what it
copies, what it refuses, how it recovers from a history that is not the primary's."""

from __future__ import annotations

import shutil
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from harness.processes import RegistryProcess, start_registry
from serving.config.tokens import node_token
from sync.gen import sync_pb2 as pb
from sync.gen import sync_pb2_grpc as pb_grpc
from sync.wire import auth
from tests.conftest import RegistryCli

pytestmark = [pytest.mark.integration, pytest.mark.slow]
SECRET = "test-token-0123456789"


def wait_for(what: str, ready: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout}s: {what}")


def versions(home: Path) -> list[tuple[str, int]]:
    database = home / "registry.sqlite3"
    if not database.exists():
        return []
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as conn:
        return [(str(m), int(v)) for m, v in
                conn.execute("SELECT model, version FROM versions ORDER BY model, version")]


def chain(home: Path) -> list[tuple[int, str]]:
    with sqlite3.connect(f"file:{home / 'registry.sqlite3'}?mode=ro", uri=True) as conn:
        return [(int(s), str(h)) for s, h in conn.execute("SELECT seq, hash FROM audit "
                                                          "ORDER BY seq")]


def same_key(primary: Path, standby: Path) -> None:
    """Every registry of a group signs with one key (nodes pin it): provisioned, not sent."""
    shutil.copytree(primary / "keys", standby / "keys")


@pytest.fixture
def pair(tmp_path: Path, tiny_release: Path) -> Iterator[tuple[RegistryCli, RegistryCli,
                                                               RegistryProcess]]:
    primary_cli, standby_cli = RegistryCli(tmp_path / "a"), RegistryCli(tmp_path / "b")
    primary_cli("publish", tiny_release, "--name", "sentiment")
    same_key(primary_cli.home, standby_cli.home)
    primary = start_registry(primary_cli.home, tmp_path, SECRET)
    try:
        yield primary_cli, standby_cli, primary
    finally:
        primary.stop()


def test_a_standby_copies_releases_blobs_and_the_audit_chain_and_refuses_writes(
        pair: tuple[RegistryCli, RegistryCli, RegistryProcess], tmp_path: Path,
        tiny_release: Path) -> None:
    primary_cli, standby_cli, primary = pair
    standby = start_registry(standby_cli.home, tmp_path, SECRET, "--follow", primary.target)
    try:
        wait_for("the standby holds version 1", lambda: versions(standby_cli.home) ==
                 [("sentiment", 1)])
        # a change made while it follows arrives too, with its blobs
        primary_cli("cascade", "sentiment", "--mode", "static", "--capacity", "50")
        primary_cli("publish", tiny_release, "--name", "sentiment", "--canary", "edge-1")
        wait_for("version 2", lambda: versions(standby_cli.home) == [("sentiment", 1),
                                                                    ("sentiment", 2)])
        wait_for("the whole chain", lambda: chain(standby_cli.home) == chain(primary_cli.home))
        listed = standby_cli("show", "sentiment@2", "--json").json()
        original = primary_cli("show", "sentiment@2", "--json").json()
        # the same release; each answer names the home it read
        assert (listed.pop("home"), original.pop("home")) == (str(standby_cli.home),
                                                             str(primary_cli.home))
        assert listed == original
        assert standby_cli("audit", "--verify", "--json").json()["ok"]
        with sqlite3.connect(primary_cli.home / "registry.sqlite3") as conn:
            blobs = [str(r[0]) for r in conn.execute("SELECT sha256 FROM blobs")]
        assert len(blobs) >= 4
        for sha in blobs:
            copy = standby_cli.home / "blobs" / "sha256" / sha[:2] / sha
            assert copy.read_bytes() == (primary_cli.home / "blobs" / "sha256" / sha[:2] /
                                         sha).read_bytes()
        # reads work; writes are refused, naming the primary
        refused = standby_cli("promote", "sentiment", check=False)
        assert refused.code == 6
        assert "standby" in refused.stderr and primary.target in refused.stderr
        assert versions(standby_cli.home)[-1] == ("sentiment", 2)
        assert chain(standby_cli.home) == chain(primary_cli.home)
    finally:
        standby.stop()


def test_a_standby_whose_history_diverged_is_replaced_by_a_snapshot_and_keeps_the_old_one(
        pair: tuple[RegistryCli, RegistryCli, RegistryProcess], tmp_path: Path,
        tiny_release: Path) -> None:
    """A former primary that wrote what never reached the others must not merge it: its
    database is put aside and replaced by the primary's, checked first."""
    primary_cli, standby_cli, primary = pair
    standby_cli("publish", tiny_release, "--name", "other")  # its own, diverging history
    standby = start_registry(standby_cli.home, tmp_path, SECRET, "--follow", primary.target)
    try:
        wait_for("the primary's history", lambda: versions(standby_cli.home) ==
                 [("sentiment", 1)])
        wait_for("the whole chain", lambda: chain(standby_cli.home) == chain(primary_cli.home))
        kept = list((standby_cli.home / "replaced").glob("*/registry.sqlite3"))
        assert len(kept) == 1
        assert versions(kept[0].parent) == [("other", 1)]
        assert "not this primary's" in (kept[0].parent / "why.txt").read_text()
        assert standby_cli("audit", "--verify", "--json").json()["ok"]
    finally:
        standby.stop()


def test_only_a_registry_token_opens_replication_and_it_opens_nothing_else(
        pair: tuple[RegistryCli, RegistryCli, RegistryProcess]) -> None:
    """A stolen edge box holds an edge token: it must not copy the catalog, the audit log or
    the blobs through replication; and a registry token is no node."""
    _, _, primary = pair
    edge = node_token(SECRET, "edge-1", "edge", "eu")
    registry = node_token(SECRET, "registry-b", "registry", "fleet")
    with grpc.insecure_channel(primary.target) as channel:
        stub = pb_grpc.ReplicationStub(channel)
        calls = [
            lambda token: list(stub.Snapshot(pb.SnapshotRequest(registry_id="x"),
                                             metadata=auth.metadata(token), timeout=10)),
            lambda token: list(stub.Blob(pb.FetchRequest(sha256="0" * 64),
                                         metadata=auth.metadata(token), timeout=10)),
            lambda token: list(stub.Follow(iter([pb.FollowerMessage(hello=pb.FollowHello(
                registry_id="edge-1"))]), metadata=auth.metadata(token), timeout=10)),
        ]
        for call in calls:
            with pytest.raises(grpc.RpcError) as refused:
                call(edge)
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        with pytest.raises(grpc.RpcError) as unknown:  # the registry token: a real answer
            list(stub.Blob(pb.FetchRequest(sha256="0" * 64), metadata=auth.metadata(registry),
                           timeout=10))
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
        sync = pb_grpc.SyncStub(channel)
        hello = pb.NodeMessage(hello=pb.Hello(node_id="registry-b", tier="registry",
                                              region="fleet"))
        with pytest.raises(grpc.RpcError) as not_a_node:
            list(sync.Sync(iter([hello]), metadata=auth.metadata(registry), timeout=10))
        assert not_a_node.value.code() == grpc.StatusCode.PERMISSION_DENIED
