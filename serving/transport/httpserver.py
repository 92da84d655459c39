"""uvicorn's httptools protocol, writing each response in one send and bounding what a
connection may hold. Its connections come from ``serving/transport/listener.py``, which
counts each one as it is accepted, before any TLS handshake.

Bounds (docs/security.md, "Bounded ports"): uvicorn closes a connection only on its keep-alive
timeout, which starts after a response, so a connection that never completes a request's
headers (idle, or trickling them a byte at a time) was never closed. Here a request's headers
must arrive within ``header_timeout_s`` of its first byte (of the connection's opening for the
first, its accept: a TLS handshake is part of that time), its body within ``body_timeout_s``
of its headers, and their size is capped (``MAX_HEADER_BYTES``, else 431). A process holds
at most ``max_connections``, counted from the accept: a new connection beyond it closes the
one that has waited longest for a request's headers (new, still in its TLS handshake, or kept
alive, as nginx reuses idle connections), and when every connection is inside a request it
is closed (on plain HTTP answered 503 with the V2 error JSON first), long before the process
runs out of descriptors. Both the single-process server and the workers (connections handed
on by the acceptor) serve through the same listener and this protocol.

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
import time
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

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
    """Writes gathered (``_Gathering``); with a :class:`BoundedConfig`, served by
    ``listener.BoundedServer`` (which counts each connection as it accepts it), the bounds above.

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
        self.adopting: asyncio.Task[Any] | None = None  # until connection_made (TLS done)

    def accepted(self, adopting: asyncio.Task[Any]) -> None:
        """Counted from the accept (the listener made room): ``adopting`` is the task that
        waits for the client's first byte and the TLS handshake, then calls connection_made."""
        assert self.bounds is not None
        self.adopting = adopting
        self.bounds.admitted[self] = None
        self.waiting()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(_Gathering(transport, self.loop))  # type: ignore[arg-type]
        self.adopting = None

    def close(self) -> None:
        """Close the connection, or stop its adoption (no connection_made yet)."""
        if self.adopting is not None:
            self.adopting.cancel()  # the listener's forget() follows
        elif not self.transport.is_closing():
            self.transport.close()

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
        log.debug("closed a connection that did not send a request in time")
        self.close()

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
        self.forget()

    def forget(self) -> None:
        """Out of the bounds' count: its connection is gone (or its adoption failed, when
        connection_lost never comes)."""
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None
        if self.bounds is not None:
            self.bounds.admitted.pop(self, None)
            self.bounds.waiting.pop(self, None)


def evict(bounds: HttpBounds) -> bool:
    """Close the connection that has waited longest for a request's headers, if any."""
    if not bounds.waiting:
        return False
    oldest = next(iter(bounds.waiting))
    del bounds.waiting[oldest]
    bounds.admitted.pop(oldest, None)
    bounds.evicted += 1
    say(bounds)
    oldest.close()
    return True


def say(bounds: HttpBounds) -> None:
    now = time.monotonic()
    if now - bounds.said_at >= SAY_EVERY_S:
        bounds.said_at = now
        log.warning("at the connection cap (%d): %d waiting connections closed to make room, "
                    "%d new ones refused (503, or closed before TLS) so far",
                    bounds.max_connections,
                    bounds.evicted, bounds.refused)
