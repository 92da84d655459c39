"""Several serving processes on one port (``--workers N``).

The tier command, asked for N > 1 workers, becomes a small supervisor: it starts N copies of
itself (the same command line) with ``TIERED_WORKER`` set to 0..N-1, forwards SIGINT/SIGTERM to
them, restarts one that dies while it is not stopping (and gives up on one that cannot start),
and stops them all by PID. The supervisor alone listens on the port: it accepts each
connection and hands it to the next ready worker in turn over a Unix socket pair
(``serving/transport/handoff.py``; SCM_RIGHTS), skipping a worker that died until it is back. Each
worker loads its own model session with a share of the cores (``threads``). Worker 0 is the
node: it registers in Consul, runs the sync subscriber and serves gRPC; the others serve HTTP
only, follow the Consul services the tier escalates to, and pick up new versions from the
model store (the repository's poll). Their Prometheus metrics are summed through prometheus_client's
multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``, a fresh folder per run); their quality
telemetry reaches worker 0's reports through the same folder (``serving/telemetry/quality.py``).

Worker processes are started from the supervisor's own command line, never from anything
received over a network.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from serving.config.environment import for_worker
from serving.transport import handoff

log = logging.getLogger(__name__)
RESTART_DELAY_S = 1.0
QUICK_DEATH_S, GIVE_UP_AFTER = 30.0, 3  # a worker dying this soon this often cannot start
STOP_GRACE_S = 15.0  # uvicorn's drain (10 s) and the batchers'; under tiered's 20 s stop
PR_SET_PDEATHSIG = 1
BACKLOG = 2048  # uvicorn's default
ACCEPT_BATCH = 64  # connections accepted per wake-up before the workers are checked again


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


def listen(host: str, port: int) -> socket.socket:
    """The tier's socket, bound to ``host:port`` (not yet listening: connections are refused
    until a worker is ready, as with one process)."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    sock.bind(address)
    sock.setblocking(False)
    return sock


@dataclass
class _Worker:
    index: int
    process: subprocess.Popen[bytes]
    channel: socket.socket | None  # None once broken: it gets no more connections
    started: float = field(default_factory=time.monotonic)
    ready: bool = False


class Acceptor:
    """The tier's socket: listening once a worker is first ready, accepting while one is, each
    connection handed to the next ready worker in turn (``serving/transport/handoff.py``).

    One acceptor rather than N listeners with SO_REUSEPORT: the kernel hashes each
    connection to a listener, which spreads a few long-lived (keep-alive) connections
    unevenly; round-robin gives every worker its share of them."""

    def __init__(self, listener: socket.socket, selector: selectors.BaseSelector,
                 workers: list[_Worker]) -> None:
        self.listener, self.selector, self.workers = listener, selector, workers
        self.turn = 0
        self.listening = self.accepting = self.closed = False

    def accept(self) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                connection, _ = self.listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:  # e.g. out of descriptors: keep serving what is open
                log.warning("accept failed: %s", exc)
                return
            with connection:  # this process's copy is closed once handed on
                self.hand(connection)

    def hand(self, connection: socket.socket) -> None:
        """To the next ready worker; a worker whose queue is full is skipped, one whose
        channel is broken (it died) is skipped until restarted (``broken`` marks it)."""
        count = len(self.workers)
        for _ in range(count):
            worker = self.workers[self.turn]
            self.turn = (self.turn + 1) % count
            if worker.channel is None or not worker.ready:
                continue
            try:
                handoff.send(worker.channel, connection)
                return
            except BlockingIOError:
                continue
            except OSError:
                self.broken(worker)
        log.warning("no worker could take a connection; closed it")

    def broken(self, worker: _Worker) -> None:
        """Close a worker's channel (it died, or its end closed): no more connections for it."""
        if worker.channel is not None:
            self.selector.unregister(worker.channel)
            worker.channel.close()
            worker.channel, worker.ready = None, False
        self.follow()

    def follow(self) -> None:
        """Accept while some worker is ready; otherwise leave connections in the backlog."""
        if self.closed:
            return
        ready = any(w.ready for w in self.workers)
        if ready and not self.listening:
            self.listener.listen(BACKLOG)
            self.listening = True
        if ready != self.accepting:
            if ready:
                self.selector.register(self.listener, selectors.EVENT_READ, None)
            else:
                self.selector.unregister(self.listener)
            self.accepting = ready

    def close(self) -> None:
        """Stop accepting; connections not yet accepted are refused."""
        if self.accepting:
            self.selector.unregister(self.listener)
            self.accepting = False
        self.listener.close()
        self.closed = True


