"""Who may talk to whom: each node proves its own id to the registry, secrets never come from
a command line, a token is only sent to a registry that proved itself, and escalations only go
to centers that prove they are centers. Every attack runs against real processes on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import subprocess
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any, ClassVar

import grpc
import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from harness.processes import BIN, free_port, start_registry, start_tier
from registry.trust import pki
from serving.config import bundle as bundles
from serving.config.tokens import TokenVerifier, node_token, parse
from sync.gen import sync_pb2 as pb
from sync.gen import sync_pb2_grpc as pb_grpc
from tests import streams
from tests.conftest import RegistryCli
from tests.faults import JsonHandler, http_peer
from tests.integration.test_sync import wait_for
from tests.servers import start
from tiered.stack import Stack

pytestmark = pytest.mark.integration
SECRET = "identity-secret-0123456789"
SYNC = ("--sync-backoff-max-s", "1")


def status(cli: RegistryCli) -> dict[str, dict[str, Any]]:
    return {row["node"]: row for row in cli("status", "--json").json()}


def connected(server: Any) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=5).text
    line = next(x for x in text.splitlines() if x.startswith(f"{server.tier}_sync_connected "))
    return float(line.split()[-1])


# -- finding 4: an empty or short secret --------------------------------------------------


@pytest.mark.parametrize("secret", ["", "short-secret"])
def test_registry_serve_refuses_an_empty_or_short_secret(tmp_path: Path, secret: str) -> None:
    result = subprocess.run([str(BIN / "registry"), "--home", str(tmp_path), "serve",
                             "--port", str(free_port())], capture_output=True, text=True,
                            timeout=60, env={"PATH": str(BIN), "REGISTRY_TOKEN": secret})
    assert result.returncode != 0
    assert "at least 16 characters" in result.stderr


def test_a_node_refuses_a_token_that_is_not_its_own(tmp_path: Path) -> None:
    for token, message in (("", "not a node token"),
                           (node_token(SECRET, "edge-other", "edge", "local"), "edge-other"),
                           (f"edge-me.1.{'ab' * 32}", "made before tiers and regions were in "
                                                      "tokens: re-provision with `registry node "
                                                      "provision edge-me"),
                           (node_token(SECRET, "edge-me", "edge", "us"), "region 'us'")):
        result = subprocess.run([str(BIN / "edge"), "--node-id", "edge-me", "--store",
                                 str(tmp_path), "--registry", "127.0.0.1:9"],
                                capture_output=True, text=True, timeout=60,
                                env={"PATH": str(BIN), "REGISTRY_TOKEN": token})
        assert result.returncode == 2 and message in result.stderr, result.stderr


# -- finding 11: secrets never on a command line --------------------------------------------


@pytest.mark.parametrize("command", [["edge"], ["center"], ["registry", "serve"],
                                     ["python", "-m", "nginx.render"]])
def test_no_command_takes_a_secret_as_a_flag(command: list[str]) -> None:
    result = subprocess.run([str(BIN / command[0]), *command[1:], "--help"],
                            capture_output=True, text=True, timeout=60,
                            env={"PATH": str(BIN), "COLUMNS": "200"})
    flags = {word.rstrip(",") for word in result.stdout.split() if word.startswith("--")}
    assert not {f for f in flags if "token" in f and not f.endswith("-file")}, flags
    if command[0] in ("edge", "center"):
        assert {"--registry-token-file", "--consul-http-token-file"} <= flags
    if command[0] == "python":
        assert "--consul-token-file" in flags


def test_a_node_reads_its_token_from_a_file(tmp_path: Path, tiny_release: Path) -> None:
    cli = RegistryCli(tmp_path / "registry")
    cli("publish", tiny_release, "--name", "tiny")
    registry = start_registry(cli.home, tmp_path, SECRET)
    token_file = tmp_path / "edge.token"
    env = {**cli.env(), "REGISTRY_TOKEN": SECRET}
    subprocess.run([str(BIN / "registry"), "node", "token", "edge-file", "--tier", "edge",
                    "--region", "local", "--out", str(token_file)], check=True, env=env,
                   capture_output=True, timeout=60)
    assert token_file.stat().st_mode & 0o777 == 0o600
    try:
        edge = start_tier("edge", tmp_path / "edge", tmp_path, "--registry", registry.target,
                          "--node-id", "edge-file", "--registry-token-file", str(token_file),
                          *SYNC, env={"PATH": str(BIN)})
        try:
            assert "edge-file" in status(cli)  # subscribed (ready = version 1 installed)
            cmdline = Path(f"/proc/{edge.pid}/cmdline").read_bytes()
            assert token_file.read_text().strip().encode() not in cmdline
        finally:
            edge.stop()
    finally:
        registry.stop()


# -- finding 6: one identity per node ------------------------------------------------------


def test_a_node_cannot_connect_ack_or_report_as_another(tmp_path: Path,
                                                      tiny_release: Path) -> None:
    cli = RegistryCli(tmp_path / "registry")
    cli("publish", tiny_release, "--name", "tiny")
    registry = start_registry(cli.home, tmp_path, SECRET, env={"REGISTRY_REPORT_INTERVAL_S":
                                                               "0.5"})
    try:
        edge = start("edge", tmp_path / "edge", tmp_path, "--registry", registry.target,
                     "--region", "eu", *SYNC, registry_secret=SECRET)
        victim = edge.node_id
        wait_for(lambda: bool(status(cli).get(victim, {}).get("connected")), 20, "the edge online")
        before = status(cli)[victim]
        with grpc.insecure_channel(registry.target) as channel:
            stub = pb_grpc.SyncStub(channel)
            hello = pb.NodeMessage(hello=pb.Hello(node_id=victim, tier="center", region="us"))
            forged = [hello, pb.NodeMessage(report=pb.QualityReport(
                model="tiny", version=1, requests=10**9))]
            for credential, code in ((node_token(SECRET, "mallory", "edge", "eu"),
                                      grpc.StatusCode.PERMISSION_DENIED),
                                     (SECRET, grpc.StatusCode.UNAUTHENTICATED)):
                with pytest.raises(grpc.RpcError) as refused:
                    list(stub.Sync(iter(forged), timeout=5,
                                   metadata=[("authorization", f"Bearer {credential}")]))
                assert refused.value.code() == code
        time.sleep(1.5)  # three report intervals: a forged stream would have shown by now
        after = status(cli)[victim]
        assert connected(edge) == 1 and after["connected"]
        assert (after["tier"], after["region"]) == ("edge", "eu") == (before["tier"],
                                                                       before["region"])
        assert (after["requests"] or 0) < 10**9
        assert "mallory" not in status(cli)
        assert "connected again" not in registry.log.read_text()

        # revoking the node's token closes its stream and keeps it out
        cli("node", "revoke", victim)
        wait_for(lambda: connected(edge) == 0, 20, "the revoked edge's stream closed")
        time.sleep(2)  # it retries (backoff <= 1 s) with its old token: refused every time
        assert connected(edge) == 0 and not status(cli)[victim]["connected"]
        actions = [r["action"] for r in cli("audit", "--json").json()]
        assert "revoke-node-token" in actions
        edge.stop()
    finally:
        registry.stop()


# -- finding 2: the token only goes to a registry that proved itself -----------------------


class Recorder(grpc.GenericRpcHandler):
    """A fake registry: records the metadata of every call, implements nothing."""

    def __init__(self) -> None:
        self.calls: list[dict[str, str]] = []

    def service(self, details: grpc.HandlerCallDetails) -> None:
        self.calls.append({k: str(v) for k, v in details.invocation_metadata or ()})
        return None


@pytest.fixture
def consul(tmp_path: Path) -> Iterator[Stack]:
    """A real Consul dev agent without ACLs (or an attacker holding a token that may write):
    the attacker can register anything, and these controls must hold anyway."""
    stack = Stack(tmp_path / "consul", tmp_path / "home", SECRET, consul_port=free_port(),
                  consul_acl=False)
    try:
        stack.start_consul()
        yield stack
    finally:
        stack.stop()


def register(consul: Stack, name: str, service_id: str, port: int) -> None:
    httpx.put(f"http://{consul.consul}/v1/agent/service/register", timeout=5,
              json={"Name": name, "ID": service_id, "Address": "127.0.0.1",
                    "Port": port}).raise_for_status()


def test_the_token_never_reaches_a_registry_found_in_consul_without_tls(
        tmp_path: Path, consul: Stack) -> None:
    recorder, port = Recorder(), free_port()
    fake = grpc.server(futures.ThreadPoolExecutor(4), handlers=[recorder])
    fake.add_insecure_port(f"127.0.0.1:{port}")
    fake.start()
    register(consul, "tiered-registry", "aaa-first-registry", port)
    tls = tmp_path / "tls"
    pki.fleet(tls, ["127.0.0.1"])
    nodes = []
    try:
        env = {"PATH": str(BIN), "CONSUL_HTTP_ADDR": consul.consul}
        # no CA: a Consul-listed registry is not used at all
        nodes.append(start_tier("edge", tmp_path / "a", tmp_path, *SYNC, env=env,
                                registry_secret=SECRET, until="live"))
        wait_for(lambda: "not syncing" in nodes[0].log.read_text(), 20, "the refusal logged")
        # the fleet CA: the handshake with the impostor fails before any metadata is sent
        nodes.append(start_tier("edge", tmp_path / "b", tmp_path, *SYNC, "--registry-ca",
                                str(tls / "ca.pem"), env=env, registry_secret=SECRET,
                                until="live"))
        wait_for(lambda: "registry 127.0.0.1" in nodes[1].log.read_text(), 30,
                 "the edge trying the listed registry")
        time.sleep(2)
        assert recorder.calls == []
        # the same recorder does see a token a node is configured to send it (the control)
        nodes.append(start_tier("edge", tmp_path / "c", tmp_path, "--registry",
                                f"127.0.0.1:{port}", *SYNC, env={"PATH": str(BIN)},
                                registry_secret=SECRET, until="live"))
        wait_for(lambda: bool(recorder.calls), 20, "the configured registry called")
        assert recorder.calls[0]["authorization"].startswith("Bearer edge-")
    finally:
        for node in nodes:
            node.stop()
        fake.stop(None)


# -- finding 3: escalations only to centers that prove they are centers ---------------------


class ForgedCenter(JsonHandler):
    bodies: ClassVar[list[bytes]] = []

    def do_POST(self) -> None:
        self.bodies.append(self.rfile.read(int(self.headers["content-length"])))
        self.reply(200, {"model_name": "tiny", "model_version": "666", "outputs": [
            {"name": "probabilities", "datatype": "FP32", "shape": [1, 2],
             "data": [1.0, 0.0]}]})


ESCALATE = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES",
                        "data": ["a film"]}], "parameters": {"threshold": 1}}


def tiers(answer: dict[str, Any]) -> list[str]:
    return list(next(o["data"] for o in answer["outputs"] if o["name"] == "tier"))


def test_escalations_go_only_to_centers_with_a_center_certificate(
        tmp_path: Path, tiny_release: Path, consul: Stack) -> None:
    cli = RegistryCli(tmp_path / "registry")
    cli("publish", tiny_release, "--name", "tiny")
    for tier in ("center", "edge"):
        cli("pull", "tiny", "--tier", tier, "--store", tmp_path / tier)
    tls = tmp_path / "tls"
    pki.fleet(tls, ["127.0.0.1"])
    ForgedCenter.bodies = []
    peers = contextlib.ExitStack()
    plain = peers.enter_context(http_peer(ForgedCenter))  # anyone can serve HTTP
    impostor = peers.enter_context(http_peer(  # the fleet CA's, but not a center's certificate
        ForgedCenter, (tls / "registry.pem", tls / "registry.key")))
    for i, fake in enumerate((plain, impostor)):
        register(consul, "tiered-center", f"aaa-fake-{i}", fake.server_address[1])
    # the real center's own certificate: discovered centers are checked for their node name
    cert, key = pki.node(tls, "real-center", "center", "local", ("127.0.0.1",))
    (tls / "real-center.pem").write_bytes(cert)
    (tls / "real-center.key").write_bytes(key)
    center = start("center", tmp_path / "center", tmp_path, "--tls-cert",
                   str(tls / "real-center.pem"), "--tls-key", str(tls / "real-center.key"),
                   ca=tls / "ca.pem")
    edge = start("edge", tmp_path / "edge", tmp_path, "--center-ca", str(tls / "ca.pem"),
                 "--cache-size", "0", "--breaker-failures", "100",
                 env={"CONSUL_HTTP_ADDR": consul.consul})
    try:
        url = f"{edge.url}/v2/models/tiny/infer"
        wait_for(lambda: "tiered-center passing" in edge.log.read_text(), 20,
                 "the edge following Consul's centers")
        for _ in range(4):  # round-robin: every listed fake gets its turn
            answer = httpx.post(url, json=ESCALATE, timeout=10).json()
            assert "666" not in json.dumps(answer)
            assert tiers(answer) == ["edge-degraded"]
        assert ForgedCenter.bodies == []  # not one user's input reached either impostor
        # the real center (a center certificate from the fleet CA) is used once listed
        register(consul, "tiered-center", "real-center", center.port)
        wait_for(lambda: tiers(httpx.post(url, json=ESCALATE, timeout=10).json()) == ["center"],
                 30, "an escalation answered by the real center")
        assert ForgedCenter.bodies == []
    finally:
        edge.stop()
        center.stop()
        peers.close()


def test_grpc_escalations_go_only_to_centers_with_a_center_certificate(
        tmp_path: Path, tiny_release: Path) -> None:
    """``grpcs://`` centers with ``--center-ca``: the TLS handshake checks the center role, so
    a real center process holding the registry's certificate (same CA) gets no rows."""
    from harness.stores import fill_stores

    fill_stores(tmp_path, tiny_release)
    tls = tmp_path / "tls"
    pki.fleet(tls, ["127.0.0.1"])
    ports = {"center": free_port(), "registry": free_port()}
    centers = {role: start("center", tmp_path / "center", tmp_path, "--tls-cert",
                           str(tls / f"{role}.pem"), "--tls-key", str(tls / f"{role}.key"),
                           "--grpc-port", str(port), "--access-log", "true", ca=tls / "ca.pem")
               for role, port in ports.items()}
    urls = ",".join(f"grpcs://127.0.0.1:{ports[role]}" for role in ("registry", "center"))
    edge = start("edge", tmp_path / "edge", tmp_path, "--center-ca", str(tls / "ca.pem"),
                 "--center-url", urls, "--cache-size", "0")
    try:
        for _ in range(4):  # round-robin: the impostor comes first every other call
            answer = httpx.post(f"{edge.url}/v2/models/tiny/infer", json=ESCALATE,
                                timeout=10).json()
            assert tiers(answer) == ["center"] and answer["parameters"]["center_version"] == "1"
        assert "grpc ModelInfer" in centers["center"].log.read_text()
        assert "grpc ModelInfer" not in centers["registry"].log.read_text()
    finally:
        edge.stop()
        for center in centers.values():
            center.stop()


