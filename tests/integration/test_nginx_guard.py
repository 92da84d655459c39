"""One edge box stolen, with the edge role's Consul token: what it can no longer do through
nginx's entry. Real processes: a Consul dev agent (no ACLs: the edge token may register any
``tiered-edge`` anyway, which is all these attacks need), a real edge serving the tiny
release over HTTPS and gRPC with its own certificate from the fleet CA (``pki.node``), and
the real renderer running real nginx with ``--edge-ca``. The attackers are small servers in
this process. Each test is named after the attack it replays; each fails on the renderer
before this change (plain HTTP to edges, host names pasted into the config, every route
open, the renderer's environment handed to nginx)."""

from __future__ import annotations

import http.server
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from tritonclient.grpc import service_pb2 as pb  # this process's stubs of inference.* (the
from tritonclient.grpc import service_pb2_grpc as pb_grpc  # tiers load theirs)

from harness.processes import BIN, TierProcess, free_port, start_tier
from registry.trust import pki
from tests.faults import JsonHandler, http_peer
from tests.integration.test_sync import wait_for
from tiered.stack import Stack

pytestmark = pytest.mark.integration

RENDERER_TOKEN = "renderer-reader-token-5c0ffee5c0ffee"  # what the renderer holds
SECRET_TEXT = "a user's private review 7f3a"
BODY = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [SECRET_TEXT]}]}
US = {"X-Tiered-Region": "us"}


@dataclass
class Guarded:
    root: Path
    ca: Path
    consul: Stack
    edge: TierProcess
    entry: Stack
    metrics_port: int
    entries: list[Stack] = field(default_factory=list)

    def new_entry(self, *flags: str) -> Stack:
        """Another renderer + nginx on the same Consul (stopped with the module)."""
        n = len(self.entries)
        entry = Stack(self.root / f"entry-{n}", self.root / "registry", "unused",
                      http_port=free_port(), consul_port=self.consul.consul_port,
                      consul_acl=False, nginx_flags=flags, provision=False)
        self.entries.append(entry)
        entry.start_nginx()
        wait_for(lambda: _get(entry, "/nginx/health") == 200, 30, "the new entry")
        return entry


def _get(entry: Stack, path: str, **headers: str) -> int:
    try:
        return httpx.get(f"{entry.url}{path}", headers=headers, timeout=5).status_code
    except httpx.HTTPError:
        return 0


def node_cert(tls: Path, node_id: str) -> tuple[Path, Path]:
    cert, key = pki.node(tls, node_id, "edge", "us", hosts=("127.0.0.1",))
    (tls / f"{node_id}.pem").write_bytes(cert)
    (tls / f"{node_id}.key").write_bytes(key)
    (tls / f"{node_id}.key").chmod(0o600)
    return tls / f"{node_id}.pem", tls / f"{node_id}.key"


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory, tiny_stores: Path) -> Iterator[Guarded]:
    root = tmp_path_factory.mktemp("guard")
    tls = root / "tls"
    pki.ca(tls)
    consul = Stack(root / "consul", root / "registry", "unused", http_port=free_port(),
                   consul_port=free_port(), consul_acl=False, provision=False)
    started: list[Stack] = [consul]
    edge: TierProcess | None = None
    try:
        consul.start_consul()
        cert, key = node_cert(tls, "edge-us-1")
        edge = start_tier("edge", tiny_stores / "edge", root, "--poll-interval-s", "0.2",
                          "--region", "us", "--grpc-port", str(free_port()), timeout=90,
                          env={"PATH": str(BIN), "CONSUL_HTTP_ADDR": consul.consul,
                               "EDGE_TLS_CERT": str(cert), "EDGE_TLS_KEY": str(key)},
                          ca=tls / "ca.pem", node_id="edge-us-1")
        metrics_port = free_port()
        entry = Stack(root / "entry", root / "registry", "unused", http_port=free_port(),
                      consul_port=consul.consul_port, grpc_port=free_port(), consul_acl=False,
                      consul_token=RENDERER_TOKEN, provision=False,
                      nginx_flags=("--edge-ca", str(tls / "ca.pem"), "--metrics-listen",
                                   f"127.0.0.1:{metrics_port}", "--max-body", "256k"))
        started.append(entry)
        entry.start_nginx()
        guarded = Guarded(root, tls / "ca.pem", consul, edge, entry, metrics_port)
        wait_for(lambda: _get(entry, "/v2/health/ready", **US) == 200, 60,
                 "nginx routing to the edge over TLS")
        yield guarded
        started += guarded.entries
    finally:
        for stack in reversed(started):
            stack.stop()
        if edge is not None:
            edge.stop()


