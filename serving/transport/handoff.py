"""Accepted connections handed from one process to another over a Unix socket pair.

``--workers N`` (``serving/transport/workers.py``) has one acceptor: the supervisor accepts every
TCP connection and passes its file descriptor (SCM_RIGHTS) to the next worker in turn, over a
``SOCK_SEQPACKET`` pair it made for that worker; the worker adopts the descriptor into its
event loop as if its own listener had accepted it. A worker says ``READY`` on the same pair
once it serves, so nothing is handed to a worker still loading its model.

A descriptor that arrives here is a connection from the network and nothing more: the bytes
that travel with it are ignored, and one that is not a stream socket is closed unused.
"""

from __future__ import annotations

import contextlib
import os
import socket

READY = b"ready"
TAG = b"c"  # one byte travels with each descriptor (a message cannot be empty)


def pair() -> tuple[socket.socket, socket.socket]:
    """(the acceptor's end, non-blocking; the worker's end, inheritable)."""
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    mine.setblocking(False)
    theirs.set_inheritable(True)
    return mine, theirs


def send(channel: socket.socket, connection: socket.socket) -> None:
    """Pass ``connection`` on; raises BlockingIOError when the worker's queue is full and
    OSError (BrokenPipeError, ...) when the worker is gone."""
    socket.send_fds(channel, [TAG], [connection.fileno()])


def receive(channel: socket.socket) -> socket.socket | None:
    """The next connection handed over; None when the message carried none (``READY``, or
    anything else). Raises BlockingIOError when nothing is queued, EOFError when the acceptor
    is gone."""
    data, fds, _flags, _ = socket.recv_fds(channel, 16, 1)
    if not data and not fds:
        raise EOFError("the acceptor closed the channel")
    adopted = None
    for fd in fds:
        if adopted is None:
            adopted = _stream_socket(fd)
        else:  # at most one was asked for; never leak a descriptor
            os.close(fd)
    return adopted


def _stream_socket(fd: int) -> socket.socket | None:
    """``fd`` as a non-blocking socket when it is a connected stream socket; else closed."""
    try:
        sock = socket.socket(fileno=fd)  # family and type read from the descriptor itself
    except OSError:  # not a socket at all
        os.close(fd)
        return None
    if sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET,
                                                              socket.AF_INET6):
        sock.close()
        return None
    try:
        sock.getpeername()
    except OSError:  # not connected (or already reset by the client): nothing to serve
        sock.close()
        return None
    sock.setblocking(False)
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def say_ready(channel: socket.socket) -> None:
    with contextlib.suppress(OSError):  # the acceptor is gone: PDEATHSIG stops us anyway
        channel.send(READY)