# -- per-node limits ------------------------------------------------------------------------


def test_one_node_cannot_hold_more_than_its_share_of_fetches(tmp_path: Path,
                                                             tiny_release: Path) -> None:
    cli = RegistryCli(tmp_path / "registry")
    cli("publish", tiny_release, "--name", "tiny")
    manifest = cli("show", "tiny@1", "--json").json()["manifest"]
    sha = manifest["center"]["sha256"]  # megabytes in 1 KiB chunks: a stream stays in flight
    registry = start_registry(cli.home, tmp_path, SECRET, env={
        "REGISTRY_FETCHES_PER_NODE": "2", "REGISTRY_CHUNK_BYTES": "1024"})
    try:
        with grpc.insecure_channel(registry.target) as channel:
            stub = pb_grpc.SyncStub(channel)

            def fetch(node: str) -> Any:
                return stub.Fetch(pb.FetchRequest(sha256=sha), timeout=30, metadata=[
                    ("authorization", f"Bearer {node_token(SECRET, node, 'center', 'local')}")])

            subscribed = contextlib.ExitStack()  # Fetch serves only what a stream was pushed
            for node in ("greedy", "polite"):
                sub = subscribed.enter_context(streams.stream(registry.target, SECRET, node,
                                                              "center"))
                assert sub.next().WhichOneof("kind") == "welcome"
            held = [fetch("greedy"), fetch("greedy")]
            for stream in held:
                assert next(stream).offset == 0  # both in flight
            with pytest.raises(grpc.RpcError) as refused:
                next(fetch("greedy"))
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert next(fetch("polite")).offset == 0  # another node is not held up
            held[0].cancel()
            wait_for(lambda: _starts(fetch("greedy")), 10, "a slot freed by the cancel")
            held[1].cancel()
            subscribed.close()
    finally:
        registry.stop()


