"""uvicorn's httptools protocol, writing each response in one send; a uvicorn server that
serves connections handed to it by an acceptor (``--workers N``).

uvicorn writes a response's status line and headers when the app sends
``http.response.start`` and its body on ``http.response.body``: two ``send`` system calls
per response, the first of which (on loopback) delivers a packet with headers alone. Here
the connection's writes are gathered during one turn of the event loop and go out together
at its end; closing the connection sends what is gathered first. Measured on a 2-core EPYC
with the demo model: the writes were a fifth of the event loop's time (py-spy).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from serving.transport import handoff

log = logging.getLogger(__name__)


class _Gathering:
    """A transport that gathers ``write`` calls and sends them as one at the end of the
    loop's turn; everything else is the real transport's."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport, self._loop = transport, loop
        self._pending: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._pending:
            self._loop.call_soon(self._flush)
        self._pending.append(bytes(data))

    def _flush(self) -> None:
        if not self._pending:
            return
        data = b"".join(self._pending) if len(self._pending) > 1 else self._pending[0]
        self._pending.clear()
        if not self._transport.is_closing():
            self._transport.write(data)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class GatheringHttpToolsProtocol(HttpToolsProtocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(_Gathering(transport, self.loop))  # type: ignore[arg-type]


class AdoptingServer(uvicorn.Server):
    """A uvicorn server with no listener of its own: it serves the connections an acceptor
    hands it over ``channel`` (``serving/transport/handoff.py``), each with the same protocol
    uvicorn would have given a connection it accepted, and tells the acceptor when it is ready. On
    shutdown it stops taking connections and drains the ones it has, as uvicorn does."""

    def __init__(self, config: uvicorn.Config, channel: socket.socket) -> None:
        super().__init__(config)
        self.channel = channel

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=[])  # the lifespan (the model loaded), no listener
        if not self.started:
            return
        config, loop = self.config, asyncio.get_running_loop()

        def protocol() -> asyncio.Protocol:
            return config.http_protocol_class(  # type: ignore[call-arg]
                config=config, server_state=self.server_state, app_state=self.lifespan.state)

        listener = _ChannelListener(self.channel, loop, protocol, config.ssl)
        self.servers.append(listener)  # type: ignore[arg-type]  # closed by uvicorn's shutdown
        listener.open()
        handoff.say_ready(self.channel)


class _ChannelListener:
    """Plays the part of an ``asyncio.Server`` for uvicorn's shutdown: ``close`` stops
    adopting connections from the channel."""

    def __init__(self, channel: socket.socket, loop: asyncio.AbstractEventLoop,
                 protocol: Callable[[], asyncio.Protocol], ssl: Any) -> None:
        self.channel, self.loop, self.protocol, self.ssl = channel, loop, protocol, ssl
        self._adopting: set[asyncio.Task[Any]] = set()

    def open(self) -> None:
        self.channel.setblocking(False)
        self.loop.add_reader(self.channel.fileno(), self._receive)

    def _receive(self) -> None:
        while True:
            try:
                sock = handoff.receive(self.channel)
            except BlockingIOError:
                return
            except (EOFError, OSError) as exc:  # the acceptor is gone: nothing more comes
                log.warning("connection channel closed: %s", exc)
                self.close()
                return
            if sock is not None:
                task = self.loop.create_task(self._adopt(sock))
                self._adopting.add(task)
                task.add_done_callback(self._adopting.discard)

    async def _adopt(self, sock: socket.socket) -> None:
        try:
            await self.loop.connect_accepted_socket(self.protocol, sock, ssl=self.ssl)
        except (OSError, ConnectionError) as exc:  # the client left, or a failed handshake
            log.debug("could not adopt a connection: %s", exc)
            sock.close()

    def close(self) -> None:
        if self.channel.fileno() >= 0:
            self.loop.remove_reader(self.channel.fileno())
            self.channel.close()

    async def wait_closed(self) -> None:
        if self._adopting:
            await asyncio.gather(*self._adopting, return_exceptions=True)
