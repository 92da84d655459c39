"""A request cut by a dying edge is retried once on another edge, never twice. A chaos run
through nginx lost a request in flight on a killed edge: nginx does not send a POST again
unless told (``non_idempotent``). Real nginx with the entry's rendered config; the edges are
small servers in this process: a live one, ones that read the request and close the
connection without answering (an edge killed mid-request), ones answering 503 or 400."""

from __future__ import annotations

import http.server
import json
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from harness.processes import free_port
from nginx.entry import Entry, config
from nginx.fleet import Fleet
from nginx.process import Nginx, temp_dir
from nginx.upstreams import upstreams
from serving.fleet.discovery import Instance
from tests.integration.test_sync import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]
BODY = b'{"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["fine"]}]}'


class Dying:
    """An edge killed mid-request: accepts, reads what it is sent, closes without a byte back;
    counts the attempts that reached it."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.attempts = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                try:
                    if conn.recv(65536):  # the request (or, for gRPC, its first frames)
                        self.attempts += 1
                except OSError:
                    pass

    def close(self) -> None:
        self.listener.close()


class Answering(http.server.BaseHTTPRequestHandler):
    """An edge answering every POST with the server's status and body (HTTP/1.1 keep-alive)."""
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:  # the stdlib's name
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        server: Peer = self.server  # type: ignore[assignment]
        server.attempts += 1
        body = json.dumps(server.body).encode()
        self.send_response(server.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # the stdlib's name
        pass


class Peer(http.server.ThreadingHTTPServer):
    def __init__(self, status: int, body: dict[str, object]) -> None:
        super().__init__(("127.0.0.1", 0), Answering)
        self.status, self.body, self.attempts = status, body, 0
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def close(self) -> None:
        self.shutdown()
        self.server_close()


@dataclass
class Entrance:
    http: str
    grpc: str
    prefix: Path


Start = Callable[[list[tuple[int, int]]], Entrance]


@pytest.fixture
def entrance(tmp_path: Path) -> Iterator[Start]:
    """Starts the entry nginx in front of edges given as (HTTP port, gRPC port) pairs."""
    started: list[Nginx] = []

    def run(edges: list[tuple[int, int]]) -> Entrance:
        prefix = tmp_path / f"nginx-{len(started)}"
        for sub in ("tmp", "logs"):
            (prefix / sub).mkdir(parents=True)
        listen, grpc_listen = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        nginx = Nginx("entry", prefix, "nginx")
        nginx.conf.write_text(config(prefix, listen, 1000, 1000, "1m", temp_dir(prefix),
                                     Entry(grpc_listen=grpc_listen)))
        fleet = Fleet(edges=[Instance(f"edge-{i}", "127.0.0.1", port, (), {"grpc_port": str(g)})
                             for i, (port, g) in enumerate(edges)])
        nginx.upstreams_conf.write_text(upstreams(fleet))
        nginx.start()
        started.append(nginx)
        wait_for(lambda: _up(f"http://{listen}"), 20, "the entry nginx")
        return Entrance(f"http://{listen}", grpc_listen, prefix)

    yield run
    for nginx in started:
        nginx.stop()


def _up(url: str) -> bool:
    try:
        return httpx.get(f"{url}/nginx/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def post(entrance: Entrance) -> httpx.Response:
    return httpx.post(f"{entrance.http}/v2/models/tiny/infer", content=BODY, timeout=30,
                      headers={"content-type": "application/json"})


def test_a_request_cut_by_a_dying_edge_is_answered_by_the_other(entrance: Start) -> None:
    dying, live = Dying(), Peer(200, {"answer": "live"})
    try:
        front = entrance([(dying.port, free_port()), (live.port, free_port())])
        answers = [post(front) for _ in range(6)]
        assert [(a.status_code, a.json()) for a in answers] == [(200, {"answer": "live"})] * 6
        assert dying.attempts >= 1  # nginx did send requests to the dying edge first
        assert live.attempts == 6  # each request answered once, by the live edge
    finally:
        dying.close()
        live.close()


def test_a_request_is_sent_to_two_edges_at_most(entrance: Start) -> None:
    """Three dying edges: two attempts, then the V2 503 (every edge tried, before)."""
    dying = [Dying(), Dying(), Dying()]
    try:
        front = entrance([(d.port, free_port()) for d in dying])
        answer = post(front)
        assert answer.status_code == 503
        assert answer.json() == {"error": "no healthy node could answer; retry shortly"}
        time.sleep(0.2)  # the attempts are counted as the edges read them
        assert sorted(d.attempts for d in dying) == [0, 1, 1]
    finally:
        for d in dying:
            d.close()


def test_an_edges_503_is_tried_on_one_other_and_a_4xx_never(entrance: Start) -> None:
    busy = [Peer(503, {"error": "image decoding pool full"}) for _ in range(3)]
    refused, live = Peer(400, {"error": "bad input"}), Peer(200, {"answer": "live"})
    try:
        answer = post(entrance([(b.port, free_port()) for b in busy]))
        # both tried answer 503: the second one's own V2 body reaches the client
        assert (answer.status_code, answer.json()) == (503, {"error": "image decoding pool full"})
        assert sorted(b.attempts for b in busy) == [0, 1, 1]
        front = entrance([(refused.port, free_port()), (live.port, free_port())])
        answers = [post(front) for _ in range(6)]
        statuses = [a.status_code for a in answers]
        assert set(statuses) == {400, 200}  # some went to each edge first
        assert refused.attempts == statuses.count(400) and live.attempts == statuses.count(200)
    finally:
        for peer in [*busy, refused, live]:
            peer.close()


def tried(entrance: Entrance) -> list[list[str]]:
    """The edges nginx tried for each request passed on so far, from its access log."""
    log = [line for line in (entrance.prefix / "access.log").read_text().splitlines()
           if "/nginx/health" not in line]
    return [re.search(r"upstream=(.*?) rt=", line).group(1).split(", ")  # type: ignore[union-attr]
            for line in log]


def health_check(entrance: Entrance) -> health_pb2.HealthCheckResponse:
    with grpc.insecure_channel(entrance.grpc) as channel:
        return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(),
                                                         timeout=10)


def test_a_grpc_call_to_a_dead_edge_is_retried_once_on_another(entrance: Start) -> None:
    """A killed edge's port refuses: the call goes to another edge, and to two at most. nginx
    streams a gRPC call's body as it comes (``grpc_pass`` never buffers it), so a call whose
    request already reached a dying edge is not sent again: the client gets UNAVAILABLE (which
    gRPC clients may retry)."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    live_port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    dead = [free_port() for _ in range(4)]  # nothing listens there
    cut = [Dying(), Dying()]
    try:
        front = entrance([(free_port(), dead[0]), (free_port(), live_port)])
        for _ in range(6):
            assert health_check(front).status == health_pb2.HealthCheckResponse.SERVING
        routes = tried(front)
        assert [f"127.0.0.1:{dead[0]}", f"127.0.0.1:{live_port}"] in routes  # retried
        assert all(route[-1] == f"127.0.0.1:{live_port}" for route in routes)
        front = entrance([(free_port(), port) for port in dead[1:]])
        with pytest.raises(grpc.RpcError) as failed:
            health_check(front)
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
        [route] = tried(front)
        assert len(route) == 2 and len(set(route)) == 2  # two of the three dead edges
        front = entrance([(free_port(), d.port) for d in cut])
        with pytest.raises(grpc.RpcError) as failed:
            health_check(front)
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
        time.sleep(0.2)
        assert sum(d.attempts for d in cut) == 1
    finally:
        server.stop(0)
        for d in cut:
            d.close()
