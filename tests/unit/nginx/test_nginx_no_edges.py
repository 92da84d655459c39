"""The entry nginx with no edge to send to (none rendered, or none passing nginx -t): its
config still passes a real ``nginx -t``, and clients get the V2 503 (gRPC: UNAVAILABLE), not
nginx's own 502."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from harness.processes import free_port
from nginx.entry import Entry, config
from nginx.fleet import Fleet
from nginx.metrics import CHECK_FAILURES
from nginx.process import Nginx, temp_dir, write_atomically
from nginx.renderer import Renderer
from nginx.upstreams import upstreams
from registry.trust import pki

from .test_nginx_guard_render import NGINX, edge

pytestmark = pytest.mark.skipif(NGINX is None, reason="needs the nginx binary")


@pytest.fixture
def entry(tmp_path: Path) -> Iterator[tuple[Nginx, str, str]]:
    """An entry nginx over TLS to the edges (``--edge-ca``), with a gRPC listener, and an
    upstreams.conf for no edge at all; not started."""
    assert NGINX is not None
    pki.ca(tmp_path / "tls")
    (tmp_path / "tmp").mkdir()
    temp = temp_dir(tmp_path)  # under root: a folder the workers (nobody) may write in
    listen, grpc_listen = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    nginx = Nginx("entry", tmp_path, NGINX)
    write_atomically(nginx.conf, config(tmp_path, listen, 100, 100, "1m", temp, Entry(
        grpc_listen=grpc_listen, edge_ca=tmp_path / "tls" / "ca.pem")))
    write_atomically(nginx.upstreams_conf, upstreams(Fleet(edge_tls=True)))
    try:
        yield nginx, listen, grpc_listen
    finally:
        nginx.stop()
        if temp != tmp_path / "tmp":
            shutil.rmtree(temp, ignore_errors=True)


def test_with_no_edge_rest_gets_503_and_grpc_unavailable(
        entry: tuple[Nginx, str, str]) -> None:
    """The pool's only server is down when no edge is rendered: nginx said 502 under the V2
    error body (docs/security.md promised 503)."""
    nginx, listen, grpc_listen = entry
    assert nginx.test_config() is None
    nginx.start()
    for _ in range(100):
        try:
            if httpx.get(f"http://{listen}/nginx/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.1)
    for headers in ({}, {"X-Tiered-Region": "us"}):
        answer = httpx.post(f"http://{listen}/v2/models/tiny/infer", json={}, timeout=5,
                            headers=headers)
        assert answer.status_code == 503, answer.text
        assert answer.json() == {"error": "no healthy node could answer; retry shortly"}
    with grpc.insecure_channel(grpc_listen) as channel, pytest.raises(grpc.RpcError) as refused:
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value


def test_a_render_no_candidate_of_which_passes_nginx_t_leaves_the_working_file(
        entry: tuple[Nginx, str, str]) -> None:
    """When neither the fleet's rendering nor the empty fleet's passes nginx -t, the working
    upstreams.conf stays as it is (and nginx -t still passes): a renderer that wrote its
    last candidate then left nginx unable to reload, or to start, for good."""
    nginx = entry[0]
    working = nginx.upstreams_conf.read_text()
    renderer = Renderer(nginx, edge_tls=True)
    renderer.fleet.edges = [edge("edge-us-1", "127.0.0.1", 8001)]

    def broken(fleet: Fleet) -> str:  # whatever the fleet: fails nginx -t
        return upstreams(fleet) + "upstream tiered_edges { server 127.0.0.1:1; }\n"

    renderer.parts[0].render = broken
    failures = CHECK_FAILURES.labels("entry")._value.get()
    asyncio.run(renderer.render())
    assert CHECK_FAILURES.labels("entry")._value.get() == failures + 1  # it did fail
    assert nginx.upstreams_conf.read_text() == working
    assert nginx.test_config() is None
