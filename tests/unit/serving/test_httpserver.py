"""The HTTP protocol that sends each response in one write: real uvicorn on loopback, a small
ASGI app, keep-alive and ``Connection: close`` requests, a large streamed body."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn

from serving.transport.httpserver import GatheringHttpToolsProtocol, _Gathering

BIG = 3 * 1024 * 1024


async def app(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
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
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, loop="asyncio", http=GatheringHttpToolsProtocol,
                            log_config=None, access_log=False)
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