def _starts(stream: Any) -> bool:
    try:
        return bool(next(stream).offset == 0)
    except grpc.RpcError:
        return False
    finally:
        stream.cancel()


# -- the registry believes only what it issued: a node's tier and region are its token's ------


@pytest.fixture
def served(tmp_path: Path, tiny_release: Path) -> Iterator[tuple[RegistryCli, Any]]:
    """A registry with tiny@1 in production, serving."""
    cli = RegistryCli(tmp_path / "registry")
    cli("publish", tiny_release, "--name", "tiny")
    registry = start_registry(cli.home, tmp_path, SECRET)
    try:
        yield cli, registry
    finally:
        registry.stop()


def refusal(stream: streams.Stream) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as refused:
        stream.next()
    return refused.value


def test_a_hello_claiming_another_tier_is_refused(served: tuple[RegistryCli, Any]) -> None:
    """An attacker owning one edge box says hello as a center (to report a center's capacity
    and steer the fleet's budgets): the registry takes the tier from the token it issued."""
    cli, registry = served
    held = [pb.Held(model="tiny", versions=[1], active=1)]  # so `registry status` lists it
    claim = pb.Hello(node_id="edge-owned", tier="center", region="eu", held=held)
    with streams.stream(registry.target, SECRET, "edge-owned", "edge", "eu", hello=claim) as s:
        refused = refusal(s)
    assert refused.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "'edge'" in refused.details() and "'center'" in refused.details()
    assert "edge-owned" not in status(cli)  # never recorded, as a center or at all
    assert "it says tier 'center'" in registry.log.read_text()
    honest_hello = pb.Hello(node_id="edge-owned", tier="edge", region="eu", held=held)
    with streams.stream(registry.target, SECRET, "edge-owned", "edge", "eu",
                        hello=honest_hello) as honest:
        assert honest.next().WhichOneof("kind") == "welcome"
        wait_for(lambda: "edge-owned" in status(cli), 10, "the honest hello recorded")
        assert (status(cli)["edge-owned"]["tier"], status(cli)["edge-owned"]["region"]) == \
            ("edge", "eu")


