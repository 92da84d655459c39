"""``--workers N`` settings: the cores shared out as intra-op threads, a fixed port, the
acceptor's socket."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from pydantic import ValidationError

from serving.config import environment
from serving.config.settings import ServingSettings
from serving.transport import workers


def test_threads_are_the_usable_cores_shared_out_unless_set(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workers, "usable_cores", lambda: 16)
    assert workers.threads_per_worker(0, 1) == 0  # one worker: the runtime's own default
    assert workers.threads_per_worker(0, 4) == 4
    assert workers.threads_per_worker(0, 32) == 1  # never 0 threads
    assert workers.threads_per_worker(3, 4) == 3  # as set


def test_several_workers_need_a_fixed_port() -> None:
    with pytest.raises(ValidationError, match="fixed port"):
        ServingSettings(workers=2, port=0)
    assert ServingSettings(workers=2, port=8123).workers == 2


def test_the_acceptor_socket_holds_the_port_but_refuses_until_a_worker_is_ready() -> None:
    sock = workers.listen("127.0.0.1", 0)
    port = sock.getsockname()[1]
    try:
        with socket.socket() as plain, pytest.raises(OSError):  # the port is taken
            plain.bind(("127.0.0.1", port))
        with socket.socket() as client, pytest.raises(ConnectionRefusedError):
            client.connect(("127.0.0.1", port))  # not listening yet: refused, not hanging
    finally:
        sock.close()


def test_the_worker_index_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(environment.WORKER, raising=False)
    assert environment.worker_index() is None
    monkeypatch.setenv(environment.WORKER, "3")
    assert environment.worker_index() == 3
    assert environment.worker_index(environment.for_worker(1, Path("/x"), 7)) == 1
    assert environment.channel_fd(environment.for_worker(1, Path("/x"), 7)) == 7
