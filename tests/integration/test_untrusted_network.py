"""Trust nothing from the network: a real ``registry serve`` flooded with wrong tokens, and a
rogue registry (a real gRPC server on the registry's port) replaying an older, validly signed
release and streaming more bytes than an artifact has.

The tests share one registry home and run in file order (version numbers in the comments).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from harness.processes import BIN, RegistryProcess, TierProcess, start_registry, start_tier
from registry.trust import anchor
from serving.config.tokens import node_token
from sync.gen import sync_pb2 as pb
from sync.gen import sync_pb2_grpc as pb_grpc
from tests import streams
from tests.conftest import RegistryCli
from tests.integration.test_sync import TOKEN, metric, served, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]
AUTH = [("authorization", f"Bearer {node_token(TOKEN, 'fetcher', 'edge', 'local')}")]


def auth(node_id: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {node_token(TOKEN, node_id, 'edge', 'local')}")]
FLOOD = 2000
CHUNK = 64 * 1024


@dataclass
class Home:
    root: Path
    cli: RegistryCli
    registry: RegistryProcess | None = None
    edge: TierProcess | None = None
    captured: dict[str, pb.Release] = field(default_factory=dict)

    def key(self) -> str:
        return str(self.cli("key", "--json").json()["public_key_path"])

    def start_registry(self, port: int | None = None,
                       env: dict[str, str] | None = None) -> RegistryProcess:
        self.registry = start_registry(self.cli.home, self.root, TOKEN, port=port, env=env)
        return self.registry

    def start_edge(self, name: str, port: int, until: str = "ready") -> TierProcess:
        return start_tier("edge", self.root / name, self.root, "--poll-interval-s", "0.2",
                          "--registry", f"127.0.0.1:{port}",
                          "--sync-backoff-max-s", "1", "--release-key", self.key(),
                          until=until, env={"PATH": str(BIN)}, registry_secret=TOKEN,
                          node_id=name)


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory, tiny_release: Path) -> Iterator[Home]:
    root = tmp_path_factory.mktemp("untrusted")
    home = Home(root, RegistryCli(root / "registry"))
    home.cli("publish", tiny_release, "--name", "tiny")  # version 1
    try:
        yield home
    finally:
        if home.edge is not None:
            home.edge.stop()
        if home.registry is not None:
            home.registry.stop()


def test_a_flood_of_wrong_tokens_leaves_one_aggregate_record(home: Home) -> None:
    # one interval for the whole flood however long it takes here: the shutdown writes it
    registry = home.start_registry(env={"REGISTRY_REFUSAL_INTERVAL_S": "3600"})
    manifest = home.cli("show", "tiny@1", "--json").json()["manifest"]
    sha = manifest["edge"]["sha256"]
    audited_before = len(home.cli("audit", "--json").json())
    with grpc.insecure_channel(registry.target) as channel:
        stub = pb_grpc.SyncStub(channel)

        def wrong(i: int) -> grpc.StatusCode:
            try:
                list(stub.Fetch(pb.FetchRequest(sha256=sha), timeout=30,
                                metadata=[("authorization", f"Bearer guess-{i}")]))
            except grpc.RpcError as exc:
                return exc.code()  # type: ignore[no-any-return]
            return grpc.StatusCode.OK

        with ThreadPoolExecutor(4) as pool:
            codes = set(pool.map(wrong, range(FLOOD)))
        assert codes == {grpc.StatusCode.UNAUTHENTICATED}
        with streams.stream(registry.target, TOKEN, "fetcher") as held:
            assert held.next().WhichOneof("kind") == "welcome"
            data = b"".join(c.data for c in stub.Fetch(pb.FetchRequest(sha256=sha),
                                                       metadata=AUTH, timeout=30))
        assert hashlib.sha256(data).hexdigest() == sha  # a legitimate Fetch still works
    assert metric(registry.metrics_url, "registry_auth_failures_total") == FLOOD
    log = registry.log.read_text()
    assert log.count("missing or wrong token") == 1 and log.count("only counted") == 1
    registry.stop()  # the last interval's aggregate is written at shutdown
    rows = home.cli("audit", "--json").json()[audited_before:]
    denied = [r for r in rows if r["action"] == "auth-denied"]
    assert len(rows) == len(denied) == 1  # one record per interval, for every host
    (payload,) = [json.loads(r["payload"]) for r in denied]
    assert payload["count"] == FLOOD and payload["over_limit"] == FLOOD - 100
    assert payload["hosts"] == 1 and payload["others"] == 0
    assert [t["peer"] for t in payload["top"]] == ["127.0.0.1"]
    assert {r["actor"] for r in denied} == {"peers"}
    assert set(payload["methods"]) == {"/tiered.sync.v1.Sync/Fetch"}
    table = home.cli("audit", "--limit", "3").stdout
    assert "auth-denied" in table and "peers" in table
    home.cli("audit", "--verify")  # the aggregate moved the signed head too


def capture(target: str, node_id: str) -> pb.Release:
    """Say hello as ``node_id`` (with the real token) and keep the release pushed to it, as a
    man in the middle of plaintext gRPC would have seen it."""
    done = threading.Event()

    def requests() -> Iterator[pb.NodeMessage]:
        yield pb.NodeMessage(hello=pb.Hello(node_id=node_id, tier="edge", region="local"))
        done.wait(60)  # keep the stream open until the release has come

    with grpc.insecure_channel(target) as channel:
        call = pb_grpc.SyncStub(channel).Sync(requests(), metadata=auth(node_id), timeout=60)
        try:
            for message in call:
                if message.WhichOneof("kind") == "release":
                    return message.release
        finally:
            done.set()
            call.cancel()
    raise AssertionError("no release pushed")


class RogueRegistry(pb_grpc.SyncServicer):
    """On the registry's port: pushes each node the release captured for it, records its acks,
    and answers every Fetch with far more bytes than the artifact has."""

    def __init__(self, releases: dict[str, pb.Release], sizes: dict[str, int]) -> None:
        self.releases, self.sizes = releases, sizes
        self.acks: list[tuple[str, pb.Ack]] = []

    def Sync(self, request_iterator: Iterator[pb.NodeMessage], context: Any
             ) -> Iterator[pb.ServerMessage]:
        node = next(request_iterator).hello.node_id
        yield pb.ServerMessage(welcome=pb.Welcome(registry="rogue", report_interval_s=60))
        if node in self.releases:
            yield pb.ServerMessage(release=self.releases[node])
        for message in request_iterator:
            if message.WhichOneof("kind") == "ack":
                self.acks.append((node, message.ack))

    def Fetch(self, request: pb.FetchRequest, context: Any) -> Iterator[pb.Chunk]:
        size, offset = self.sizes.get(request.sha256, 10), request.offset
        for _ in range(1000):  # 64 MiB at most, whatever the node does
            yield pb.Chunk(offset=offset, data=b"x" * CHUNK, size=size)
            offset += CHUNK

    def reasons(self, node: str, state: int = pb.FAILED) -> list[str]:
        return [a.reason for n, a in list(self.acks) if n == node and a.state == state]


def rogue_on(port: int, rogue: RogueRegistry) -> grpc.Server:
    server = grpc.server(ThreadPoolExecutor(8))
    pb_grpc.add_SyncServicer_to_server(rogue, server)
    assert server.add_insecure_port(f"127.0.0.1:{port}") == port
    server.start()
    return server


def test_a_replayed_older_release_is_refused_across_restarts(home: Home,
                                                             tiny_release_b: Path) -> None:
    registry = home.start_registry()
    port = registry.port
    home.captured["victim"] = capture(registry.target, "victim")  # version 1, signed
    home.captured["fresh"] = capture(registry.target, "fresh")
    assert home.captured["victim"].version == 1 and home.captured["victim"].directive
    home.cli("publish", tiny_release_b, "--name", "tiny")  # version 2
    home.edge = edge = home.start_edge("victim", port, until="live")
    wait_for(lambda: served(edge) == 2, 60, "the edge serving version 2")
    registry.stop()

    rogue = RogueRegistry(home.captured, {})
    server = rogue_on(port, rogue)
    try:
        def refusals() -> list[str]:  # a refusal is its own ack state, never retried
            return rogue.reasons("victim", pb.REFUSED)

        wait_for(lambda: bool(refusals()), 60, "the edge's answer to the replay")
        (reason,) = refusals()
        assert "older than seq" in reason and rogue.reasons("victim") == []
        assert served(edge) == 2 and not (home.root / "victim" / "tiny" / "1").exists()
        answer = httpx.post(f"{edge.url}/v2/models/tiny/infer", timeout=10, content=json.dumps(
            {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["ok"]}]}))
        assert answer.status_code == 200 and answer.json()["model_version"] == "2"
        edge.stop()  # a restarted node keeps its floor (<store>/.directives.json)
        home.edge = edge = home.start_edge("victim", port)
        wait_for(lambda: len(refusals()) == 2, 60, "the answer after a restart")
        assert "older than seq" in refusals()[1] and served(edge) == 2
    finally:
        server.stop(None)

    home.start_registry(port=port)
    home.cli("rollback", "tiny")  # production -> version 1: a new audit record, a higher seq
    wait_for(lambda: served(edge) == 1, 60, "the edge rolled back by the real registry")
    statuses = {r["node"]: r for r in home.cli("status", "--json").json()}
    assert statuses["victim"]["version"] == 1 and statuses["victim"]["state"] == "ACTIVE"


def test_a_rogue_flooding_a_download_never_gets_its_release_activated(home: Home) -> None:
    """``fresh`` has accepted nothing yet, so the captured directive is good; the artifacts
    the rogue streams never fit their signed sizes."""
    assert home.registry is not None
    port = home.registry.port
    home.registry.stop()
    manifest = json.loads(home.captured["fresh"].manifest)
    sizes = {manifest[r]["sha256"]: manifest[r]["size"] for r in ("edge", "tokenizer", "probe")}
    rogue = RogueRegistry(home.captured, sizes)
    server = rogue_on(port, rogue)
    fresh = None
    try:
        fresh = home.start_edge("fresh", port, until="live")
        wait_for(lambda: len(rogue.reasons("fresh")) >= 2, 60, "two failed attempts")
        assert all("runs past the artifact" in r for r in rogue.reasons("fresh"))
        assert rogue.reasons("fresh", pb.DOWNLOADING) and not rogue.reasons("fresh", pb.ACTIVE)
        assert served(fresh) is None and not (home.root / "fresh" / "tiny").exists()
        for part in (home.root / "fresh" / ".downloads").iterdir():
            assert part.stat().st_size <= max(sizes.values()), part
    finally:
        if fresh is not None:
            fresh.stop()
        server.stop(None)


def test_deleting_the_newest_audit_records_is_found(home: Home) -> None:
    cli = home.cli
    before = cli("audit", "--verify", "--json").json()
    assert before["ok"] and before["head"]["seq"] == before["checked"]
    conn = sqlite3.connect(cli.home / "registry.sqlite3")
    conn.executescript("""
        DROP TRIGGER audit_no_delete;
        DELETE FROM audit WHERE seq > (SELECT MAX(seq) - 2 FROM audit);
        CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit
        BEGIN SELECT RAISE(ABORT, 'audit log is append-only'); END;""")
    conn.close()
    after = cli("audit", "--verify", "--json", check=False)
    assert after.code == 1 and after.json()["first_bad"] is None  # the chain itself is whole
    assert "truncated" in after.json()["head_problem"]
    assert (cli.home / anchor.FILE).is_file()