def register(consul: Stack, sid: str, address: str, port: int, service: str = "tiered-edge",
             **meta: str) -> None:
    answer = httpx.put(f"http://{consul.consul}/v1/agent/service/register", timeout=5,
                       json={"Name": service, "ID": sid, "Address": address, "Port": port,
                             "Meta": meta})
    assert answer.status_code == 200, answer.text


def deregister(consul: Stack, sid: str) -> None:
    httpx.put(f"http://{consul.consul}/v1/agent/service/deregister/{sid}", timeout=5)


def infer(entry: Stack, **headers: str) -> httpx.Response:
    return httpx.post(f"{entry.url}/v2/models/tiny/infer", json=BODY, headers=headers,
                      timeout=10)


def renderer_metric(port: int, name: str, **labels: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    want = name + ("{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"
                   if labels else "")
    for line in text.splitlines():
        if line.startswith(want + " "):
            return float(line.split()[-1])
    return 0.0


# -- 4. the renderer's Consul token in nginx's workers -------------------------------------


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _memory_holds(pid: int, needle: bytes) -> bool | None:
    """Whether ``needle`` is in any writable mapping of ``pid`` (heap, stack, anonymous), read
    through /proc/PID/mem; None when this user may not read it."""
    try:
        maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
        with open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
            for line in maps:
                span, perms = line.split()[:2]
                if not perms.startswith("rw"):
                    continue
                start, end = (int(x, 16) for x in span.split("-"))
                if end - start > 64 << 20:
                    continue
                try:
                    mem.seek(start)
                    if needle in mem.read(end - start):
                        return True
                except OSError:
                    continue
    except (PermissionError, ProcessLookupError, FileNotFoundError):  # or gone in a reload
        return None
    return False


def test_nginx_workers_hold_no_consul_token_in_their_environment(guarded: Guarded) -> None:
    """nginx's workers (``nobody`` under root) used to inherit the renderer's environment,
    its Consul token included: readable in /proc/PID/environ and in their memory."""
    prefix = guarded.entry.root / "nginx"
    master = int((prefix / "nginx.pid").read_text())
    workers = _children(master)
    assert workers, "nginx has workers"
    renderer = guarded.entry.children["nginx"].pid
    assert RENDERER_TOKEN.encode() in Path(f"/proc/{renderer}/environ").read_bytes()
    assert _memory_holds(renderer, RENDERER_TOKEN.encode()) in (True, None)  # the control
    checked = 0
    for pid in (master, *workers):
        # nginx writes its process title over the start of its environment block
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except (ProcessLookupError, FileNotFoundError):  # a worker a reload just replaced
            continue
        assert b"CONSUL_HTTP_TOKEN" not in environ and RENDERER_TOKEN.encode() not in environ
        assert not _memory_holds(pid, RENDERER_TOKEN.encode()), pid
        assert not _memory_holds(pid, b"CONSUL_HTTP_TOKEN="), pid
        checked += 1
    assert checked >= 2, "the master and at least one worker were read"


# -- 3. the gRPC entry: only inference and health, gRPC-shaped refusals -----------------------


def test_grpc_reflection_through_the_entry_gets_unimplemented(guarded: Guarded) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{guarded.entry.grpc_port}") as channel:
        live = pb_grpc.GRPCInferenceServiceStub(channel).ServerLive(pb.ServerLiveRequest(),
                                                                    timeout=10)
        assert live.live  # the inference service passes (over TLS to the edge's gRPC port)
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(),
                                                            timeout=10)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        with pytest.raises(grpc.RpcError) as refused:
            list(stub.ServerReflectionInfo(iter([request]), timeout=10))
    assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED, refused.value
    assert "inference.GRPCInferenceService" in (refused.value.details() or "")
    edge_log = guarded.edge.log.read_text()
    assert "ServerReflection" not in edge_log


