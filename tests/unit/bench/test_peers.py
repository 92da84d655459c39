"""bench/peers/measure.py's process-tree handling on real processes (no peer venvs needed): the
benchmark must leave nothing running, even a server that ignores SIGTERM and has children."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from bench.peers.measure import PeakRss, descendants, stop_tree


def alive(pid: int) -> bool:
    """Running (not gone, not a zombie waiting to be reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def test_stop_tree_kills_a_server_that_ignores_sigterm_and_its_children() -> None:
    # bash ignores SIGTERM and so do its two children (ignored signals survive exec)
    server = subprocess.Popen(["bash", "-c", "trap '' TERM; sleep 60 & sleep 60 & wait"],
                              start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while len(tree := descendants(server.pid)) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(tree) == 3
        with PeakRss(server.pid, every=0.05) as rss:
            time.sleep(0.2)
        assert rss.peak_kib > 0
        started = time.monotonic()
        stop_tree(server, grace=0.5)
        assert time.monotonic() - started < 5
        assert server.returncode is not None
        deadline = time.monotonic() + 5
        while any(alive(pid) for pid in tree) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(alive(pid) for pid in tree)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
