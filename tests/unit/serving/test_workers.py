"""``--workers N`` settings: the cores shared out as intra-op threads, a fixed port."""

from __future__ import annotations

import socket

import pytest
from pydantic import ValidationError

from serving import workers
from serving.settings import ServingSettings


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


def test_two_sockets_bind_the_same_port() -> None:
    first = workers.reuse_port_socket("127.0.0.1", 0)
    port = first.getsockname()[1]
    try:
        second = workers.reuse_port_socket("127.0.0.1", port)
        second.close()
        with socket.socket() as plain, pytest.raises(OSError):  # without SO_REUSEPORT: taken
            plain.bind(("127.0.0.1", port))
    finally:
        first.close()


def test_the_worker_index_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(workers.WORKER, raising=False)
    assert workers.index() is None
    monkeypatch.setenv(workers.WORKER, "3")
    assert workers.index() == 3
