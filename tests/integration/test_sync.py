"""Model sync end to end: a real ``registry serve``, one center and two edges on loopback.

The tests share one fleet and run in file order, each starting from where the previous one
left the registry (the version numbers in the comments).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from harness.processes import RegistryProcess, start_registry
from registry.store.blobs import BlobStore
from serving.config.tokens import node_token
from sync.gen import sync_pb2 as pb
from sync.gen import sync_pb2_grpc as pb_grpc
from tests import streams
from tests.conftest import TEST_FLOOR, RegistryCli
from tests.faults import CutProxy
from tests.servers import Server, start

pytestmark = [pytest.mark.integration, pytest.mark.slow]
TOKEN = "test-token-0123456789"
CHUNK = 64 * 1024
REGISTRY_ENV = {"REGISTRY_REPORT_INTERVAL_S": "0.5", "REGISTRY_CHUNK_BYTES": str(CHUNK),
                "REGISTRY_REFUSAL_INTERVAL_S": "0.5"}
SYNC_FLAGS = ("--sync-backoff-max-s", "1")
BODY = json.dumps({"inputs": [{"name": "text", "shape": [3], "datatype": "BYTES",
                               "data": ["a great film", "dull", "not bad at all"]}]})


@dataclass
class Fleet:
    root: Path
    cli: RegistryCli
    registry: RegistryProcess
    center: Server
    edges: list[Server]
    extra: list[Server] = field(default_factory=list)

    @property
    def nodes(self) -> list[Server]:
        return [self.center, *self.edges]

    def start_node(self, tier: str, store: Path, *flags: str,
                   registry: str | None = None) -> Server:
        server = start(tier, store, self.root, "--registry", registry or self.registry.target,
                       *SYNC_FLAGS, *flags, registry_secret=TOKEN)
        self.extra.append(server)
        return server

    def restart_registry(self) -> None:
        self.registry.stop()
        self.registry = start_registry(self.cli.home, self.root, TOKEN, port=self.registry.port,
                                       env=REGISTRY_ENV)


def node_id(server: Server) -> str:
    return f"{server.tier}-{server.port}"


def served(server: Server) -> int | None:
    """The version a node serves by default (None: nothing loaded yet)."""
    try:
        response = httpx.get(f"{server.url}/v2/models/tiny/ready", timeout=5)
    except httpx.HTTPError:
        return None
    return int(response.json()["version"]) if response.status_code == 200 else None


def wait_for(condition: Callable[[], bool], timeout: float = 60, what: str = "",
             poll: float = 0.05) -> float:
    """Poll until ``condition()``, every ``poll`` s; return the seconds it took."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if condition():
            return time.monotonic() - started
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or condition}")


def all_serve(servers: list[Server], version: int) -> Callable[[], bool]:
    return lambda: all(served(s) == version for s in servers)


def status(cli: RegistryCli) -> dict[str, dict[str, Any]]:
    return {row["node"]: row for row in cli("status", "--json").json()}


def metric(url: str, name: str, **labels: str) -> float:
    """Sum of a Prometheus series' samples whose labels include ``labels``."""
    total = 0.0
    for line in httpx.get(url, timeout=5).text.splitlines():
        match = re.fullmatch(rf"{name}(?:{{(.*)}})? (\S+)", line)
        if match and all(f'{k}="{v}"' in (match.group(1) or "") for k, v in labels.items()):
            total += float(match.group(2))
    return total


def node_metric(server: Server, name: str) -> float:
    return metric(f"{server.url}/metrics", f"{server.tier}_{name}_total")


