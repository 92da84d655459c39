"""What a load run saw (requests, seconds, latency percentiles, errors) and what a process
cost in CPU (from /proc: one process with all its threads, or a server with every process
below it). The benchmarks' runs and the harness's own load runners report in these terms."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Load:
    """What the clients (wrk, or the harness's own) saw during one run."""

    requests: int
    seconds: float
    p50_ms: float
    p99_ms: float
    mean_ms: float
    errors: int

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0


def descendants(pid: int) -> list[int]:
    """``pid`` and every live process below it (from /proc/*/stat parent ids)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    tree, i = [pid], 0
    while i < len(tree):
        tree.extend(children.get(tree[i], []))
        i += 1
    return tree


def tree_cpu_s(pid: int) -> float:
    total = 0.0
    for p in descendants(pid):
        try:
            total += process_cpu_s(p)
        except (OSError, IndexError, ValueError):
            continue
    return total


def process_cpu_s(pid: int) -> float:
    """utime + stime of a live process (all its threads), from /proc/PID/stat."""
    after_name = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(after_name[11]) + int(after_name[12])) / CLOCK_TICKS
