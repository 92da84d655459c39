"""uvicorn's httptools protocol, writing each response in one send and bounding what a
connection may hold; a uvicorn server that serves connections handed to it by an acceptor
(``--workers N``).

Bounds (docs/security.md, "Bounded ports"): uvicorn closes a connection only on its keep-alive
timeout, which starts after a response, so a connection that never completes a request's
headers (idle, or trickling them a byte at a time) was never closed. Here a request's headers
must arrive within ``header_timeout_s`` of its first byte (of the connection's opening for the
first), its body within ``body_timeout_s`` of its headers, and their size is capped
(``MAX_HEADER_BYTES``, else 431). A process holds at most ``max_connections``: a new
connection beyond it closes the one that has waited longest for a request's headers (new or
kept alive, as nginx reuses idle connections), and when every connection is inside a request
it is answered 503 with the V2 error JSON and closed, long before the process runs out of
descriptors. Both the single-process server and the workers (connections handed on by the
acceptor) use this protocol.

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
import time
from collections.abc import Callable
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from serving.transport import handoff
from serving.transport.ports import HttpBounds

log = logging.getLogger(__name__)
MAX_HEADER_BYTES = 64 * 1024  # request line and headers; nginx's default allows 32 KiB
SAY_EVERY_S = 10.0
REFUSED = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
           b"retry-after: 1\r\nconnection: close\r\ncontent-length: 40\r\n\r\n"
           b'{"error":"too many connections; retry"}\n')
TOO_LARGE = (b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
             b"connection: close\r\ncontent-length: 37\r\n\r\n"
             b'{"error":"request headers too large"}')


class BoundedConfig(uvicorn.Config):
    """uvicorn's settings and the bounds every connection's protocol applies."""

    def __init__(self, app: Any, bounds: HttpBounds, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self.bounds = bounds


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
    """Writes gathered (``_Gathering``); with a :class:`BoundedConfig`, the bounds above.

    Why one class: its methods are the callbacks uvicorn's protocol already gets from the
    transport and the parser (a connection's opening, its bytes, a request's headers and end, a
    response's end, its closing); each bound needs a word in several of them."""

    def __init__(self, config: uvicorn.Config, server_state: ServerState,
                 app_state: dict[str, Any], _loop: asyncio.AbstractEventLoop | None = None,
                 ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.bounds = config.bounds if isinstance(config, BoundedConfig) else None
        self.deadline: asyncio.TimerHandle | None = None
        self.reading_headers, self.header_bytes = True, 0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(_Gathering(transport, self.loop))  # type: ignore[arg-type]
        b = self.bounds
        if b is None:
            return
        if len(b.admitted) >= b.max_connections and not _evict(b):
            b.refused += 1
            _say(b)
            self.connections.discard(self)
            self.transport.write(REFUSED)
            self.transport.close()
            return
        b.admitted[self] = None
        self.waiting()

    def waiting(self) -> None:
        """Waiting for a request's headers: evictable, and they must come in time."""
        assert self.bounds is not None
        self.bounds.waiting.pop(self, None)
        self.bounds.waiting[self] = None  # the newest
        self.arm(self.bounds.header_timeout_s)

    def arm(self, seconds: float) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
        self.deadline = self.loop.call_later(seconds, self.expired)

    def expired(self) -> None:
        self.deadline = None
        if not self.transport.is_closing():
            log.debug("closed a connection that did not send a request in time")
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        reading = self.bounds is not None and self.reading_headers
        if reading:
            self.header_bytes += len(data)
        super().data_received(data)
        if self.bounds is None or self.transport.is_closing():
            return
        if reading and self.reading_headers and self.header_bytes > MAX_HEADER_BYTES:
            self.transport.write(TOO_LARGE)  # headers still not complete past the cap
            self.transport.close()
        # the next request's first bytes on a kept-alive connection (uvicorn's keep-alive
        # timeout is off again): its headers must now come in time
        elif (self.deadline is None and self.timeout_keep_alive_task is None
              and (self.cycle is None or self.cycle.response_complete)):
            self.waiting()

    def on_message_begin(self) -> None:
        # a request's headers start here: counted from now (not from the end of the last
        # response, which an early 413 sends while that request's body is still arriving:
        # its bytes were counted as the next request's headers and answered 431)
        super().on_message_begin()
        if not self.reading_headers:  # a connection's first request was counted from its start
            self.reading_headers, self.header_bytes = True, 0

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self.reading_headers, self.header_bytes = False, 0
        if self.bounds is not None:
            self.bounds.waiting.pop(self, None)
            self.arm(self.bounds.body_timeout_s)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.bounds is not None and self.timeout_keep_alive_task is not None:
            self.bounds.waiting.pop(self, None)  # kept alive: evictable, newest
            self.bounds.waiting[self] = None

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None
        if self.bounds is not None:
            self.bounds.admitted.pop(self, None)
            self.bounds.waiting.pop(self, None)


def _evict(bounds: HttpBounds) -> bool:
    """Close the connection that has waited longest for a request's headers, if any."""
    if not bounds.waiting:
        return False
    oldest = next(iter(bounds.waiting))
    del bounds.waiting[oldest]
    bounds.admitted.pop(oldest, None)
    bounds.evicted += 1
    _say(bounds)
    oldest.transport.close()
    return True


def _say(bounds: HttpBounds) -> None:
    now = time.monotonic()
    if now - bounds.said_at >= SAY_EVERY_S:
        bounds.said_at = now
        log.warning("at the connection cap (%d): %d waiting connections closed to make room, "
                    "%d connections answered 503 so far", bounds.max_connections,
                    bounds.evicted, bounds.refused)


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
        if isinstance(config, BoundedConfig):  # a TLS handshake is part of the header time
            listener.handshake_timeout = config.bounds.header_timeout_s
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
        self.handshake_timeout: float | None = None  # asyncio's default (60 s) when None

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
            await self.loop.connect_accepted_socket(
                self.protocol, sock, ssl=self.ssl,
                ssl_handshake_timeout=self.handshake_timeout if self.ssl else None)
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
