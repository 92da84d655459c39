"""Finding 1 of the security review, replayed: a ``tiered-edge`` registered by whoever reaches
Consul, whose ``Meta.region`` closes the region map and adds a ``server`` that serves /etc/. A
real Consul dev agent *without* ACLs (so the registration goes through, as it did), the real
renderer and nginx; the fake edge is a small HTTP server in this process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from harness.processes import free_port
from tests.faults import JsonHandler, http_peer
from tests.integration.test_sync import wait_for
from tiered.stack import Stack

pytestmark = pytest.mark.integration


class Edge(JsonHandler):
    def do_GET(self) -> None:  # the stdlib's name
        self.reply(200 if self.path.startswith("/v2/health/") else 404,
                   {"ready": True, "fake_edge": True})


@pytest.fixture
def edge() -> Iterator[int]:
    with http_peer(Edge) as server:
        yield int(server.server_address[1])


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    # --expose-registry-metrics: only then does the renderer follow the registries (their
    # metrics ports are what a hostile registry entry would inject)
    front = Stack(tmp_path, tmp_path / "registry", "unused", http_port=free_port(),
                  consul_port=free_port(), consul_acl=False, provision=False,
                  nginx_flags=("--expose-registry-metrics",))
    try:
        front.start_consul()
        front.start_nginx()
        yield front
    finally:
        front.stop()


def register(stack: Stack, service: str, sid: str, port: int, **meta: str) -> None:
    answer = httpx.put(f"http://{stack.consul}/v1/agent/service/register", timeout=5,
                       json={"Name": service, "ID": sid, "Address": "127.0.0.1", "Port": port,
                             "Meta": meta})  # no token: ACLs are off on this agent
    assert answer.status_code == 200, answer.text


def test_an_injected_region_never_reaches_nginx(stack: Stack, edge: int) -> None:
    upstreams = stack.root / "nginx" / "upstreams.conf"
    wait_for(upstreams.is_file, 30, "upstreams.conf")
    nginx_conf = (stack.root / "nginx" / "nginx.conf").read_text()
    side_conf = (stack.root / "nginx" / "side" / "nginx.conf").read_text()
    injection = (f'eu" tiered_edges;\n}}\nserver {{\n    listen 127.0.0.1:{stack.http_port} '
                 f'default_server;\n    location /leak/ {{ alias /etc/; }}\n}}\n'
                 f'map $uri $tiered_leak {{\n    "x')
    register(stack, "tiered-edge", "edge-evil-1", edge, region=injection)
    register(stack, "tiered-registry", "registry-evil-1", edge,
             metrics_port=f"9300;\n}}\nserver {{ listen 127.0.0.1:{stack.http_port}; }}")
    # then harmless changes: once nginx routes to them, the renderer has seen the hostile ones
    # (the registries are the side nginx's, which serves /registry/metrics)
    register(stack, "tiered-edge", "edge-eu-1", edge, region="eu", tier="edge")
    register(stack, "tiered-registry", "registry-1", edge, metrics_port=str(edge))
    side = stack.root / "nginx" / "side" / "upstreams.conf"
    wait_for(lambda: f"server 127.0.0.1:{edge} max_fails=0;" in upstreams.read_text(), 30,
             "the harmless edge in upstreams.conf")
    wait_for(lambda: f"server 127.0.0.1:{edge};" in side.read_text(), 30,
             "the harmless registry in the side's upstreams.conf")
    wait_for(lambda: _ready(stack).status_code == 200, 30, "nginx routing to the fake edge")

    for text in (upstreams.read_text(), side.read_text()):
        for trace in ("leak", "alias", "/etc/", "default_server", "evil", "9300", "listen"):
            assert trace not in text, trace
    text = upstreams.read_text()
    assert '"eu" tiered_edges_eu;' in text
    assert (stack.root / "nginx" / "nginx.conf").read_text() == nginx_conf
    assert (stack.root / "nginx" / "side" / "nginx.conf").read_text() == side_conf
    leak = httpx.get(f"{stack.url}/leak/passwd", timeout=5)
    assert leak.status_code == 404 and "root:" not in leak.text
    # /v2/ still goes to the edge (retried: the fake edge is a small HTTP/1.0 server, and a
    # connection it closed under nginx can cost one 502, which is not what this test is about)
    wait_for(lambda: _routed_to_the_edge(stack), 10, "/v2/ still routed to the edge")
    log = stack.children["nginx"].log.read_text()
    assert "skipping an invalid tiered-edge entry" in log and "tiered-registry" in log


def _ready(stack: Stack) -> httpx.Response:
    return httpx.get(f"{stack.url}/v2/health/ready", timeout=5)


def _routed_to_the_edge(stack: Stack) -> bool:
    ready = _ready(stack)
    return ready.status_code == 200 and ready.json() == {"ready": True, "fake_edge": True}
