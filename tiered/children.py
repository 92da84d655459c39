"""A fleet's child processes by name: each started in a session of its own with its output in
``<logs>/<name>.log`` (and, for ``tiered up``, on the console with a prefix), brought back when
a registry, center or edge exits, and stopped by PID, newest first. What a child runs and with
which environment is the fleet's to say (``tiered.fleet_config``); this table only keeps them going.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx

from tiered.processes import RunningProcess

Echo = Callable[[str, str], None]  # (child name, output line)
# roles the supervisor brings back (monitoring: Prometheus, Alertmanager; targets: their renderer)
RESTARTED = ("registry", "center", "edge", "monitoring", "targets", "console")
JOB = "job"  # a child that runs to its end (the full release trained behind): never restarted,
# its exit never stops the stack
RESTART_DELAY_S = 0.5


@dataclass
class Child(RunningProcess):
    role: str = ""  # consul, registry, center, edge, nginx, monitoring, targets, console
    argv: list[str] = field(default_factory=list)
    restarts: int = 0

    def kill_group(self) -> None:
        """SIGKILL the child and what it started (nginx under its renderer): each child leads
        its own process group."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
            self.process.wait(timeout=10)


class Children(Mapping[str, Child]):
    """The running children in start order. A restart replaces a child under its name, so
    ``children[name]`` is always the newest process of that name."""

    def __init__(self, logs: Path, echo: Echo | None = None) -> None:
        self.logs, self.echo = logs, echo
        self.stopping = threading.Event()  # set once by stop(): nothing is restarted after
        self.cancelled = threading.Event()  # Ctrl-C while starting: every wait gives up
        self._running: dict[str, Child] = {}
        self._lock = threading.Lock()  # a restart, or the stop that waits for it

    def __getitem__(self, name: str) -> Child:
        return self._running[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._running)

    def __len__(self) -> int:
        return len(self._running)

    def start(self, name: str, argv: list[str], port: int, role: str, env: dict[str, str],
              cwd: Path) -> Child:
        self.logs.mkdir(parents=True, exist_ok=True)
        log = self.logs / f"{name}.log"
        log.touch()
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   env=env, cwd=cwd, start_new_session=True)
        child = Child(name, port, process, log, role, argv)
        assert process.stdout is not None
        threading.Thread(target=self._pump, args=(name, process.stdout, log),
                         daemon=True).start()
        self._running[name] = child
        return child

    def _pump(self, name: str, stream: IO[bytes], log: Path) -> None:
        with stream, log.open("ab") as out:
            for raw in stream:
                out.write(raw)
                out.flush()
                if self.echo is not None:
                    self.echo(name, raw.decode("utf-8", "replace").rstrip())

    def supervise(self, respawn: Callable[[Child], Child],
                  interval: float = 0.2) -> threading.Thread:
        """Bring back a registry, center or edge that exits, with ``respawn`` (compose's
        ``restart: unless-stopped``). Consul or nginx exiting is not repaired: ``dead()``
        reports it."""
        def loop() -> None:
            while not self.stopping.wait(interval):
                for child in list(self._running.values()):
                    if child.role in RESTARTED and child.process.poll() is not None:
                        self.restart(child, respawn)

        thread = threading.Thread(target=loop, name="stack-supervisor", daemon=True)
        thread.start()
        return thread

    def restart(self, child: Child, respawn: Callable[[Child], Child]) -> Child | None:
        with self._lock:
            if self.stopping.is_set() or self._running.get(child.name) is not child:
                return None
            if self.echo is not None:
                self.echo(child.name, f"exited with status {child.process.returncode}; "
                                      f"restarting")
            time.sleep(RESTART_DELAY_S)  # a crash loop costs 2 restarts/s at most
            fresh = respawn(child)
            fresh.restarts = child.restarts + 1
            return fresh

    def dead(self) -> list[Child]:
        """Children that exited and are not brought back (Consul, nginx)."""
        return [c for c in self._running.values()
                if c.role not in (*RESTARTED, JOB) and c.process.poll() is not None]

    def wait(self, condition: Callable[[], bool], timeout: float, what: str,
             child: Child | None = None) -> None:
        """Until ``condition`` holds; fails at once when ``child`` (default: any child but a
        job) exits or the start is cancelled. HTTP and JSON errors count as not yet."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.cancelled.is_set():
                raise RuntimeError(f"interrupted while waiting for {what}")
            dead = [c for c in ([child] if child else self._running.values())
                    if c.role != JOB and c.process.poll() is not None]
            if dead:
                raise RuntimeError(f"{dead[0].name} exited with status "
                                   f"{dead[0].process.returncode}; see {dead[0].log}")
            try:
                if condition():
                    return
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            time.sleep(0.25)
        raise TimeoutError(f"no {what} after {timeout:.0f}s; logs in {self.logs}")

    def stop(self) -> None:
        """Newest first (nginx before the edges it routes to, Consul last)."""
        self.stopping.set()
        with self._lock:
            pass  # a restart in progress finishes (and is stopped below) before we go on
        for child in reversed(list(self._running.values())):
            child.stop()
