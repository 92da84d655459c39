"""A node that lies: an attacker owns one box and its node token, and says what it likes on its
Sync stream. Every attack runs against a real ``registry serve`` on 127.0.0.1; the nodes are
gRPC clients speaking the sync protocol with their own real tokens (a real edge where the node
side matters). Before the controls each of these tests failed: budgets of ~5e8 rows/s, 97% of
the budget taken by a 0.1 s window, /metrics grown 650x, ``ESC[2J`` on the operator's terminal,
one audit record per source address, ``audit --verify`` passing a rewound chain.
"""

from __future__ import annotations

import json
import queue
import random
import socket
import sqlite3
import string
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from harness.processes import RegistryProcess, start_registry
from registry.trust import anchor
from serving.config.tokens import node_token
from sync.gen import sync_pb2 as pb
from sync.gen import sync_pb2_grpc as pb_grpc
from tests.conftest import RegistryCli
from tests.integration.test_sync import metric, wait_for
from tests.servers import start

pytestmark = [pytest.mark.integration, pytest.mark.slow]
SECRET = "lying-node-secret-0123456789"
CLEAR, TITLE = "\x1b[2J", "\x1b]0;pwned\x07"


class FakeNode:
    """One node's Sync stream, driven by the test: messages go up through ``send``; what the
    registry sends down is kept in ``received``."""

    def __init__(self, target: str, node_id: str, tier: str, region: str = "eu",
                 held: list[pb.Held] | None = None) -> None:
        self.node_id = node_id
        self._up: queue.Queue[pb.NodeMessage | None] = queue.Queue()
        self._up.put(pb.NodeMessage(hello=pb.Hello(node_id=node_id, tier=tier, region=region,
                                                   held=held or [])))
        self.received: list[pb.ServerMessage] = []
        self._channel = grpc.insecure_channel(target)
        self._call = pb_grpc.SyncStub(self._channel).Sync(
            iter(self._up.get, None),
            metadata=[("authorization",
                       f"Bearer {node_token(SECRET, node_id, tier, region)}")])
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            for message in self._call:
                self.received.append(message)
        except grpc.RpcError:
            pass

    def send(self, **kind: object) -> None:
        self._up.put(pb.NodeMessage(**kind))  # type: ignore[arg-type]

    def release(self) -> pb.Release:
        wait_for(lambda: any(m.HasField("release") for m in self.received), 20,
                 f"a release pushed to {self.node_id}")
        return next(m.release for m in self.received if m.HasField("release"))

    def budget(self) -> pb.Budget | None:
        budgets = [m.budget for m in list(self.received) if m.HasField("budget")]
        return budgets[-1] if budgets else None

    def close(self) -> None:
        self._up.put(None)
        self._call.cancel()
        self._reader.join(10)
        self._channel.close()


def report(version: int = 1, **figures: float) -> pb.QualityReport:
    return pb.QualityReport(model="tiny", version=version, **figures)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory, tiny_release: Path) -> RegistryCli:
    cli = RegistryCli(tmp_path_factory.mktemp("lying") / "registry")
    cli("publish", tiny_release, "--name", "tiny")
    return cli


@pytest.fixture
def registry(cli: RegistryCli, tmp_path: Path) -> Iterator[RegistryProcess]:
    process = start_registry(cli.home, tmp_path, SECRET,
                             env={"REGISTRY_REFUSAL_INTERVAL_S": "3600"})
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def nodes(registry: RegistryProcess) -> Iterator[list[FakeNode]]:
    opened: list[FakeNode] = []
    try:
        yield opened
    finally:
        for node in opened:
            node.close()


def test_a_node_reporting_a_huge_capacity_moves_no_budget(
        cli: RegistryCli, registry: RegistryProcess, nodes: list[FakeNode]) -> None:
    center, edge, liar = (FakeNode(registry.target, name, tier) for name, tier in
                          (("center-1", "center"), ("edge-1", "edge"), ("mallory", "center")))
    nodes += [center, edge, liar]
    for node in nodes:
        node.release()
    center.send(report=report(capacity_rows_s=40, window_s=10))
    edge.send(report=report(rows=200, requests=200, window_s=10))
    wait_for(lambda: (b := edge.budget()) is not None and b.capacity_rows_s == 40, 20,
             "the edge's budget from the real center's 40 rows/s")
    for _ in range(50):  # as often as it likes: each report may add at most a little
        liar.send(report=report(capacity_rows_s=1e9, window_s=10))
    time.sleep(1.0)
    budget = edge.budget()
    assert budget is not None and budget.capacity_rows_s <= 40 + 100 * 1.3  # was 1e9 + 40
    assert budget.rows_per_s <= budget.capacity_rows_s

    # the operator's ceiling holds whatever the centers say
    shown = cli("cascade", "tiny", "--max-capacity", "30", "--json").json()
    assert shown["max_capacity_rows_s"] == 30
    liar.send(report=report(capacity_rows_s=1e9, window_s=10))
    wait_for(lambda: (b := edge.budget()) is not None and b.capacity_rows_s == 30, 20,
             "budgets under the 30 rows/s ceiling")
    records = [r for r in cli("audit", "--model", "tiny", "--json").json()
               if r["action"] == "cascade-policy"]
    assert json.loads(records[-1]["payload"])["to"]["max_capacity_rows_s"] == 30
    cli("cascade", "tiny", "--no-max-capacity")