def test_a_grpc_message_over_the_size_limit_gets_resource_exhausted(guarded: Guarded) -> None:
    request = pb.ModelInferRequest(model_name="tiny")
    text = request.inputs.add(name="text", datatype="BYTES", shape=[1])
    text.contents.bytes_contents.append(b"x" * (512 << 10))  # --max-body 256k
    with (grpc.insecure_channel(f"127.0.0.1:{guarded.entry.grpc_port}") as channel,
          pytest.raises(grpc.RpcError) as refused):
        pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=10)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refused.value
    assert "256k" in (refused.value.details() or "")


# -- 2. the registry's metrics and the center through nginx ---------------------------------


class Metrics(JsonHandler):
    def do_GET(self) -> None:  # the stdlib's name
        self.reply(200, {"metrics": "registry_sync_nodes_connected 1.0"})


def test_registry_metrics_and_the_center_are_not_served_to_anonymous_clients(
        guarded: Guarded) -> None:
    for path in ("/registry/metrics", "/center/v2/models/tiny/infer", "/center/v2/health/live"):
        closed = httpx.get(f"{guarded.entry.url}{path}", timeout=5)
        assert closed.status_code == 404 and "error" in closed.json(), path
        assert "/center/v2/" not in closed.json()["error"]
    # the operator's explicit flags open them, behind limit_req (the metrics very tightly)
    with http_peer(Metrics) as scraped:
        register(guarded.consul, "registry-1", "127.0.0.1", free_port(), "tiered-registry",
                 metrics_port=str(scraped.server_address[1]))
        try:
            entry = guarded.new_entry("--expose-registry-metrics", "--expose-center",
                                      "--center-rate", "1")
            wait_for(lambda: _get(entry, "/registry/metrics") == 200, 30, "metrics exposed")
            time.sleep(1.5)  # the zone refills
            codes = [_get(entry, "/registry/metrics") for _ in range(10)]
            assert codes.count(200) <= 4 and codes.count(429) >= 6, codes
            center = [httpx.get(f"{entry.url}/center/v2/health/live", timeout=5).status_code
                      for _ in range(6)]
            assert 404 not in center and 429 in center, center  # routed (no center: 503)
        finally:
            deregister(guarded.consul, "registry-1")


# -- 1. routing frozen by a host name that does not resolve ---------------------------------


def test_an_unresolvable_edge_host_name_freezes_no_routing(guarded: Guarded) -> None:
    """The stolen edge registers ``edge-us-9`` at ``nx-host.tiered.invalid``: nginx -t used to
    fail on it, so the running renderer stopped reloading and one started now served 502 to
    every /v2/ request."""
    register(guarded.consul, "edge-us-9", "nx-host.tiered.invalid", 8000, region="us")
    try:
        wait_for(lambda: renderer_metric(guarded.metrics_port,
                                         "tiered_nginx_render_dropped_entries", role="edges",
                                         reason="unresolvable") == 1.0, 30,
                 "the renderer saying it left the entry out")
        upstreams = (guarded.entry.root / "nginx" / "upstreams.conf").read_text()
        assert "nx-host" not in upstreams and "8000" not in upstreams
        log = guarded.entry.children["nginx"].log.read_text()
        assert "edge-us-9" in log and "unresolvable" in log
        # the running entry still follows the catalog: a change is rendered and reloaded (an
        # edge that answers as itself: with --edge-ca only those are rendered)
        reloads = renderer_metric(guarded.metrics_port, "tiered_nginx_render_reloads_total",
                                  nginx="entry")
        with http_peer(Legit, node_cert(guarded.ca.parent, "edge-eu-5")) as eu:
            register(guarded.consul, "edge-eu-5", "127.0.0.1", eu.server_address[1],
                     region="eu")
            wait_for(lambda: renderer_metric(guarded.metrics_port,
                                             "tiered_nginx_render_reloads_total",
                                             nginx="entry") > reloads, 30,
                     "a reload after the next change")
            deregister(guarded.consul, "edge-eu-5")
        # an entry started while the bad entry is listed routes from its first render
        fresh = guarded.new_entry("--edge-ca", str(guarded.ca))
        # settled: three answers in a row (on this machine one 502 was seen right after the
        # first answer of a fresh entry, once in several runs, bad entry or not)
        wait_for(lambda: all(infer(fresh, **US).status_code == 200 for _ in range(3)), 30,
                 "the fresh entry routing")
        answers = [infer(fresh, **US) for _ in range(6)]
        assert [a.status_code for a in answers] == [200] * 6
        assert {a.json()["parameters"]["node_id"] for a in answers} == {"edge-us-1"}
    finally:
        deregister(guarded.consul, "edge-us-9")


