"""The HTTP protocol that sends each response in one write: real uvicorn on loopback, a small
ASGI app, keep-alive and ``Connection: close`` requests, a large streamed body. Its bounds
(header and body timeouts, the connection cap counted from the accept, before TLS) on the
tier's own server (:class:`BoundedServer` on a listening socket), plain and TLS; the attacks
themselves are in tests/integration/test_bounded_ports.py."""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from registry.trust import pki
from serving.transport import workers
from serving.transport.httpserver import BoundedConfig, GatheringHttpToolsProtocol, _Gathering
from serving.transport.listener import BoundedServer, ListeningSocket
from serving.transport.ports import HttpBounds

BIG = 3 * 1024 * 1024


async def app(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    if scope["path"] == "/early":  # refused before its body is read (as a 413 for size is)
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    if scope["path"] == "/big":  # streamed in chunks, past the transport's write buffer
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(BIG).encode())]})
        chunk = b"x" * (256 * 1024)
        for i in range(BIG // len(chunk)):
            await send({"type": "http.response.body", "body": chunk,
                        "more_body": i < BIG // len(chunk) - 1})
        return
    answer = b"echo:" + body
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(answer)).encode())]})
    await send({"type": "http.response.body", "body": answer})


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    yield from serve(uvicorn.Config(app, loop="asyncio", http=GatheringHttpToolsProtocol,
                                    log_config=None, access_log=False))


def serve(config: uvicorn.Config) -> Iterator[str]:
    """``config`` served on a free loopback port: under uvicorn's own server, or the tier's
    (:class:`BoundedServer`) for a :class:`BoundedConfig`."""
    sock = workers.listen("127.0.0.1", 0)
    port = sock.getsockname()[1]
    server: uvicorn.Server
    if isinstance(config, BoundedConfig):
        server = BoundedServer(config, ListeningSocket(sock))
        thread = threading.Thread(target=server.run, daemon=True)
    else:
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        for _ in range(200):
            if server.started:
                break
            threading.Event().wait(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def test_responses_arrive_whole_on_kept_alive_and_closed_connections(url: str) -> None:
    with httpx.Client() as client:
        for i in range(20):  # one connection, kept alive
            assert client.post(f"{url}/echo", content=f"r{i}").text == f"echo:r{i}"
        closed = client.post(f"{url}/echo", content="last", headers={"Connection": "close"})
        assert closed.text == "echo:last"  # gathered, then sent before the close
        big = client.get(f"{url}/big")
        assert big.status_code == 200 and len(big.content) == BIG


class Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str) -> str:
        return f"info:{name}"


def test_writes_of_one_loop_turn_go_out_as_one() -> None:
    async def main() -> Transport:
        real = Transport()
        gathering = _Gathering(real, asyncio.get_running_loop())  # type: ignore[arg-type]
        gathering.write(b"HTTP/1.1 200 OK\r\n\r\n")
        gathering.write(b"body")
        assert real.writes == []  # not yet: at the end of this turn
        await asyncio.sleep(0)
        assert real.writes == [b"HTTP/1.1 200 OK\r\n\r\nbody"]
        gathering.write(b"more")
        gathering.close()  # what is gathered goes first
        assert real.writes[-1] == b"more" and real.closed
        assert gathering.get_extra_info("peername") == "info:peername"
        return real

    asyncio.run(main())


CAP, TIMEOUT_S = 4, 1.0


@pytest.fixture
def bounded() -> Iterator[tuple[str, HttpBounds]]:
    """A server with cap 4, header and body timeouts of 1 s, keep-alive 30 s (so a close within
    a few seconds is the header timeout's): its address and bounds."""
    bounds = HttpBounds(TIMEOUT_S, TIMEOUT_S, CAP)
    config = BoundedConfig(app, bounds, loop="asyncio", http=GatheringHttpToolsProtocol,
                           log_config=None, access_log=False, timeout_keep_alive=30)
    for url in serve(config):
        yield url.removeprefix("http://"), bounds


def dial(address: str) -> socket.socket:
    host, port = address.split(":")
    return socket.create_connection((host, int(port)), timeout=5)


def closed_after(sock: socket.socket) -> float:
    """Seconds until the server closes ``sock`` (reading and dropping what it sends)."""
    started = time.monotonic()
    while sock.recv(4096):
        pass
    return time.monotonic() - started


def open_still(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1, socket.MSG_PEEK) != b""
    except BlockingIOError:
        return True
    finally:
        sock.setblocking(True)


def test_a_kept_alive_connection_must_send_its_next_headers_in_time(
        bounded: tuple[str, HttpBounds]) -> None:
    address, _ = bounded
    with dial(address) as sock:
        sock.sendall(b"GET /echo HTTP/1.1\r\nHost: t\r\n\r\n")
        assert sock.recv(4096).endswith(b"echo:")
        sock.sendall(b"GET /echo HTTP/1.1\r\nHo")  # the next request, half sent
        assert closed_after(sock) < TIMEOUT_S + 1.5  # not keep-alive's 30 s