def edge_artifact_bytes(cli: RegistryCli, version: int) -> int:
    manifest = cli("show", f"tiny@{version}", "--json").json()["manifest"]
    return int(sum(manifest[role]["size"] for role in ("edge", "tokenizer", "probe")))


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, tiny_release: Path) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("fleet")
    # releases fetched whole (test_chunks has the chunked path): the offsets, sizes and
    # damaged blobs here are those of whole files
    cli = RegistryCli(root / "registry", {"REGISTRY_CHUNKING": "false"})
    cli("publish", tiny_release, "--name", "tiny")  # version 1
    registry = start_registry(cli.home, root, TOKEN, env=REGISTRY_ENV)
    fleet = Fleet(root, cli, registry, None, [])  # type: ignore[arg-type]
    try:
        # empty stores: each node becomes ready only once sync has installed version 1
        fleet.center = start("center", root / "center", root, "--registry", registry.target,
                             *SYNC_FLAGS, registry_secret=TOKEN)
        for region in ("eu", "us"):
            fleet.edges.append(start("edge", root / f"edge-{region}", root, "--registry",
                                     registry.target, "--region", region, "--center-url",
                                     fleet.center.url, *SYNC_FLAGS, registry_secret=TOKEN))
        yield fleet
    finally:
        for server in [*fleet.extra, *fleet.edges, *([fleet.center] if fleet.center else [])]:
            server.stop()
        fleet.registry.stop()


def test_nodes_subscribe_and_install_from_empty_stores(fleet: Fleet) -> None:
    assert all(served(s) == 1 for s in fleet.nodes)
    rows = status(fleet.cli)
    for server in fleet.nodes:
        row = rows[node_id(server)]
        assert (row["tier"], row["version"], row["state"], row["connected"]) == \
            (server.tier, 1, "ACTIVE", True)
        # each node measured the release probe on its own hardware before serving it
        assert row["fidelity_version"] == 1 and row["fidelity_rows"] == 200
        assert row["fidelity"] >= (0.99 if server.tier == "center" else TEST_FLOOR)
        assert isinstance(row["cpu_features"], list) and row["machine"] and row["runtime"]
    assert rows[node_id(fleet.edges[0])]["region"] == "eu"
    assert metric(fleet.registry.metrics_url, "registry_sync_nodes_connected") == 3
    # each node fetched only its tier's artifact: edges the INT8 ONNX, the center TorchScript
    manifest = fleet.cli("show", "tiny@1", "--json").json()["manifest"]
    for store, tier in (("edge-eu", "edge"), ("center", "center")):
        files = sorted(p.name for p in (fleet.root / store / "tiny" / "1").iterdir())
        assert files == sorted([manifest[tier]["file"], "release.json", "release.sig",
                                "tokenizer.json", "probe.npz"])


def test_publish_reaches_every_node_and_each_ack_is_audited(fleet: Fleet,
                                                            tiny_release_b: Path) -> None:
    fleet.cli("publish", tiny_release_b, "--name", "tiny")  # version 2: new artifacts
    wait_for(all_serve(fleet.nodes, 2), what="every node on version 2")
    answer = httpx.post(f"{fleet.edges[0].url}/v2/models/tiny/infer", content=BODY, timeout=10)
    assert answer.json()["model_version"] == "2"
    acks = [r for r in fleet.cli("audit", "--model", "tiny", "--json").json()
            if r["action"] == "ack" and r["version"] == 2]
    states = {(r["actor"], json.loads(r["payload"])["state"]) for r in acks}
    for server in fleet.nodes:
        assert (f"node:{node_id(server)}", "DOWNLOADING") in states
        assert (f"node:{node_id(server)}", "ACTIVE") in states
    fleet.cli("audit", "--verify")


def test_stores_keep_the_active_and_previous_version_and_reuse_local_bytes(
        fleet: Fleet, tiny_release: Path) -> None:
    edge = fleet.edges[0]
    received = node_metric(edge, "sync_bytes_received")
    fleet.cli("publish", tiny_release, "--name", "tiny")  # version 3: version 1's files
    wait_for(all_serve(fleet.nodes, 3), what="every node on version 3")
    assert fleet.cli("status", "--json").json()
    for store in ("center", "edge-eu", "edge-us"):
        assert sorted(p.name for p in (fleet.root / store / "tiny").iterdir()) == \
            ["2", "3", "CURRENT"]
    # version 1's files were still on disk when 3 arrived: copied, not downloaded again
    assert node_metric(edge, "sync_bytes_received") == received
    assert node_metric(edge, "sync_bytes_reused") >= edge_artifact_bytes(fleet.cli, 3)