def test_a_hello_claiming_another_region_is_refused(served: tuple[RegistryCli, Any]) -> None:
    cli, registry = served
    for said in ("us", "eu\x1b[31m\nforged log line" + "x" * 500):
        claim = pb.Hello(node_id="edge-eu-9", tier="edge", region=said,
                         held=[pb.Held(model="tiny", versions=[1], active=1)])
        with streams.stream(registry.target, SECRET, "edge-eu-9", "edge", "eu",
                            hello=claim) as s:
            refused = refusal(s)
        assert refused.code() == grpc.StatusCode.PERMISSION_DENIED
        details = refused.details()
        assert "region 'eu'" in details and "\x1b" not in details and "\n" not in details
        assert len(details) < 300  # what the node said is cut short
    assert "edge-eu-9" not in status(cli)
    log = registry.log.read_text()
    assert "\x1b" not in log and "\nforged log line" not in log


def test_an_edge_cannot_fetch_the_center_artifact(served: tuple[RegistryCli, Any]) -> None:
    cli, registry = served
    manifest = cli("show", "tiny@1", "--json").json()["manifest"]
    center, edge = manifest["center"]["sha256"], manifest["edge"]["sha256"]
    with streams.stream(registry.target, SECRET, "edge-thief", "edge", "local") as s:
        assert s.next().WhichOneof("kind") == "welcome"
        assert s.next().release.version == 1  # pushed to it: its edge artifact is served
        with pytest.raises(grpc.RpcError) as refused:
            next(s.fetch(pb.FetchRequest(sha256=center)))  # not one chunk comes
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "center model of tiny version 1" in refused.value.details()
        data = b"".join(c.data for c in s.fetch(pb.FetchRequest(sha256=edge)))
        assert len(data) == manifest["edge"]["size"]
    with streams.stream(registry.target, SECRET, "center-1", "center", "local") as c:
        assert c.next().WhichOneof("kind") == "welcome"
        assert next(c.fetch(pb.FetchRequest(sha256=center))).offset == 0  # its own tier's