def test_a_tiny_window_cannot_take_the_budget(registry: RegistryProcess,
                                              nodes: list[FakeNode]) -> None:
    center, edge, liar = (FakeNode(registry.target, name, "center" if name == "center-1"
                                   else "edge") for name in ("center-1", "edge-1", "mallory"))
    nodes += [center, edge, liar]
    for node in nodes:
        node.release()
    center.send(report=report(capacity_rows_s=100, window_s=10))
    edge.send(report=report(rows=500, requests=500, window_s=10))  # 50 rows/s
    wait_for(lambda: (b := edge.budget()) is not None and b.rows_per_s > 90, 20,
             "the only edge holding the whole budget")
    for _ in range(20):  # 1e9 rows over 0.1 s: took 96.8 of 100 rows/s before
        liar.send(report=report(rows=10**9, requests=10**9, window_s=0.1))
    wait_for(lambda: (b := liar.budget()) is not None and b.rows_per_s > 0, 20,
             "the liar's budget")
    time.sleep(1.0)
    budget = edge.budget()
    assert budget is not None and budget.share > 0.3 and budget.rows_per_s > 30


def test_reports_for_unknown_models_add_no_metrics_series(
        cli: RegistryCli, registry: RegistryProcess, nodes: list[FakeNode]) -> None:
    rng = random.Random(7)
    names = ["".join(rng.choices(string.ascii_lowercase, k=12)) for _ in range(3000)]
    held = [pb.Held(model=name, versions=[1], active=1) for name in names]
    edge = FakeNode(registry.target, "edge-1", "edge")
    liar = FakeNode(registry.target, "mallory", "edge", held=held)
    nodes += [edge, liar]
    edge.release()
    liar.release()
    edge.send(report=report(rows=10, requests=10, window_s=10))
    wait_for(lambda: metric(registry.metrics_url, "registry_node_requests_total",
                            node="edge-1") == 10, 20, "the real edge's report")
    before = len(httpx.get(registry.metrics_url, timeout=5).content)
    for i, name in enumerate(names):
        liar.send(report=pb.QualityReport(model=name, version=1, requests=1, rows=1))
        liar.send(ack=pb.Ack(model=name, version=1, state=pb.ACTIVE))
        if i % 3 == 0:  # a known model, a version never pushed to it
            liar.send(report=report(version=1000 + i, requests=1))
    wait_for(lambda: metric(registry.metrics_url, "registry_sync_dropped_total",
                            kind="report") == 4000, 60, "every lie dropped")
    after = len(httpx.get(registry.metrics_url, timeout=5).content)
    assert after < 1.2 * before  # was 13.7 KB -> 8.95 MB
    assert metric(registry.metrics_url, "registry_sync_dropped_total", kind="ack",
                  reason="unknown-model") == 3000
    conn = sqlite3.connect(cli.home / "registry.sqlite3")
    try:
        models = {m for (m,) in conn.execute("SELECT DISTINCT model FROM node_models")}
        audited = {m for (m,) in conn.execute("SELECT DISTINCT model FROM audit")}
    finally:
        conn.close()
    assert models <= {"tiny"} and audited <= {"tiny", None}
    assert registry.log.read_text().count("dropped a") <= 4  # throttled: once a minute a node


def test_control_characters_from_a_node_never_reach_the_terminal(
        cli: RegistryCli, registry: RegistryProcess, nodes: list[FakeNode]) -> None:
    # (a region is the token's, issued by the registry: a hello with another, control
    # characters and all, is refused — test_identity.py; the ack's reason is the node's own)
    liar = FakeNode(registry.target, "mallory", "edge", region="eu")
    nodes.append(liar)
    release = liar.release()
    liar.send(ack=pb.Ack(model="tiny", version=release.version, state=pb.FAILED,
                         reason=f"disk{CLEAR}{TITLE}\x9b2J\u202e" + "x" * 5000))
    liar.send(report=report(rows=1, requests=1, window_s=10))
    wait_for(lambda: any(r["node"] == "mallory" and r["state"] == "FAILED"
                         for r in cli("status", "--json").json()), 20, "the ack recorded")
    for args in (("status",), ("audit",), ("audit", "--limit", "5")):
        text = cli(*args).stdout
        for hidden in ("\x1b", "\x07", "\x9b", "\u202e"):
            assert hidden not in text, (args, hidden)
    status = cli("status").stdout
    flat = "".join(line.strip("│ ") for line in status.splitlines())
    assert "\\x1b[2J" in flat and "\\x1b]0;pwned\\x07" in flat  # shown, as escapes
    (row,) = [r for r in cli("status", "--json").json() if r["node"] == "mallory"]
    assert len(row["reason"]) <= 1100 and "\x1b" not in row["reason"]  # bounded at intake


# -- refused calls from many source addresses --------------------------------------------