def test_canary_reaches_only_its_node_until_promoted(fleet: Fleet, tiny_release_b: Path) -> None:
    canary, other = fleet.edges
    fleet.cli("publish", tiny_release_b, "--name", "tiny", "--canary", node_id(canary))  # v4
    wait_for(lambda: served(canary) == 4, what="the canary on version 4")
    time.sleep(1.5)  # well past the push delay: the others must not have moved
    assert served(other) == 3 and served(fleet.center) == 3
    rows = status(fleet.cli)
    assert rows[node_id(other)]["desired"] == 3 and not rows[node_id(other)]["lagging"]
    assert rows[node_id(canary)]["desired"] == 4
    fleet.cli("promote", "tiny")
    wait_for(all_serve(fleet.nodes, 4), what="every node on version 4 after promote")


def test_corrupted_artifact_is_never_activated_and_is_retried(fleet: Fleet) -> None:
    # production is version 4; a new edge starts with version 1 pulled into its store
    store = fleet.root / "edge-corrupt"
    fleet.cli("pull", "tiny@1", "--tier", "edge", "--store", store)
    manifest = fleet.cli("show", "tiny@4", "--json").json()["manifest"]
    blob = BlobStore(fleet.cli.home / "blobs").path(manifest["edge"]["sha256"])
    original = blob.read_bytes()
    damaged = bytearray(original)
    damaged[len(damaged) // 2] ^= 0xFF  # one flipped bit-pattern, same size: only sha256 sees it
    blob.write_bytes(bytes(damaged))
    try:
        edge = fleet.start_node("edge", store)
        wait_for(lambda: node_metric(edge, "sync_corrupt_downloads") >= 2, 30,
                 "two corrupt downloads (the first try and a retry)")
        assert served(edge) == 1  # still serving what it had
        assert not (store / "tiny" / "4").exists()
        # the node keeps retrying (acking DOWNLOADING each time): catch it between tries
        rows: list[dict[str, Any]] = []
        wait_for(lambda: rows.append(status(fleet.cli)[node_id(edge)]) or
                 rows[-1]["state"] == "FAILED", 30, "the FAILED ack between retries")
        row = rows[-1]
        assert row["state"] == "FAILED" and "sha256" in row["reason"]
        assert row["version"] == 1 and row["lagging"]
    finally:
        blob.write_bytes(original)
    wait_for(lambda: served(edge) == 4, 30, "the retry after the blob was repaired")
    assert status(fleet.cli)[node_id(edge)]["state"] == "ACTIVE"


def test_a_cut_stream_resumes_from_its_offset(fleet: Fleet) -> None:
    proxy = CutProxy(fleet.registry.port)
    try:
        size = edge_artifact_bytes(fleet.cli, 4)
        sent_before = metric(fleet.registry.metrics_url, "registry_sync_bytes_sent_total")
        proxy.cut_after(size // 2)
        edge = fleet.start_node("edge", fleet.root / "edge-cut",
                                registry=f"127.0.0.1:{proxy.port}")
        assert served(edge) == 4 and proxy.cuts == 1
        assert node_metric(edge, "sync_fetch_resumed") >= 1
        received = node_metric(edge, "sync_bytes_received")
        assert size <= received <= size + CHUNK  # re-received at most one chunk
        sent = metric(fleet.registry.metrics_url, "registry_sync_bytes_sent_total") - sent_before
        print(f"artifact {size} B, registry sent {sent:.0f} B ({sent - size:.0f} re-sent), "
              f"node received {received:.0f} B")
        assert metric(fleet.registry.metrics_url, "registry_sync_fetches_total",
                      resumed="true") >= 1
        edge.stop()  # its proxy goes away with this test
    finally:
        proxy.close()


def test_rollback_propagates_from_local_stores(fleet: Fleet) -> None:
    received = [node_metric(s, "sync_bytes_received") for s in fleet.nodes]
    fleet.cli("rollback", "tiny")  # production 4 -> 3; 3 is still on every disk
    wait_for(all_serve(fleet.nodes, 3), what="every node back on version 3")
    assert [node_metric(s, "sync_bytes_received") for s in fleet.nodes] == received


def test_swap_under_continuous_load_fails_no_request(fleet: Fleet, tiny_release: Path) -> None:
    edge = fleet.edges[1]
    results: list[tuple[int, str]] = []
    stop = threading.Event()

    def client() -> None:
        with httpx.Client(timeout=30) as http:
            while not stop.is_set():
                r = http.post(f"{edge.url}/v2/models/tiny/infer", content=BODY)
                results.append((r.status_code, r.json().get("model_version", r.text)))

    workers = [threading.Thread(target=client) for _ in range(4)]
    for w in workers:
        w.start()
    try:
        time.sleep(0.5)
        fleet.cli("publish", tiny_release, "--name", "tiny")  # version 5
        wait_for(lambda: served(edge) == 5, what="the edge on version 5")
        time.sleep(0.5)
    finally:
        stop.set()
        for w in workers:
            w.join()
    assert [r for r in results if r[0] != 200] == []
    assert {"3", "5"} <= {version for _, version in results}


def test_registry_down_at_start_then_catch_up(fleet: Fleet) -> None:
    store = fleet.root / "edge-autonomous"
    fleet.cli("pull", "tiny@1", "--tier", "edge", "--store", store)
    fleet.registry.stop()
    edge = fleet.start_node("edge", store)  # the registry is down: serves its store
    assert served(edge) == 1
    answer = httpx.post(f"{edge.url}/v2/models/tiny/infer", content=BODY, timeout=10)
    assert answer.status_code == 200 and answer.json()["model_version"] == "1"
    fleet.restart_registry()
    wait_for(all_serve([*fleet.nodes, edge], 5), what="every node, new edge too, on 5")


def test_quality_reports_reach_status_and_metrics(fleet: Fleet) -> None:
    """The escalation rate the registry shows is the share of rows the edge really sent to
    the center: every request here escalates the same rows (a threshold between the edge's
    confidences), so each report window holds exactly that share."""
    edge = fleet.edges[0]
    url = f"{edge.url}/v2/models/tiny/infer"
    request = json.loads(BODY)

    def answer(threshold: float) -> dict[str, list[Any]]:
        response = httpx.post(url, json={**request, "parameters": {"threshold": threshold}},
                              timeout=10)
        assert response.status_code == 200, response.text
        return {o["name"]: o["data"] for o in response.json()["outputs"]}

    confidence = sorted(answer(0)["confidence"])  # the edge's own, nothing escalated
    gaps = [(low + high) / 2 for low, high in pairwise(confidence) if low < high]
    threshold = gaps[0] if gaps else 1.0  # escalates the least confident row(s) only
    tiers = answer(threshold)["tier"]
    expected = tiers.count("center") / len(tiers)
    assert 0 < expected < 1 or not gaps, tiers
    assert set(tiers) <= {"edge", "center"}, tiers  # the center answers: nothing degraded

    def reported() -> bool:  # by this registry process (its metrics start empty)
        assert answer(threshold)["tier"] == tiers  # the same rows escalate every time
        rate = metric(fleet.registry.metrics_url, "registry_node_escalation_rate",
                      node=node_id(edge))
        # the first window may still hold the nothing-escalated request above
        return metric(fleet.registry.metrics_url, "registry_node_requests_total",
                      node=node_id(edge)) > 0 and abs(rate - expected) < 1e-9

    wait_for(reported, 30, f"a quality report from the edge with escalation rate {expected}")
    assert metric(fleet.registry.metrics_url, "registry_node_p99_seconds",
                  node=node_id(edge)) > 0
    assert metric(fleet.registry.metrics_url, "registry_node_degraded_rate",
                  node=node_id(edge)) == 0
    row = status(fleet.cli)[node_id(edge)]
    assert row["escalation_rate"] == pytest.approx(expected, abs=1e-9)
    assert row["p99_ms"] > 0 and row["requests"] > 0
    table = fleet.cli("status").stdout
    assert node_id(edge) in table and "(offline)" in table  # the cut-stream edge was stopped
    assert re.search(r"lagging .*edge-", table)


def _stub(fleet: Fleet) -> tuple[grpc.Channel, pb_grpc.SyncStub]:
    channel = grpc.insecure_channel(fleet.registry.target)
    return channel, pb_grpc.SyncStub(channel)


def test_wrong_token_is_refused_and_audited(fleet: Fleet) -> None:
    channel, stub = _stub(fleet)
    with channel:
        request = pb.FetchRequest(sha256="0" * 64)
        for metadata in ([("authorization", "Bearer wrong")], []):
            with pytest.raises(grpc.RpcError) as refused:
                list(stub.Fetch(request, metadata=metadata, timeout=5))
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        hello = pb.NodeMessage(hello=pb.Hello(node_id="intruder", tier="edge", region="local"))
        with pytest.raises(grpc.RpcError) as refused:
            list(stub.Sync(iter([hello]), metadata=[("authorization", "Bearer nope")],
                           timeout=5))
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        health = health_pb2_grpc.HealthStub(channel)  # open: Consul's checks send no token
        assert health.Check(health_pb2.HealthCheckRequest(), timeout=5).status == \
            health_pb2.HealthCheckResponse.SERVING

    def refused() -> int:  # audited in aggregate: one record per interval
        rows = [r for r in fleet.cli("audit", "--json").json() if r["action"] == "auth-denied"]
        return sum(json.loads(r["payload"])["count"] for r in rows)

    wait_for(lambda: refused() >= 3, 30, "the aggregate auth-denied record")
    assert "intruder" not in status(fleet.cli)
    assert metric(fleet.registry.metrics_url, "registry_auth_failures_total") >= 3


def test_fetch_rejects_bad_requests_cleanly(fleet: Fleet) -> None:
    manifest = fleet.cli("show", "tiny@1", "--json").json()["manifest"]
    sha, size = manifest["edge"]["sha256"], manifest["edge"]["size"]
    channel, stub = _stub(fleet)
    auth = [("authorization", f"Bearer {node_token(TOKEN, 'fetcher', 'edge', 'local')}")]
    cases = [(pb.FetchRequest(sha256="not-a-digest"), grpc.StatusCode.INVALID_ARGUMENT),
             (pb.FetchRequest(sha256="ab" * 32), grpc.StatusCode.NOT_FOUND),
             (pb.FetchRequest(sha256=sha, offset=size + 1), grpc.StatusCode.OUT_OF_RANGE),
             (pb.FetchRequest(sha256=sha, offset=-1), grpc.StatusCode.OUT_OF_RANGE)]
    with channel, streams.stream(fleet.registry.target, TOKEN, "fetcher") as held:
        assert held.next().WhichOneof("kind") == "welcome"  # Fetch serves what was pushed
        for request, code in cases:
            with pytest.raises(grpc.RpcError) as failed:
                list(stub.Fetch(request, metadata=auth, timeout=5))
            assert failed.value.code() == code, request
        tail = list(stub.Fetch(pb.FetchRequest(sha256=sha, offset=size - 10), metadata=auth,
                               timeout=5))
        assert [(c.offset, len(c.data), c.size) for c in tail] == [(size - 10, 10, size)]
        master = [("authorization", f"Bearer {TOKEN}")]  # the registry's secret opens nothing
        with pytest.raises(grpc.RpcError) as failed:
            list(stub.Fetch(pb.FetchRequest(sha256=sha), metadata=master, timeout=5))
        assert failed.value.code() == grpc.StatusCode.UNAUTHENTICATED
        bad_hello = pb.NodeMessage(hello=pb.Hello(node_id="../etc", tier="edge"))
        with pytest.raises(grpc.RpcError) as failed:
            list(stub.Sync(iter([bad_hello]), metadata=auth, timeout=5))
        assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and the registry's name (which nodes check), and its key,
    PEM files."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tiered-registry")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                 x509.DNSName("registry.tiered.invalid")]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = folder / "registry.crt", folder / "registry.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def test_tls_registry_serves_nodes_that_trust_its_certificate(fleet: Fleet) -> None:
    cert, key = self_signed(fleet.root)
    secure = start_registry(fleet.cli.home, fleet.root, TOKEN, "--tls-cert", str(cert),
                            "--tls-key", str(key), ca=cert)
    try:
        production = fleet.cli("list", "--json").json()[0]["production"]
        edge = fleet.start_node("edge", fleet.root / "edge-tls", "--registry-ca", str(cert),
                                registry=secure.target)
        assert served(edge) == production
        with grpc.insecure_channel(secure.target) as plaintext:
            with pytest.raises(grpc.RpcError) as refused:
                health_pb2_grpc.HealthStub(plaintext).Check(health_pb2.HealthCheckRequest(),
                                                            timeout=3)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        secure.stop()
