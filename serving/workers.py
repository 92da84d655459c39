"""Several serving processes on one port (``--workers N``).

The tier command, asked for N > 1 workers, becomes a small supervisor: it starts N copies of
itself (the same command line) with ``TIERED_WORKER`` set to 0..N-1, forwards SIGINT/SIGTERM to
them, restarts one that dies while it is not stopping (and gives up on one that cannot start),
and stops them all by PID. Each worker
binds the port with SO_REUSEPORT, so the kernel spreads connections over them, and loads its
own model session with a share of the cores (``threads``). Worker 0 is the node: it registers
in Consul, runs the sync subscriber and serves gRPC; the others serve HTTP only, follow the
Consul services the tier escalates to, and pick up new versions from the model store (the
repository's poll). Their Prometheus metrics are summed through prometheus_client's
multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``, a fresh folder per run).

Worker processes are started from the supervisor's own command line, never from anything
received over a network.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType

log = logging.getLogger(__name__)
WORKER = "TIERED_WORKER"  # this process's index among the workers (unset: no workers)
METRICS = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client's multiprocess folder
RESTART_DELAY_S = 1.0
QUICK_DEATH_S, GIVE_UP_AFTER = 30.0, 3  # a worker dying this soon this often cannot start
STOP_GRACE_S = 15.0  # uvicorn's drain (10 s) and the batchers'; under tiered's 20 s stop
PR_SET_PDEATHSIG = 1


def index() -> int | None:
    """This process's worker index; None when it is not one of several workers."""
    value = os.environ.get(WORKER, "")
    return int(value) if value.isdigit() else None


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def threads_per_worker(threads: int, workers: int) -> int:
    """Intra-op threads for each worker: as set, else the usable cores shared out (0 with one
    worker: the runtime's own default)."""
    if threads or workers == 1:
        return threads
    return max(1, usable_cores() // workers)


def reuse_port_socket(host: str, port: int) -> socket.socket:
    """A listening-ready socket bound to ``host:port`` with SO_REUSEPORT, which every worker
    binds in turn (all must set it; the kernel balances new connections among them)."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    sock.bind(address)
    sock.set_inheritable(True)
    return sock


def supervise(workers: int, threads: int) -> int:
    """Run ``workers`` copies of this command (as worker 0..N-1) until SIGINT/SIGTERM, then
    stop them (SIGTERM, then SIGKILL past the grace) and return 0. A worker that dies is
    restarted, unless it died within QUICK_DEATH_S of starting GIVE_UP_AFTER times in a row:
    then all stop and its exit status is returned."""
    folder = Path(tempfile.mkdtemp(prefix="tiered-metrics-"))
    log.info("starting %d workers, %d intra-op threads each", workers,
             threads_per_worker(threads, workers))
    command = [sys.executable, *sys.argv]  # the tier's console script, as it was started
    stopping = False

    def start(i: int) -> subprocess.Popen[bytes]:
        # its own session: a terminal's Ctrl-C reaches the supervisor only, which passes on
        # one SIGTERM (a second signal would make uvicorn skip its graceful drain)
        return subprocess.Popen(command, env={**os.environ, WORKER: str(i),
                                              METRICS: str(folder)}, start_new_session=True,
                                preexec_fn=_die_with_parent)

    def stop(_signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        if stopping:
            return
        stopping = True
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)

    processes = [start(i) for i in range(workers)]
    started = [time.monotonic()] * workers
    quick = [0] * workers  # deaths in a row within QUICK_DEATH_S of starting
    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not stopping:
            for i, process in enumerate(processes):
                code = process.poll()
                if code is None or stopping:
                    continue
                _mark_dead(folder, process.pid)
                quick[i] = quick[i] + 1 if time.monotonic() - started[i] < QUICK_DEATH_S else 0
                if quick[i] >= GIVE_UP_AFTER:  # it cannot start (port, store, settings)
                    log.error("worker %d exited with status %d %d times in a row within %g s "
                              "of starting; stopping", i, code, quick[i], QUICK_DEATH_S)
                    stop(signal.SIGTERM, None)
                    _wait(processes)
                    return code or 1
                log.error("worker %d (pid %d) exited with status %d; restarting it", i,
                          process.pid, code)
                time.sleep(RESTART_DELAY_S)
                if not stopping:
                    processes[i], started[i] = start(i), time.monotonic()
            time.sleep(0.2)
        _wait(processes)
        return 0
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
        shutil.rmtree(folder, ignore_errors=True)


def _wait(processes: list[subprocess.Popen[bytes]]) -> None:
    """Each to exit within the grace (together), else killed."""
    deadline = time.monotonic() + STOP_GRACE_S
    for process in processes:
        try:
            process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the supervisor dies, even by SIGKILL (Linux's
    PR_SET_PDEATHSIG), so no worker outlives it holding the port."""
    with contextlib.suppress(OSError, AttributeError):  # not Linux: the supervisor's stop
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _mark_dead(folder: Path, pid: int) -> None:
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(pid, str(folder))
