"""Where a tier process's HTTP connections come from, bounded before TLS (docs/security.md,
"Bounded ports"): the tier's own listening socket (one process), or the channel the
``--workers`` acceptor hands connections over (``serving/transport/handoff.py``).

uvicorn's own listener (``loop.create_server``) starts every TLS handshake the moment it
accepts, waits up to uvloop's default 60 s for it, and tells the HTTP protocol of a
connection only once the handshake is done: a client that opens TCP connections and never
sends a byte held a descriptor and a TLS state each for a minute, past any cap counted
in ``connection_made``. Here a connection counts against ``max_connections`` from the moment
it is accepted: at the cap it closes the connection waiting longest for a request's headers
(a handshake not finished is one), or, when every one is inside a request, is closed at once
(answered 503 first on plain HTTP) without a handshake. Its header timeout runs from the
accept and covers the handshake; no TLS state is made until the client sends its first byte.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import socket
from collections.abc import Callable
from typing import Any, Protocol

import uvicorn

from serving.transport import handoff
from serving.transport.httpserver import (
    REFUSED,
    BoundedConfig,
    GatheringHttpToolsProtocol,
    evict,
    say,
)

log = logging.getLogger(__name__)
BACKLOG = 2048  # uvicorn's default
ACCEPT_BATCH = 64  # connections taken per wake-up before the loop runs anything else
RETRY_S = 1.0  # asyncio's own pause after an accept fails for lack of descriptors


class Source(Protocol):
    """What connections arrive through: ``take`` one (BlockingIOError when none is waiting),
    ``ready`` once the process serves."""

    def fileno(self) -> int: ...

    def take(self) -> socket.socket | None: ...

    def ready(self) -> None: ...

    def close(self) -> None: ...


class ListeningSocket:
    """The tier's socket (``workers.listen``: bound, not yet listening): listening once the
    process is ready, so connections are refused while the model loads."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def fileno(self) -> int:
        return self.sock.fileno()

    def take(self) -> socket.socket | None:
        connection, _ = self.sock.accept()
        connection.setblocking(False)
        with contextlib.suppress(OSError):
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return connection

    def ready(self) -> None:
        self.sock.setblocking(False)
        self.sock.listen(BACKLOG)
        host, port = self.sock.getsockname()[:2]
        log.info("serving on %s:%d", host, port)

    def close(self) -> None:
        self.sock.close()


class Channel:
    """The acceptor's channel (``--workers``): connections handed over, and READY said back."""

    def __init__(self, channel: socket.socket) -> None:
        self.channel = channel
        channel.setblocking(False)

    def fileno(self) -> int:
        return self.channel.fileno()

    def take(self) -> socket.socket | None:
        try:
            return handoff.receive(self.channel)
        except BlockingIOError:
            raise
        except OSError as exc:  # broken: as good as closed
            raise EOFError(str(exc)) from exc

    def ready(self) -> None:
        handoff.say_ready(self.channel)

    def close(self) -> None:
        self.channel.close()


class BoundedServer(uvicorn.Server):
    """A uvicorn server whose connections come from ``source`` through a :class:`Listener`,
    each with the protocol uvicorn would have given it. On shutdown it stops taking
    connections and drains the ones it has, as uvicorn does."""

    def __init__(self, config: BoundedConfig, source: Source) -> None:
        super().__init__(config)
        self.source = source

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=[])  # the lifespan (the model loaded), no listener
        if not self.started:
            return
        config = self.config
        assert isinstance(config, BoundedConfig)

        def protocol() -> GatheringHttpToolsProtocol:  # the one whose bounds the listener keeps
            return GatheringHttpToolsProtocol(config=config, server_state=self.server_state,
                                              app_state=self.lifespan.state)

        listener = Listener(self.source, protocol, config)
        self.servers.append(listener)  # type: ignore[arg-type]  # closed by uvicorn's shutdown
        listener.open()
        self.source.ready()


class Listener:
    """Takes connections from a :class:`Source`, counts each against the cap as it arrives and
    adopts it into the event loop (TLS included). Plays the part of an ``asyncio.Server`` for
    uvicorn's shutdown: ``close`` stops taking connections."""

    def __init__(self, source: Source, protocol: Callable[[], GatheringHttpToolsProtocol],
                 config: BoundedConfig) -> None:
        self.source, self.protocol, self.bounds = source, protocol, config.bounds
        self.ssl = config.ssl
        self.loop = asyncio.get_running_loop()
        self._adopting: set[asyncio.Task[Any]] = set()
        self.closed = False

    def open(self) -> None:
        if not self.closed:
            self.loop.add_reader(self.source.fileno(), self._take)

    def _take(self) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                sock = self.source.take()
            except BlockingIOError:
                return
            except ConnectionError:  # the client left before it was accepted
                continue
            except EOFError as exc:  # the acceptor is gone: nothing more comes
                log.warning("connection channel closed: %s", exc)
                self.close()
                return
            except OSError as exc:  # out of descriptors: try again shortly, not in a spin
                log.warning("could not take a connection: %s", exc)
                self.loop.remove_reader(self.source.fileno())
                self.loop.call_later(RETRY_S, self.open)
                return
            if sock is not None:
                self.admit(sock)

    def admit(self, sock: socket.socket) -> None:
        """Counted now; at the cap, room made or the connection closed unserved."""
        b = self.bounds
        if len(b.admitted) >= b.max_connections and not evict(b):
            b.refused += 1
            say(b)
            if self.ssl is None:
                with contextlib.suppress(OSError):
                    sock.send(REFUSED)
            sock.close()
            return
        protocol = self.protocol()
        task = self.loop.create_task(self._adopt(sock, protocol))
        self._adopting.add(task)
        task.add_done_callback(functools.partial(self._adopted, sock, protocol))
        protocol.accepted(task)

    async def _adopt(self, sock: socket.socket, protocol: GatheringHttpToolsProtocol) -> None:
        if self.ssl is not None:
            await self._first_byte(sock)
        await self.loop.connect_accepted_socket(
            lambda: protocol, sock, ssl=self.ssl,
            ssl_handshake_timeout=self.bounds.header_timeout_s if self.ssl else None)

    def _adopted(self, sock: socket.socket, protocol: GatheringHttpToolsProtocol,
                 task: asyncio.Task[None]) -> None:
        """A failed adoption (the client left, a failed handshake) or one stopped (by the cap
        or the header timeout, perhaps before it began) releases its place and its socket."""
        self._adopting.discard(task)
        failed = task.cancelled() or task.exception()
        if failed:
            unexpected = isinstance(failed, Exception) and not isinstance(failed, OSError)
            log.log(logging.WARNING if unexpected else logging.DEBUG,
                    "could not adopt a connection: %r", failed)
            protocol.forget()
            sock.close()

    async def _first_byte(self, sock: socket.socket) -> None:
        """Until the client sends something: a silent connection costs a descriptor, not a
        TLS state (51 KB each under uvloop, measured)."""
        readable = self.loop.create_future()

        def wake() -> None:
            if not readable.done():  # the reader fires each turn until it is removed
                readable.set_result(None)

        self.loop.add_reader(sock.fileno(), wake)
        try:
            await readable
        finally:
            self.loop.remove_reader(sock.fileno())

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            with contextlib.suppress(ValueError, OSError):  # already closed
                self.loop.remove_reader(self.source.fileno())
            self.source.close()

    async def wait_closed(self) -> None:
        if self._adopting:
            await asyncio.gather(*self._adopting, return_exceptions=True)
