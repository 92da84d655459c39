"""A child process of the launcher (``tiered up``'s stack), stopped by PID, and a free loopback
port to give it. Starting a tier or a registry and waiting until it is ready, for tests and
benchmarks, is ``harness.processes``."""

from __future__ import annotations

import signal
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["RunningProcess", "free_port"]


_GIVEN: set[int] = set()  # ports handed out by this process: never the same one twice


def free_port() -> int:
    """A port free on 127.0.0.1 now and not handed out before by this process (the kernel can
    offer a just-closed port again, e.g. to two of Consul's five ports)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _GIVEN:
            _GIVEN.add(port)
            return port


@dataclass
class RunningProcess:
    name: str
    port: int
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def kill(self) -> None:
        """SIGKILL: a crash, not a shutdown."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def stop(self) -> None:
        """SIGTERM (the server drains), SIGKILL if it has not exited within 20 s."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