# -- 5. a catalog entry moved to another address --------------------------------------------


class Attacker(http.server.ThreadingHTTPServer):
    """The stolen box's listener: TLS with its own *valid* edge certificate (``edge-stolen``)
    when the caller speaks TLS, plain HTTP otherwise; records every request that reaches it."""

    def __init__(self, cert: tuple[Path, Path]) -> None:
        self.seen: list[dict[str, Any]] = []
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(*cert)
        self.handshakes = 0
        outer = self

        class Handler(JsonHandler):
            def do_POST(self) -> None:  # the stdlib's name
                length = int(self.headers.get("Content-Length") or 0)
                outer.seen.append({"path": self.path, "body": self.rfile.read(length)})
                self.reply(200, {"model_name": "tiny", "outputs": [],
                                 "parameters": {"node_id": "edge-us-1", "forged": True}})

            do_GET = do_POST

        super().__init__(("127.0.0.1", 0), Handler)

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, address = self.socket.accept()
        sock.settimeout(5)
        if sock.recv(1, socket.MSG_PEEK) == b"\x16":  # a TLS ClientHello
            self.handshakes += 1
            sock = self.context.wrap_socket(sock, server_side=True)
        return sock, address


class Legit(JsonHandler):
    """edge-us-2: a small HTTPS edge with its own certificate (the second edge nginx fails
    over to when the first handshake fails)."""

    def do_POST(self) -> None:  # the stdlib's name
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.reply(200, {"model_name": "tiny", "outputs": [],
                         "parameters": {"node_id": "edge-us-2"}})

    def do_GET(self) -> None:  # the stdlib's name
        self.reply(200, {"ready": True})


def test_a_catalog_entry_moved_to_another_address_reaches_nobody(guarded: Guarded) -> None:
    """The stolen box re-registers another edge's id (same name, same Meta) at its own
    port: nginx used to send users' requests there in plain HTTP. nginx now checks, in the
    handshake, the certificate of that id's node name at every address it dials; and before
    that the renderer itself asks the address to prove that name, and renders the entry only
    if it does. The stolen box's certificate (valid, but for ``edge-stolen``) fails it: the
    moved entry is never rendered, the real edge-us-2, still answering as itself at its own
    address, stays (held: it left the catalog), and the attacker sees no request.

    The entry moved is ``edge-us-2``'s (a listener this test runs, which does not re-assert
    its registration): the real ``edge-us-1`` puts its own entry back within a fraction of a
    second (test_node_identity.py), which would race the attack rather than test nginx."""
    tls = guarded.ca.parent
    attacker = Attacker(node_cert(tls, "edge-stolen"))
    threading.Thread(target=attacker.serve_forever, daemon=True).start()
    entry = guarded.entry
    upstreams = entry.root / "nginx" / "upstreams.conf"
    stop = threading.Event()

    def keep_registering() -> None:  # the attacker keeps edge-us-2's entry at its own port
        while not stop.is_set():
            register(guarded.consul, "edge-us-2", "127.0.0.1", attacker.server_address[1],
                     region="us")
            stop.wait(0.2)

    with http_peer(Legit, node_cert(tls, "edge-us-2")) as legit:
        register(guarded.consul, "edge-us-2", "127.0.0.1", legit.server_address[1],
                 region="us")
        registering = threading.Thread(target=keep_registering, daemon=True)
        rendered: list[str] = []
        try:
            wait_for(lambda: f":{legit.server_address[1]} " in upstreams.read_text(), 30,
                     "edge-us-2 rendered")
            registering.start()
            wait_for(lambda: attacker.handshakes > 0, 30, "the renderer dialing the moved entry")
            answers = []
            with httpx.Client(timeout=10) as client:  # keep-alive to nginx; nginx keeps its own
                for _ in range(40):
                    answers.append(client.post(f"{entry.url}/v2/models/tiny/infer",
                                               json=BODY, headers=US))
                    rendered.append(upstreams.read_text())
            held = renderer_metric(guarded.metrics_port, "tiered_nginx_render_held_edges",
                                   reason="departed")
            wrong = renderer_metric(guarded.metrics_port, "tiered_nginx_render_dropped_entries",
                                    role="edges", reason="wrong_identity")
        finally:
            stop.set()
            if registering.is_alive():
                registering.join()
            deregister(guarded.consul, "edge-us-2")
            attacker.shutdown()
            attacker.server_close()
    assert attacker.seen == [], "a user's request reached the stolen box"
    assert attacker.handshakes > 0, "the moved entry was dialed (the attack was live)"
    assert not any(f":{attacker.server_address[1]} " in text for text in rendered)
    assert all(f":{legit.server_address[1]} " in text for text in rendered)
    assert held >= 1.0 and wrong >= 1.0  # (an edge of an earlier test may be held too)
    assert [a.status_code for a in answers] == [200] * 40
    served = [a.json()["parameters"] for a in answers]
    assert not any(p.get("forged") for p in served)
    assert {p["node_id"] for p in served} <= {"edge-us-1", "edge-us-2"}


