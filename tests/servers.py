"""Start real ``center``/``edge`` processes on free loopback ports; stop them by PID."""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.conftest import REGISTRY

BIN = REGISTRY.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    tier: str
    port: int
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def start(tier: str, store: Path, log_dir: Path, *args: str, timeout: float = 60) -> Server:
    port = free_port()
    log = log_dir / f"{tier}-{port}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(BIN / tier), "--port", str(port), "--store", str(store), "--node-id",
             f"{tier}-{port}", "--poll-interval-s", "0.2", *args],
            stdout=out, stderr=subprocess.STDOUT, env={"PATH": str(BIN)})
    server = Server(tier, port, process, log)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{tier} exited {process.returncode}: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"{server.url}/v2/health/ready", timeout=1).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    server.stop()
    raise RuntimeError(f"{tier} not ready after {timeout}s: {log.read_text()[-2000:]}")
