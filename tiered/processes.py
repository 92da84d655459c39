"""Tier processes on loopback: start ``center``/``edge`` on a free port, wait until ready,
stop by PID. Used by the tests and the benchmarks (and the launcher to come)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class TierProcess:
    tier: str
    port: int
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self) -> None:
        """SIGTERM (the server drains), SIGKILL if it has not exited within 20 s."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def start_tier(tier: str, store: Path, log_dir: Path, *flags: str, timeout: float = 60,
               env: dict[str, str] | None = None) -> TierProcess:
    """Run ``tier`` on a free 127.0.0.1 port; return once /v2/health/ready answers 200."""
    port = free_port()
    log = log_dir / f"{tier}-{port}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(BIN / tier), "--host", "127.0.0.1", "--port", str(port), "--store", str(store),
             "--node-id", f"{tier}-{port}", *flags],
            stdout=out, stderr=subprocess.STDOUT, env=env)
    server = TierProcess(tier, port, process, log)
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