# -- 6. decoys and deregistrations: the entry emptied --------------------------------------


@dataclass
class RealEdge:
    node_id: str
    port: int
    grpc_port: int


@pytest.fixture(scope="module")
def two_edges(guarded: Guarded, tiny_stores: Path) -> Iterator[list[RealEdge]]:
    """edge-us-1 and a second real edge, edge-us-3 (the same release), both rendered."""
    cert, key = node_cert(guarded.ca.parent, "edge-us-3")
    grpc_port = free_port()
    second = start_tier("edge", tiny_stores / "edge", guarded.root, "--poll-interval-s", "0.2",
                        "--region", "us", "--grpc-port", str(grpc_port), timeout=90,
                        env={"PATH": str(BIN), "CONSUL_HTTP_ADDR": guarded.consul.consul,
                             "EDGE_TLS_CERT": str(cert), "EDGE_TLS_KEY": str(key)},
                        ca=guarded.ca, node_id="edge-us-3")
    try:
        first = httpx.get(f"http://{guarded.consul.consul}/v1/agent/service/edge-us-1",
                          timeout=5).json()
        edges = [RealEdge("edge-us-1", guarded.edge.port, int(first["Meta"]["grpc_port"])),
                 RealEdge("edge-us-3", second.port, grpc_port)]
        upstreams = guarded.entry.root / "nginx" / "upstreams.conf"
        wait_for(lambda: all(f":{e.port} max_fails=0;" in upstreams.read_text()
                             and f":{e.grpc_port} max_fails=0;" in upstreams.read_text()
                             for e in edges), 60, "both edges rendered, passing")
        yield edges
    finally:
        second.stop()


def settled(guarded: Guarded) -> None:
    """No edge of an earlier test still held, and no reload for 2 s (a reload closes idle
    keep-alive connections: one now would be an earlier test's)."""
    def metric(name: str, **labels: str) -> float:
        return renderer_metric(guarded.metrics_port, name, **labels)

    wait_for(lambda: metric("tiered_nginx_render_held_edges", reason="departed")
             + metric("tiered_nginx_render_held_edges", reason="last") == 0, 30,
             "the edges of earlier tests let go")
    seen = [metric("tiered_nginx_render_reloads_total", nginx="entry"), time.monotonic()]

    def quiet() -> bool:
        now = metric("tiered_nginx_render_reloads_total", nginx="entry")
        if now != seen[0]:
            seen[:] = [now, time.monotonic()]
        return time.monotonic() - seen[1] > 2

    wait_for(quiet, 30, "no reload for 2 s", poll=0.2)


PAIRS_PER_S = 100  # traffic(): 200 requests a second, under the entry's 500 per client