def test_the_rest_of_a_body_answered_early_is_not_taken_for_the_next_request_s_headers(
        bounded: tuple[str, HttpBounds]) -> None:
    """An early answer (413 before the body is read) ends the response while the request's
    body still arrives: those bytes are that request's, not 431-sized headers of the next."""
    address, _ = bounded
    size = 300_000
    with dial(address) as sock:
        sock.sendall(b"POST /early HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % size)
        assert sock.recv(4096).startswith(b"HTTP/1.1 413")
        for start in range(0, size, 65536):
            sock.sendall(b"x" * min(65536, size - start))
        sock.sendall(b"GET /echo HTTP/1.1\r\nHost: t\r\n\r\n")
        answer = sock.recv(4096)
        assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"echo:"), answer[:80]


def test_a_body_in_time_is_served_one_too_slow_is_cut(bounded: tuple[str, HttpBounds]) -> None:
    address, _ = bounded
    head = b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n"
    with dial(address) as sock:
        sock.sendall(head)
        time.sleep(TIMEOUT_S / 2)
        sock.sendall(b"ok")
        assert sock.recv(4096).endswith(b"echo:ok")
    with dial(address) as sock:
        sock.sendall(head + b"o")
        assert closed_after(sock) < TIMEOUT_S + 1.5


def test_at_the_cap_the_longest_waiting_connection_makes_room(
        bounded: tuple[str, HttpBounds]) -> None:
    address, bounds = bounded
    idle = [dial(address) for _ in range(CAP)]
    try:
        time.sleep(0.2)
        with dial(address) as sock:  # one more, with a request: served
            sock.sendall(b"GET /echo HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        assert closed_after(idle[0]) < 0.5  # the oldest was closed for it
        assert all(open_still(sock) for sock in idle[1:])
        assert bounds.evicted == 1 and bounds.refused == 0
    finally:
        for sock in idle:
            sock.close()


def test_at_the_cap_with_every_connection_in_a_request_one_more_gets_503(
        bounded: tuple[str, HttpBounds]) -> None:
    address, bounds = bounded
    held = [dial(address) for _ in range(CAP)]
    try:
        for sock in held:
            sock.sendall(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 9\r\n\r\n")
        time.sleep(0.2)
        with dial(address) as sock:
            answer = sock.recv(4096)
            assert answer.startswith(b"HTTP/1.1 503")
            assert answer.endswith(b'{"error":"too many connections; retry"}\n')
            assert closed_after(sock) < 0.5
        assert bounds.refused == 1 and len(bounds.admitted) == CAP
    finally:
        for sock in held:
            sock.close()


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[tuple[str, HttpBounds, ssl.SSLContext]]:
    """The bounded server over TLS, on uvloop as the tiers run it: its address, bounds and a
    client context trusting its certificate."""
    cert, key = pki.server(tmp_path, "center", ["127.0.0.1"])
    bounds = HttpBounds(TIMEOUT_S, TIMEOUT_S, CAP)
    config = BoundedConfig(app, bounds, loop="uvloop", http=GatheringHttpToolsProtocol,
                           log_config=None, access_log=False, timeout_keep_alive=30,
                           ssl_certfile=cert, ssl_keyfile=key)
    client = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
    for url in serve(config):
        yield url.removeprefix("http://"), bounds, client


def test_silent_connections_to_a_tls_port_are_counted_from_the_accept_and_closed_in_time(
        secured: tuple[str, HttpBounds, ssl.SSLContext]) -> None:
    """Connections that never start TLS (or stop inside its handshake) take a place under the
    cap from their accept: beyond it each new one closes the oldest at once, the rest are
    closed by the header timeout from their accept (still open shortly before it), and a
    TLS request among them is served. uvicorn's own listener waited 60 s for each handshake
    and counted none of them."""
    address, bounds, client = secured
    host, port = address.split(":")
    silent = [dial(address) for _ in range(3 * CAP)]
    started = time.monotonic()
    silent[-1].sendall(b"\x16\x03\x01")  # a handshake's first bytes, then nothing
    try:
        time.sleep(0.2)
        assert len(bounds.admitted) == CAP and bounds.evicted == 2 * CAP
        assert all(closed_after(sock) < 0.5 for sock in silent[:2 * CAP])  # made room at once
        with httpx.Client(verify=client, timeout=5) as http:  # one more: room made, served
            assert http.get(f"https://{host}:{port}/echo").text == "echo:"
        assert bounds.evicted == 2 * CAP + 1
        time.sleep(max(0.0, started + TIMEOUT_S - 0.3 - time.monotonic()))
        assert all(open_still(sock) for sock in silent[2 * CAP + 1:])  # just inside
        assert all(closed_after(sock) < TIMEOUT_S + 1.0 for sock in silent[2 * CAP + 1:])
        assert time.monotonic() - started < TIMEOUT_S + 1.0  # just outside: all closed
        time.sleep(0.1)
        assert not bounds.admitted and not bounds.waiting
    finally:
        for sock in silent:
            sock.close()