class Supervisor:
    """Starts the workers, lets the :class:`Acceptor` hand them the connections, restarts a
    worker that dies, and stops them all on SIGINT/SIGTERM."""

    def __init__(self, listener: socket.socket, count: int, folder: Path) -> None:
        self.count, self.folder = count, folder
        self.command = [sys.executable, *sys.argv]  # the tier's console script, as started
        self.selector = selectors.DefaultSelector()
        self.workers: list[_Worker] = []  # filled by run; a restarted one takes its place
        self.acceptor = Acceptor(listener, self.selector, self.workers)
        self.quick = [0] * count  # deaths in a row within QUICK_DEATH_S of starting
        self.restart_at: dict[int, float] = {}
        self.stopping = False
        self.asked = False  # set by the signal handler only; the loop does the stopping

    def start(self, i: int) -> _Worker:
        mine, theirs = handoff.pair()
        # its own session: a terminal's Ctrl-C reaches the supervisor only, which passes on
        # one SIGTERM (a second signal would make uvicorn skip its graceful drain)
        with theirs:
            process = subprocess.Popen(self.command, env={
                **os.environ, **for_worker(i, self.folder, theirs.fileno())},
                start_new_session=True,
                pass_fds=(theirs.fileno(),), preexec_fn=_die_with_parent)
        worker = _Worker(i, process, mine)
        self.selector.register(mine, selectors.EVENT_READ, worker)
        return worker

    def run(self) -> int:
        """Until SIGINT/SIGTERM (0) or a worker that cannot start (its exit status)."""
        self.workers.extend(self.start(i) for i in range(self.count))
        while not self.asked:
            for key, _ in self.selector.select(0.2):
                if key.data is None:
                    self.acceptor.accept()
                else:
                    self.heard(key.data)
            code = self.reap()
            if code is not None:
                self.stop()
                return code
            self.restart_due()
        self.stop()
        return 0

    def heard(self, worker: _Worker) -> None:
        """A worker said it is ready, or its end closed (it exited)."""
        assert worker.channel is not None
        try:
            data = worker.channel.recv(16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data == handoff.READY:
            worker.ready = True
        elif not data:
            self.acceptor.broken(worker)
        self.acceptor.follow()

    def reap(self) -> int | None:
        """Schedule a restart of each worker that died; the status of one that cannot start."""
        for i, worker in enumerate(self.workers):
            code = worker.process.poll()
            if code is None or i in self.restart_at:
                continue
            self.acceptor.broken(worker)
            _mark_dead(self.folder, worker.process.pid)
            quick = time.monotonic() - worker.started < QUICK_DEATH_S
            self.quick[i] = self.quick[i] + 1 if quick else 0
            if self.quick[i] >= GIVE_UP_AFTER:  # it cannot start (port, store, settings)
                log.error("worker %d exited with status %d %d times in a row within %g s "
                          "of starting; stopping", i, code, self.quick[i], QUICK_DEATH_S)
                return code or 1
            log.error("worker %d (pid %d) exited with status %d; restarting it", i,
                      worker.process.pid, code)
            self.restart_at[i] = time.monotonic() + RESTART_DELAY_S
        return None

    def restart_due(self) -> None:
        now = time.monotonic()
        for i, due in list(self.restart_at.items()):
            if due <= now:
                del self.restart_at[i]
                self.workers[i] = self.start(i)

    def ask_to_stop(self, _signum: int, _frame: FrameType | None) -> None:
        self.asked = True

    def stop(self) -> None:
        """Stop accepting, then SIGTERM every worker (each drains what it holds)."""
        if self.stopping:
            return
        self.stopping = True
        self.acceptor.close()
        for worker in self.workers:
            if worker.process.poll() is None:
                worker.process.send_signal(signal.SIGTERM)

    def close(self) -> None:
        """Wait for the workers (within the grace, then kill), release everything."""
        self.stop()
        _wait([w.process for w in self.workers])
        for worker in self.workers:
            if worker.channel is not None:
                worker.channel.close()
        self.selector.close()


def supervise(listener: socket.socket, workers: int, threads: int) -> int:
    """Run ``workers`` copies of this command (as worker 0..N-1), handing them the connections
    ``listener`` accepts, until SIGINT/SIGTERM, then stop them (SIGTERM, then SIGKILL past the
    grace) and return 0. A worker that dies is restarted, unless it died within QUICK_DEATH_S
    of starting GIVE_UP_AFTER times in a row: then all stop and its exit status is returned."""
    folder = Path(tempfile.mkdtemp(prefix="tiered-metrics-"))
    log.info("starting %d workers, %d intra-op threads each; one acceptor on %s", workers,
             threads_per_worker(threads, workers), listener.getsockname()[:2])
    supervisor = Supervisor(listener, workers, folder)
    previous = {s: signal.signal(s, supervisor.ask_to_stop)
                for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return supervisor.run()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        supervisor.close()
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
