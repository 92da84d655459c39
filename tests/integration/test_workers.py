"""``--workers N``: several edge processes on one port (SO_REUSEPORT), one supervisor that
stops them all; /metrics sums every worker's counts."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.servers import Server, start
from tiered.commands import BIN, tier_argv

pytestmark = [pytest.mark.slow, pytest.mark.integration]
REQUESTS = 60


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


def infer(url: str, text: str) -> httpx.Response:
    with httpx.Client(timeout=30) as client:  # a new connection each time: spread by the kernel
        return client.post(f"{url}/v2/models/tiny/infer", json={"inputs": [
            {"name": "text", "shape": [1], "datatype": "BYTES", "data": [text]}]})


def test_workers_share_the_port_sum_their_metrics_restart_and_stop_together(
        stores: Path, tmp_path: Path) -> None:
    server = start("edge", stores / "edge", tmp_path, "--workers", "2", "--cache-size", "0",
                   "--threads", "0")
    try:
        workers = children(server)
        assert len(workers) == 2
        log = server.log.read_text()
        cores = len(os.sched_getaffinity(0))
        assert f"starting 2 workers, {max(1, cores // 2)} intra-op threads each" in log
        for i in range(REQUESTS):
            response = infer(server.url, f"review number {i} was fine")
            assert response.status_code == 200, response.text
        # both answered (the kernel spread 60 connections), and /metrics counts every answer,
        # whichever worker is asked
        lines = [json.loads(x) for x in server.log.read_text().splitlines() if x[:1] == "{"]
        answered_by = {x.get("worker") for x in lines if x["logger"] == "serving.access"
                       and x["msg"].startswith("POST")}
        assert answered_by == {0, 1}
        assert served(server.url) == REQUESTS

        workers[1].send_signal(signal.SIGKILL)  # a worker dies: the supervisor replaces it
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            now = children(server)
            if len(now) == 2 and workers[1].pid not in [w.pid for w in now]:
                break
            time.sleep(0.2)
        else:
            pytest.fail("the dead worker was not replaced")
        deadline = time.monotonic() + 60
        answered = 0
        while answered < 20 and time.monotonic() < deadline:
            answered += infer(server.url, "still serving").status_code == 200
        assert answered == 20
    finally:
        pids = [w.pid for w in children(server)]
        server.stop()
    assert server.process.returncode == 0
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"


def test_workers_that_cannot_start_stop_the_supervisor_with_an_error(stores: Path) -> None:
    """The port is held by a socket without SO_REUSEPORT: every worker fails to bind, and the
    supervisor gives up after three quick deaths in a row instead of restarting forever."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = tier_argv("edge", port, stores / "edge", "edge-stuck", "--workers", "2")
        result = subprocess.run(argv, capture_output=True, text=True, timeout=180,
                                env={"PATH": str(BIN)})
    assert result.returncode != 0
    assert "3 times in a row" in result.stderr
