"""The channel that hands accepted connections to a worker (``--workers N``)."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest

from serving.transport import handoff


@pytest.fixture
def channel() -> Iterator[tuple[socket.socket, socket.socket]]:
    mine, theirs = handoff.pair()
    theirs.setblocking(False)
    yield mine, theirs
    mine.close()
    theirs.close()


def connected() -> tuple[socket.socket, socket.socket]:
    """(the client's end, the accepted end) of a loopback TCP connection."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        accepted, _ = server.accept()
    return client, accepted


def test_a_handed_connection_serves_the_client_in_the_worker(
        channel: tuple[socket.socket, socket.socket]) -> None:
    mine, theirs = channel
    client, accepted = connected()
    with accepted:  # the acceptor's copy is closed once handed on
        handoff.send(mine, accepted)
    with client:
        adopted = handoff.receive(theirs)
        assert adopted is not None
        with adopted:
            client.sendall(b"ping")
            adopted.setblocking(True)
            assert adopted.recv(4) == b"ping"
            adopted.sendall(b"pong")
            assert client.recv(4) == b"pong"


def test_a_descriptor_that_is_no_tcp_connection_is_closed_unused(
        channel: tuple[socket.socket, socket.socket]) -> None:
    mine, theirs = channel
    read, write = os.pipe()
    try:
        socket.send_fds(mine, [handoff.TAG], [read])
        before = set(os.listdir("/proc/self/fd"))
        assert handoff.receive(theirs) is None
        assert set(os.listdir("/proc/self/fd")) <= before  # the received copy is closed
    finally:
        os.close(read)
        os.close(write)


def test_ready_is_heard_and_a_gone_acceptor_is_the_end(
        channel: tuple[socket.socket, socket.socket]) -> None:
    mine, theirs = channel
    handoff.say_ready(theirs)
    assert mine.recv(16) == handoff.READY
    mine.send(b"anything else")  # carries no connection: nothing to adopt
    assert handoff.receive(theirs) is None
    with pytest.raises(BlockingIOError):  # nothing queued
        handoff.receive(theirs)
    mine.close()
    with pytest.raises(EOFError):
        handoff.receive(theirs)


def test_a_gone_worker_breaks_the_send(channel: tuple[socket.socket, socket.socket]) -> None:
    mine, theirs = channel
    theirs.close()
    client, accepted = connected()
    with client, accepted, pytest.raises(OSError):
        handoff.send(mine, accepted)