def traffic(entry: Stack, seconds: float) -> tuple[int, list[str]]:
    """REST inference and gRPC ServerLive through ``entry``, one after the other on kept-alive
    connections (as clients do), for ``seconds``: how many were sent, and each failure. At
    most ``PAIRS_PER_S`` pairs a second: unpaced, a fast machine passed the entry's per-client
    rate limit (500 requests/s) and counted its 429s as failures."""
    sent, failures = 0, []
    started = time.monotonic()
    with (httpx.Client(timeout=10) as client,
          grpc.insecure_channel(f"127.0.0.1:{entry.grpc_port}") as channel):
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        while time.monotonic() < started + seconds:
            time.sleep(max(0.0, started + sent / 2 / PAIRS_PER_S - time.monotonic()))
            sent += 2
            try:
                answer = client.post(f"{entry.url}/v2/models/tiny/infer", json=BODY, headers=US)
                if answer.status_code != 200:
                    failures.append(f"REST {answer.status_code} {answer.text[:80]}")
            except httpx.HTTPError as exc:
                failures.append(f"REST {exc!r}")
            try:
                stub.ServerLive(pb.ServerLiveRequest(), timeout=10)
            except grpc.RpcError as exc:
                failures.append(f"gRPC {exc.code()} {exc.details()}")
    return sent, failures


def test_a_decoy_at_every_real_edges_address_takes_no_edge_out_of_nginx(
        guarded: Guarded, two_edges: list[RealEdge]) -> None:
    """The finding: one decoy ``tiered-edge`` per real edge, at that edge's own address and
    gRPC port, under a new id. The renderer dropped every address two entries claimed: both
    edges left nginx, every REST request got a 502 and every gRPC call UNAVAILABLE until the
    decoys were removed. Now the renderer asks each address to prove the entry's node:
    the decoys fail it, the edges do not."""
    upstreams = guarded.entry.root / "nginx" / "upstreams.conf"
    settled(guarded)
    try:
        for n, e in enumerate(two_edges):
            register(guarded.consul, f"decoy-{n}", "127.0.0.1", e.port, region="us",
                     grpc_port=str(e.grpc_port))
        sent, failures = traffic(guarded.entry, 15)  # from the moment they are registered
        text = upstreams.read_text()
        wrong = renderer_metric(guarded.metrics_port, "tiered_nginx_render_dropped_entries",
                                role="edges", reason="wrong_identity")
    finally:
        for n in range(len(two_edges)):
            deregister(guarded.consul, f"decoy-{n}")
    print(f"decoys: {len(failures)} failed of {sent} requests in 15 s")
    assert failures == [], failures[:5]
    assert wrong == 2.0, "the renderer says it left the decoys out"
    for e in two_edges:
        assert f":{e.port} max_fails=0;" in text and f":{e.grpc_port} max_fails=0;" in text
        assert f"{e.node_id}.edge.tiered.invalid" in text
    assert "decoy" not in text


def test_a_deregistration_loop_against_the_real_edges_fails_no_request(
        guarded: Guarded, two_edges: list[RealEdge]) -> None:
    """The finding's second half: deregistering both real edges over and over (each puts its
    entry back within a fraction of a second) cost 53 of 483 requests a 502 in 10 s. An edge
    the catalog drops while its address still answers as itself is now held, so nginx's
    edges stay as they were."""
    stop = threading.Event()
    loops = 0

    def deregistering() -> None:
        nonlocal loops
        while not stop.is_set():
            for e in two_edges:
                deregister(guarded.consul, e.node_id)
            loops += 1
            stop.wait(0.02)

    settled(guarded)
    reloads = renderer_metric(guarded.metrics_port, "tiered_nginx_render_reloads_total",
                              nginx="entry")
    attacker = threading.Thread(target=deregistering, daemon=True)
    attacker.start()
    try:
        sent, failures = traffic(guarded.entry, 10)
    finally:
        stop.set()
        attacker.join()
    reloads = renderer_metric(guarded.metrics_port, "tiered_nginx_render_reloads_total",
                              nginx="entry") - reloads
    print(f"deregistration loop ({loops} rounds): {len(failures)} failed of {sent} requests "
          f"in 10 s, {reloads:.0f} reloads of the entry")
    assert loops > 20, "the attack ran"
    assert failures == [], failures[:5]
    log = guarded.entry.children["nginx"].log.read_text()
    assert "left the catalog while nginx used it" in log  # and said so (once a minute)
    upstreams = guarded.entry.root / "nginx" / "upstreams.conf"
    wait_for(lambda: all(f":{e.port} max_fails=0;" in upstreams.read_text()
                         for e in two_edges), 30, "both edges registered and passing again")
