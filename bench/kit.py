"""What every benchmark reports the same way: the machine, the git commit, wrk request bodies,
and the flag on cores used by other processes. One copy, imported by all of them."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from serving.release import hardware

ROOT = Path(__file__).resolve().parent.parent
BUSY_OTHERS = 0.1  # cores used by other processes above which a figure is flagged


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``, else ``platform``), or ``unknown``."""
    return hardware.cpu()[0] or "unknown"


def cpu() -> str:
    """The CPU's model name and the features INT8/fp16 kernels care about (``avx2 ...``)."""
    name, features = hardware.cpu()
    return f"{name or 'unknown CPU'} ({' '.join(features) or 'no features known'})"


def usable_cores() -> str:
    return f"{os.cpu_count()} logical, {len(os.sched_getaffinity(0))} usable"


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def git_commit() -> str:
    """The short HEAD commit, marked when tracked files have uncommitted changes."""
    def git(*args: str) -> str:
        result = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
        return result.stdout.strip() if result.returncode == 0 else ""

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    return commit + (" (+ local changes)" if git("status", "--porcelain",
                                                 "--untracked-files=no") else "")


def versions(*packages: str) -> str:
    """``1.2 / 3.4`` for the installed ``packages`` (``?`` for one that is not)."""
    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "?"

    return " / ".join(version(p) for p in packages)


def machine(**extra: str) -> dict[str, str]:
    """The machine table's rows: date, CPU with features, cores, Python, runtimes, commit,
    then ``extra`` (keyword names with ``_`` for spaces), and the load average last."""
    rows = {"date": datetime.now().astimezone().isoformat(timespec="seconds"),
            "cpu": cpu(),
            "cores": usable_cores(),
            "python": sys.version.split()[0],
            "onnxruntime / torch": versions("onnxruntime", "torch"),
            "git commit": git_commit()}
    rows.update({key.replace("_", " "): value for key, value in extra.items()})
    rows["load average"] = load_average()
    return rows


def machine_line() -> str:
    """One line for the gathered docs/benchmarks.md: CPU, cores, memory, OS, commit, date."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (f"{cpu()}, {os.cpu_count()} cores, {memory:.0f} GiB, {platform.system()} "
            f"{platform.release()}; commit {git_commit()}; gathered "
            f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC")


def wrk_version(wrk: str) -> str:
    out = subprocess.run([wrk, "--version"], capture_output=True, text=True).stdout
    return (out.split("Copyright")[0] or "?").strip()


def write_bodies(texts: Sequence[str], path: Path, *, threshold: float | None = None,
                 outputs: Sequence[str] = (), rows: int = 1) -> Path:
    """One KServe V2 request body per line (``bench/v2_infer.lua`` sends them in turn), one
    per text, holding that text and the ``rows - 1`` after it (rotating). Without
    ``threshold`` the edge's calibrated gate decides; ``threshold=0`` keeps every row on the
    edge. ``outputs`` names the outputs asked for (all when empty)."""
    bodies = []
    for k in range(len(texts)):
        data = [texts[(k + i) % len(texts)] for i in range(rows)]
        body: dict[str, Any] = {"inputs": [{"name": "text", "shape": [rows],
                                            "datatype": "BYTES", "data": data}]}
        if outputs:
            body["outputs"] = [{"name": name} for name in outputs]
        if threshold is not None:
            body["parameters"] = {"threshold": threshold}
        bodies.append(json.dumps(body))  # json.dumps escapes newlines inside texts
    path.write_text("\n".join(bodies) + "\n")
    return path


def cores(value: float, rich: bool = True) -> str:
    """Cores used by other processes; flagged (red, or ``(busy)`` in plain text) when they may
    have skewed the measurement."""
    flagged = value > BUSY_OTHERS
    if rich:
        return f"[red]{value:.2f}[/]" if flagged else f"{value:.2f}"
    return f"{value:.2f}" + (" (busy)" if flagged else "")
