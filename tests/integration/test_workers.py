"""``--workers N``: one acceptor hands connections to the workers in turn, one supervisor
restarts and stops them all; /metrics sums every worker's counts, worker 0's quality reports
every worker's traffic."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from harness.processes import start_registry
from tests.conftest import RegistryCli
from tests.servers import Server, start
from tiered.commands import BIN, tier_argv

pytestmark = [pytest.mark.slow, pytest.mark.integration]
CONNECTIONS, PER_CONNECTION = 4, 5
TOKEN = "test-token-0123456789"
# the spawned tier runs the code under test, also from a checkout not installed in the venv
ENV = {"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {}


@pytest.fixture
def stores(tiny_stores: Path) -> Path:
    return tiny_stores


def children(server: Server) -> list[psutil.Process]:
    return psutil.Process(server.process.pid).children()


def served(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    found = re.search(r'^edge_request_success_total\{model="tiny",version="1"\} (\S+)$', text,
                      re.M)
    return float(found.group(1)) if found else 0.0


def body(text: str) -> dict[str, Any]:
    return {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [text]}]}


def infer(url: str, text: str) -> httpx.Response:
    with httpx.Client(timeout=30) as client:  # a new connection each time
        return client.post(f"{url}/v2/models/tiny/infer", json=body(text))


def keep_alive(url: str, connections: int, requests: int) -> None:
    """``connections`` kept-alive clients, opened one after the other, ``requests`` each."""
    clients = [httpx.Client(timeout=30) for _ in range(connections)]
    try:
        for k in range(requests):
            for client in clients:
                response = client.post(f"{url}/v2/models/tiny/infer", json=body(f"review {k}"))
                assert response.status_code == 200, response.text
    finally:
        for client in clients:
            client.close()


def access_lines(server: Server) -> list[dict[str, Any]]:
    lines = [json.loads(x) for x in server.log.read_text().splitlines() if x[:1] == "{"]
    return [x for x in lines if x["logger"] == "serving.access" and x["msg"].startswith("POST")]


def workers_by_connection(lines: list[dict[str, Any]]) -> dict[str, set[int]]:
    out: dict[str, set[int]] = {}
    for x in lines:
        out.setdefault(x["client"], set()).add(x["worker"])
    return out


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.2)


def wait_all_ready(server: Server, workers: int = 2) -> None:
    """Until every worker has started serving (the acceptor hands a worker connections only
    then; the tier answers ready as soon as one does)."""
    def started() -> int:
        return sum(1 for x in server.log.read_text().splitlines()
                   if '"Application startup complete."' in x)

    wait_for(lambda: started() >= workers, f"{workers} workers to start serving")


def test_workers_take_connections_in_turn_restart_and_stop_together(
        stores: Path, tmp_path: Path) -> None:
    server = start("edge", stores / "edge", tmp_path, "--workers", "2", "--cache-size", "0",
                   "--threads", "0", "--access-log", "true", env=ENV)
    try:
        workers = children(server)
        assert len(workers) == 2
        log = server.log.read_text()
        cores = len(os.sched_getaffinity(0))
        assert f"starting 2 workers, {max(1, cores // 2)} intra-op threads each; one " \
               f"acceptor" in log
        wait_all_ready(server)
        # four kept-alive connections: two to each worker, each served by one worker only
        keep_alive(server.url, CONNECTIONS, PER_CONNECTION)
        by_connection = workers_by_connection(access_lines(server))
        assert len(by_connection) == CONNECTIONS
        assert all(len(w) == 1 for w in by_connection.values()), by_connection
        assert Counter(next(iter(w)) for w in by_connection.values()) == {0: 2, 1: 2}
        # /metrics counts every answer, whichever worker is asked
        assert served(server.url) == CONNECTIONS * PER_CONNECTION

        workers[1].send_signal(signal.SIGKILL)  # a worker dies: its share goes to worker 0
        for i in range(10):
            response = infer(server.url, f"while one is down {i}")
            assert response.status_code == 200, response.text
        wait_for(lambda: len(children(server)) == 2 and workers[1].pid not in
                 [w.pid for w in children(server)], "the dead worker to be replaced")
        seen = len(access_lines(server))

        def both_answer() -> bool:  # once the new worker is ready, it takes its turns again
            keep_alive(server.url, 2, 1)
            return {x["worker"] for x in access_lines(server)[seen:]} == {0, 1}

        wait_for(both_answer, "the restarted worker to take connections")
    finally:
        pids = [w.pid for w in children(server)]
        server.stop()
    assert server.process.returncode == 0
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"


def test_quality_reports_count_every_workers_traffic(tmp_path: Path, tiny_release: Path,
                                                     stores: Path) -> None:
    """Only worker 0 reports to the registry; the requests the registry counts for the node
    are all of them, the other worker's too."""
    cli = RegistryCli(tmp_path / "registry")
    cli("publish", tiny_release, "--name", "tiny")
    registry = start_registry(cli.home, tmp_path, TOKEN,
                              env={"REGISTRY_REPORT_INTERVAL_S": "0.5"})
    try:
        # a store holding the release already: both workers serve it from the start
        shutil.copytree(stores / "edge", tmp_path / "edge")
        server = start("edge", tmp_path / "edge", tmp_path, "--workers", "2", "--cache-size",
                       "0", "--registry", registry.target, "--sync-backoff-max-s", "1",
                       "--access-log", "true", registry_secret=TOKEN, env=ENV)
        try:
            wait_all_ready(server)
            keep_alive(server.url, CONNECTIONS, PER_CONNECTION)
            answered = {x["worker"] for x in access_lines(server)}
            assert answered == {0, 1}
            node = f"edge-{server.port}"

            def counted() -> float:
                text = httpx.get(registry.metrics_url, timeout=5).text
                found = re.search(rf'^registry_node_requests_total\{{[^}}]*node="{node}"'
                                  rf'[^}}]*\}} (\S+)$', text, re.M)
                return float(found.group(1)) if found else 0.0

            wait_for(lambda: counted() == CONNECTIONS * PER_CONNECTION,
                     f"the registry to count all {CONNECTIONS * PER_CONNECTION} requests")
        finally:
            server.stop()
    finally:
        registry.stop()


def test_a_taken_port_stops_the_supervisor_with_an_error(stores: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = tier_argv("edge", port, stores / "edge", "edge-stuck", "--workers", "2")
        result = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                                env={"PATH": str(BIN), **ENV})
    assert result.returncode != 0
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr


def test_workers_that_cannot_start_stop_the_supervisor_with_an_error(stores: Path) -> None:
    """Worker 0 cannot open its gRPC port (taken): the supervisor gives up after three quick
    deaths in a row instead of restarting it forever."""
    with socket.socket() as taken, socket.socket() as free:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
        free.close()
        argv = tier_argv("edge", port, stores / "edge", "edge-stuck", "--workers", "2",
                         grpc_port=taken.getsockname()[1])
        result = subprocess.run(argv, capture_output=True, text=True, timeout=180,
                                env={"PATH": str(BIN), **ENV})
    assert result.returncode != 0
    assert "3 times in a row" in result.stderr
