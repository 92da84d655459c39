"""Requests cut by nginx reloads (a chaos run through `tiered up`'s nginx lost 3 of 51,902 to a
closed connection as the center and the registry were killed): a center or registry coming,
going or moving must never reload the entry clients hold keep-alive connections to, only the
side nginx behind it. Real processes: a Consul dev agent (no ACLs), the real renderer running
both nginx with `tiered up`'s --expose-center --expose-registry-metrics; the edge, the centers
and the registry's metrics are small keep-alive HTTP servers in this process, registered in
Consul through its API."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest

from harness.processes import free_port
from tests.faults import JsonHandler
from tests.integration.test_nginx_guard import deregister, register, renderer_metric
from tests.integration.test_sync import wait_for
from tiered.stack import Stack

pytestmark = [pytest.mark.integration, pytest.mark.slow]
BODY = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["fine film"]}]}
CLIENTS = 4
MAX_PER_CLIENT = 3000
CHURN_STEPS = 32  # catalog changes of centers and registries, CHURN_EVERY_S apart
CHURN_EVERY_S = 0.25


class Peer(JsonHandler):
    """An edge, a center or the registry's metrics: answers every request with its own port,
    on keep-alive connections (HTTP/1.1), as the tiers do."""
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms delayed ACK

    def do_GET(self) -> None:  # the stdlib's name
        self.reply(200, {"live": True, "ready": True, "port": self.server.server_address[1]})

    def do_POST(self) -> None:  # the stdlib's name
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.do_GET()


def serve() -> http.server.ThreadingHTTPServer:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Peer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def port(server: http.server.ThreadingHTTPServer) -> int:
    return int(server.server_address[1])


@dataclass
class Front:
    stack: Stack
    metrics_port: int
    peers: dict[str, http.server.ThreadingHTTPServer] = field(default_factory=dict)

    def reloads(self, nginx: str) -> float:
        return renderer_metric(self.metrics_port, "tiered_nginx_render_reloads_total",
                               nginx=nginx)

    def side_upstreams(self) -> str:
        return (self.stack.root / "nginx" / "side" / "upstreams.conf").read_text()

    def center(self, sid: str, peer: str) -> None:
        register(self.stack, sid, "127.0.0.1", port(self.peers[peer]), "tiered-center")


@pytest.fixture(scope="module")
def front(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Front]:
    root = tmp_path_factory.mktemp("side")
    metrics_port = free_port()
    stack = Stack(root, root / "registry", "unused", http_port=free_port(),
                  consul_port=free_port(), consul_acl=False, provision=False,
                  nginx_flags=("--expose-center", "--expose-registry-metrics", "--rate",
                               "100000", "--burst", "100000", "--center-rate", "100000",
                               "--metrics-listen", f"127.0.0.1:{metrics_port}"))
    fixture = Front(stack, metrics_port, {name: serve() for name in (
        "edge-us", "edge-eu", "center-a", "center-b", "center-c", "center-d", "metrics")})
    try:
        stack.start_consul()
        register(stack, "edge-us-1", "127.0.0.1", port(fixture.peers["edge-us"]), region="us")
        fixture.center("center-1", "center-a")
        register(stack, "registry-1", "127.0.0.1", free_port(), "tiered-registry",
                 metrics_port=str(port(fixture.peers["metrics"])))
        stack.start_nginx()
        wait_for(lambda: _answers(stack, "/v2/health/ready") == port(fixture.peers["edge-us"])
                 and _answers(stack, "/center/v2/health/live") == port(
                     fixture.peers["center-a"]), 30, "the entry routing to the edge and center")
        yield fixture
    finally:
        stack.stop()
        for server in fixture.peers.values():
            server.shutdown()
            server.server_close()


def _answers(stack: Stack, path: str, **headers: str) -> int | None:
    """The port of the peer that answered ``path`` through the entry, None if none did."""
    try:
        answer = httpx.get(f"{stack.url}{path}", headers=headers, timeout=5)
    except httpx.HTTPError:
        return None
    return int(answer.json()["port"]) if answer.status_code == 200 else None


@dataclass
class Load:
    """CLIENTS threads, each on its own keep-alive connection to the entry (httpx.Client):
    /v2/ inference, and every fifth request /center/v2/; bounded in count and time."""
    url: str
    sent: int = 0
    failed: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def client(self) -> None:
        with httpx.Client(base_url=self.url, timeout=10) as client:
            for n in range(MAX_PER_CLIENT):
                if self.stop.is_set():
                    return
                path = "/center/v2/health/live" if n % 5 == 4 else "/v2/models/tiny/infer"
                try:
                    answer = (client.get(path) if path.startswith("/center")
                              else client.post(path, json=BODY, headers={"X-Tiered-Region": "us"}))
                    problem = None if answer.status_code == 200 else (
                        f"{path}: {answer.status_code} {answer.text[:100]}")
                except httpx.HTTPError as exc:  # a closed connection: what a reload caused
                    problem = f"{path}: {exc!r}"
                with self.lock:
                    self.sent += 1
                    if problem:
                        self.failed.append(problem)


def test_centers_and_registries_changing_never_reload_the_entry_nor_fail_a_request(
        front: Front) -> None:
    stack = front.stack
    entry_before, side_before = front.reloads("entry"), front.reloads("side")
    load = Load(stack.url)
    clients = [threading.Thread(target=load.client) for _ in range(CLIENTS)]
    started = time.monotonic()
    for thread in clients:
        thread.start()
    try:
        churn(front)
    finally:
        load.stop.set()
        for thread in clients:
            thread.join(timeout=30)
    seconds = time.monotonic() - started
    entry_reloads = front.reloads("entry") - entry_before
    side_reloads = front.reloads("side") - side_before
    print(f"{load.sent} requests in {seconds:.1f} s on {CLIENTS} keep-alive clients, "
          f"{len(load.failed)} failed; reloads: entry {entry_reloads:.0f}, side "
          f"{side_reloads:.0f}")
    assert load.failed == [], load.failed[:5]
    assert load.sent >= 200, load.sent
    assert side_reloads >= 5, "the side followed the changes"
    assert entry_reloads == 0

    # center-1 moves to another port (and its old one goes away): /center/v2/ follows it
    front.center("center-1", "center-d")
    front.peers["center-a"].shutdown()
    wait_for(lambda: f":{port(front.peers['center-d'])} " in front.side_upstreams()
             and f":{port(front.peers['center-a'])} " not in front.side_upstreams(), 30,
             "the moved center in the side's upstreams")
    wait_for(lambda: _answers(stack, "/center/v2/health/live") == port(front.peers["center-d"]),
             10, "/center/v2/ answered by the moved center")
    assert _answers(stack, "/registry/metrics") == port(front.peers["metrics"])
    assert front.reloads("entry") == entry_before


def churn(front: Front) -> None:
    """Centers and registries come, go, move and flap while the clients run; center-1 stays
    (so every /center/v2/ request has a center to answer it)."""
    steps = [lambda: front.center("center-2", "center-b"),
             lambda: front.center("center-2", "center-c"),  # moved to another port
             lambda: register(front.stack, "registry-2", "127.0.0.1", free_port(),
                              "tiered-registry", metrics_port=str(free_port())),
             lambda: deregister(front.stack, "center-2"),
             lambda: deregister(front.stack, "registry-2")]
    for n in range(CHURN_STEPS):
        steps[n % len(steps)]()
        time.sleep(CHURN_EVERY_S)
    deregister(front.stack, "center-2")
    deregister(front.stack, "registry-2")


def test_an_edge_change_still_reloads_the_entry_and_not_the_side(front: Front) -> None:
    """The other side of the check: the entry does follow the edges."""
    entry_before, side_before = front.reloads("entry"), front.reloads("side")
    register(front.stack, "edge-eu-1", "127.0.0.1", port(front.peers["edge-eu"]), region="eu")
    try:
        wait_for(lambda: front.reloads("entry") > entry_before, 30, "an entry reload")
        wait_for(lambda: _answers(front.stack, "/v2/health/ready", **{"X-Tiered-Region": "eu"})
                 == port(front.peers["edge-eu"]), 10, "/v2/ routed to the new eu edge")
        assert front.reloads("side") == side_before
    finally:
        deregister(front.stack, "edge-eu-1")