def test_a_release_never_pushed_to_the_node_is_refused(served: tuple[RegistryCli, Any],
                                                       tiny_release_b: Path) -> None:
    """A canary for another node (and any Fetch without a Sync stream) streams no byte."""
    cli, registry = served
    cli("publish", tiny_release_b, "--name", "tiny", "--canary", "edge-chosen")
    canary = cli("show", "tiny@2", "--json").json()["manifest"]["edge"]["sha256"]
    request = pb.FetchRequest(sha256=canary)
    with streams.stream(registry.target, SECRET, "edge-other", "edge", "local") as s:
        assert s.next().WhichOneof("kind") == "welcome"
        assert s.next().release.version == 1  # production, not the canary
        with pytest.raises(grpc.RpcError) as refused:
            next(s.fetch(request))
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "no release pushed to node 'edge-other'" in refused.value.details()
    with streams.stream(registry.target, SECRET, "edge-chosen", "edge", "local") as chosen:
        assert chosen.next().WhichOneof("kind") == "welcome"
        assert chosen.next().release.version == 2  # the canary's node gets it
        assert next(chosen.fetch(request)).offset == 0
    # no open stream: nothing was pushed, nothing is served
    token = streams.token(SECRET, "edge-never-connected")
    with grpc.insecure_channel(registry.target) as channel, \
            pytest.raises(grpc.RpcError) as refused:
        next(pb_grpc.SyncStub(channel).Fetch(request, timeout=30, metadata=[
            ("authorization", f"Bearer {token}")]))
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "no open Sync stream" in refused.value.details()