def _refused_from(source: str, port: int) -> None:
    """One gRPC call without a token from ``source`` (a 127.x.y.z address): gRPC Python cannot
    choose its source address, so this speaks just enough HTTP/2 by hand."""
    def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
        return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + \
            struct.pack(">I", stream) + payload

    def literal(name: str, value: str) -> bytes:  # HPACK: without indexing, new name
        return bytes([0, len(name)]) + name.encode() + bytes([len(value)]) + value.encode()

    headers = b"".join(literal(n, v) for n, v in (
        (":method", "POST"), (":scheme", "http"), (":path", "/tiered.sync.v1.Sync/Fetch"),
        (":authority", f"127.0.0.1:{port}"), ("content-type", "application/grpc"),
        ("te", "trailers")))
    with socket.create_connection(("127.0.0.1", port), timeout=5,
                                  source_address=(source, 0)) as sock:
        # SETTINGS; HEADERS (END_HEADERS); an empty request message (DATA, END_STREAM)
        sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0, b"") +
                     frame(1, 0x4, 1, headers) + frame(0, 0x1, 1, bytes(5)))
        buffer, deadline = b"", time.monotonic() + 10
        while time.monotonic() < deadline:
            chunk = sock.recv(65536)
            if not chunk:
                return
            buffer += chunk
            while len(buffer) >= 9 and len(buffer) >= 9 + int.from_bytes(buffer[:3]):
                size, kind, flags = int.from_bytes(buffer[:3]), buffer[3], buffer[4]
                stream = int.from_bytes(buffer[5:9]) & 0x7FFFFFFF
                buffer = buffer[9 + size:]
                if kind == 4 and not flags & 1:  # the server's settings: acknowledge them
                    sock.sendall(frame(4, 1, 0, b""))
                if (kind == 1 and flags & 1 and stream == 1) or kind in (3, 7):
                    return  # the refusal's trailers (or a reset): done
        raise AssertionError(f"no answer to a call from {source}")


def test_refusals_from_many_loopback_addresses_write_one_audit_record(
        cli: RegistryCli, registry: RegistryProcess) -> None:
    before = len(cli("audit", "--json").json())
    sources = [f"127.0.{i // 200}.{2 + i % 200}" for i in range(60)]
    for source in sources:
        _refused_from(source, registry.port)
    wait_for(lambda: metric(registry.metrics_url, "registry_auth_failures_total") == 60, 20,
             "60 refusals counted")
    registry.stop()  # the interval's record is written at shutdown
    rows = cli("audit", "--json").json()[before:]
    assert [r["action"] for r in rows] == ["auth-denied"]  # was one per source address
    payload = json.loads(rows[0]["payload"])
    assert payload["count"] == 60 and payload["hosts"] == 60 and not payload["hosts_estimated"]
    assert len(payload["top"]) == 20 and payload["others"] == 40
    assert {t["peer"] for t in payload["top"]} <= set(sources)
    cli("audit", "--verify")


# -- the audit chain rewound, with an older signed head put back -------------------------

def test_a_rewound_chain_with_an_older_head_fails_against_what_nodes_saw(
        cli: RegistryCli, tmp_path: Path) -> None:
    head = cli.home / anchor.FILE
    older = head.read_bytes()  # a valid signed head, from before the node's directive
    cut = json.loads(older)["seq"]
    cli("cascade", "tiny", "--split", "equal")  # the chain moves on (audited)
    registry = start_registry(cli.home, tmp_path, SECRET)
    try:
        edge = start("edge", tmp_path / "edge", tmp_path, "--registry", registry.target,
                     "--sync-backoff-max-s", "1", "--release-key",
                     str(cli("key", "--json").json()["public_key_path"]),
                     registry_secret=SECRET)
        try:
            wait_for(lambda: any(r["node"] == edge.node_id and r["directive_seq"]
                                 for r in cli("status", "--json").json()), 60,
                     "the edge's ACTIVE ack with its directive's seq")
        finally:
            edge.stop()
    finally:
        registry.stop()
    (row,) = [r for r in cli("status", "--json").json() if r["node"] == edge.node_id]
    seen = row["directive_seq"]
    verified = cli("audit", "--verify", "--json").json()
    assert verified["ok"] and verified["nodes_seen_seq"] == seen
    conn = sqlite3.connect(cli.home / "registry.sqlite3")
    conn.executescript(f"""
        DROP TRIGGER audit_no_delete;
        DELETE FROM audit WHERE seq > {cut};
        CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit
        BEGIN SELECT RAISE(ABORT, 'audit log is append-only'); END;""")
    conn.close()
    head.write_bytes(older)  # valid, signed, and exactly where the chain now ends
    after = cli("audit", "--verify", "--json", check=False)
    data = after.json()
    assert after.code == 1 and not data["ok"]
    assert data["first_bad"] is None and data["head_problem"] is None  # both fooled
    assert data["nodes_seen_seq"] == seen > cut
    assert f"a node has seen seq {seen} but the chain ends at {cut}" in data["nodes_problem"]
    text = cli("audit", "--verify", check=False)
    assert text.code == 1 and "records were removed" in "".join(text.stdout.split("\n"))