def test_a_token_from_before_tiers_and_regions_is_refused(
        served: tuple[RegistryCli, Any]) -> None:
    """Its MAC covers no tier: the registry cannot tell what the node is, so it is refused
    (and the node itself says why at start-up: test_a_node_refuses_a_token_that_is_not_its_own)."""
    _, registry = served
    mac = hmac.new(SECRET.encode(), b"tiered-node:edge-old:1", hashlib.sha256).hexdigest()
    hello = pb.Hello(node_id="edge-old", tier="edge", region="local")
    with streams.stream(registry.target, SECRET, "edge-old", hello=hello,
                        credential=f"edge-old.1.{mac}") as s:
        assert refusal(s).code() == grpc.StatusCode.UNAUTHENTICATED


# -- registry node provision: a node is its certificate ------------------------------------


def provision(cli: RegistryCli, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "registry"), "node", "provision", *map(str, args)],
                          capture_output=True, text=True, timeout=60,
                          env={**cli.env(), "REGISTRY_TOKEN": SECRET})


def test_registry_node_provision_writes_one_bundle_that_proves_the_node(
        served: tuple[RegistryCli, Any], tmp_path: Path) -> None:
    cli, registry = served
    head = cli("audit", "--json").json()[-1]["seq"]
    cli("node", "revoke", "edge-eu-7")  # generation 2: the bundle carries the current one
    path = tmp_path / "edge-eu-7.bundle"
    result = provision(cli, "edge-eu-7", "--tier", "edge", "--region", "eu", "--out", path,
                       "--host", "10.0.0.7", "--json")
    assert result.returncode == 0, result.stderr
    assert path.stat().st_mode & 0o777 == 0o600
    made = bundles.load(path)
    assert (made.node_id, made.tier, made.region) == ("edge-eu-7", "edge", "eu")
    assert made.directive_floor == head + 1  # the chain's head then (the revoke's record)
    token = parse(made.token)
    assert (token.node_id, token.generation, token.tier, token.region) == \
        ("edge-eu-7", 2, "edge", "eu")
    assert TokenVerifier(SECRET, lambda node: 2).node(made.token) == token
    cert, ca = (x509.load_pem_x509_certificate(p.encode()) for p in (made.cert, made.ca))
    cert.verify_directly_issued_by(ca)  # chains to the fleet CA (made in <home>/tls)
    assert (cli.home / "tls" / "ca.pem").read_text() == made.ca
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "edge-eu-7.edge.tiered.invalid" in names.get_values_for_type(x509.DNSName)
    subject = {a.oid: a.value for a in cert.subject}
    assert (subject[NameOID.COMMON_NAME], subject[NameOID.ORGANIZATIONAL_UNIT_NAME],
            subject[NameOID.LOCALITY_NAME]) == ("edge-eu-7", "edge", "eu")
    key = serialization.load_pem_private_key(made.key.encode(), None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    assert key.public_key().public_numbers() == cert.public_key().public_numbers()
    record = cli("audit", "--json").json()[-1]
    assert record["action"] == "provision-node" and record["actor"] == "tester@ci"
    payload = json.loads(record["payload"])
    assert payload["node"] == "edge-eu-7" and payload["generation"] == 2
    assert payload["cert_serial"] == f"{cert.serial_number:x}"
    assert made.key.split("\n")[1] not in record["payload"]  # no secret in the log
    assert made.token[-64:] not in record["payload"]
    cli("audit", "--verify")
    # the token works as issued
    with streams.stream(registry.target, SECRET, "edge-eu-7", "edge", "eu",
                        credential=made.token) as s:
        assert s.next().WhichOneof("kind") == "welcome"


@pytest.mark.parametrize(("node_id", "flags", "message"), [
    ("Edge_1", ("--tier", "edge", "--region", "eu"), "cannot be named in a certificate"),
    ("edge-1", ("--tier", "edge", "--region", "EU"), "invalid region"),
    ("edge-1", ("--tier", "edge", "--region", "eu"), "never printed: give --out FILE")])
def test_registry_node_provision_refuses_what_it_cannot_issue(
        tmp_path: Path, node_id: str, flags: tuple[str, ...], message: str) -> None:
    cli = RegistryCli(tmp_path / "registry")
    cli("list")  # an empty registry
    out = ["--out", str(tmp_path / "b.json")] if "--out" not in message else []
    result = provision(cli, node_id, *flags, *out)
    assert result.returncode != 0 and message in result.stderr, result.stderr
    assert not (tmp_path / "b.json").exists()
    assert not any(r["action"] == "provision-node" for r in cli("audit", "--json").json())
