"""Load and process sampling for the reliability benchmarks (``bench.swaps``, ``bench.soak``).

wrk runs with ``bench/v2_infer.lua``, which prints 1000 evenly spaced latency quantiles, so
runs can be merged into percentiles (0.1% resolution per run). Bodies carry no ``threshold``:
the edge's calibrated gate decides, and the rows it is unsure about go to the center.
"""

from __future__ import annotations

import math
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
LUA = HERE / "v2_infer.lua"
MIB = 1024 * 1024


@dataclass
class Histogram:
    """Request latencies: microseconds -> how many requests (a weight: each of wrk's quantiles
    stands for a thousandth of its run)."""

    weights: dict[int, float] = field(default_factory=dict)

    @classmethod
    def merged(cls, histograms: Iterable[Histogram]) -> Histogram:
        total: dict[int, float] = {}
        for h in histograms:
            for us, weight in h.weights.items():
                total[us] = total.get(us, 0.0) + weight
        return cls(total)

    @property
    def total(self) -> float:
        return sum(self.weights.values())

    def percentile_ms(self, q: float) -> float:
        """The smallest latency at or below which ``q`` % of the requests completed."""
        if not self.weights:
            return math.nan
        rank, seen = self.total * q / 100, 0.0
        for us in sorted(self.weights):
            seen += self.weights[us]
            if seen >= rank * (1 - 1e-9):
                return us / 1000
        return max(self.weights) / 1000


@dataclass
class Run:
    """What one wrk run saw."""

    requests: int
    seconds: float
    errors: int  # non-2xx answers and socket errors (connect, read, write, timeout)
    latency: Histogram

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0


class Wrk:
    """One wrk process in the background: ``start`` it, ``result`` waits for its summary."""

    def __init__(self, wrk: str, url: str, bodies: Path, concurrency: int,
                 seconds: float) -> None:
        command = [wrk, "-t1", f"-c{concurrency}", f"-d{max(1, round(seconds))}s", "--timeout",
                   "10s", "-s", str(LUA), url, "--", str(bodies)]
        self.seconds = seconds
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True)

    @property
    def pid(self) -> int:
        return self.process.pid

    def result(self) -> Run:
        stdout, stderr = self.process.communicate(timeout=self.seconds + 60)
        values, quantiles = wrk_summary(stdout, stderr, self.process.returncode)
        requests = int(values["requests"])
        weights: dict[int, float] = {}
        for us in quantiles:
            weights[us] = weights.get(us, 0.0) + requests / len(quantiles)
        return Run(requests, values["duration_us"] / 1e6, int(values["errors"]),
                   Histogram(weights))


def wrk_summary(stdout: str, stderr: str, returncode: int) -> tuple[dict[str, float], list[int]]:
    """What a ``v2_infer.lua`` run printed: its BENCH_RESULT values (plus ``errors``, every
    ``errors_*`` summed) and its BENCH_HIST quantiles in microseconds."""
    lines = {line.split(" ", 1)[0]: line for line in stdout.splitlines()}
    if returncode != 0 or "BENCH_RESULT" not in lines:
        raise RuntimeError(f"wrk failed ({returncode}): {stdout}{stderr}")
    values = {k: float(v) for k, v in (kv.split("=") for kv in lines["BENCH_RESULT"].split()[1:])}
    values["errors"] = sum(v for k, v in values.items() if k.startswith("errors_"))
    return values, [int(us) for us in lines.get("BENCH_HIST", "").split()[1:]]


def run_wrk(wrk: str, url: str, bodies: Path, concurrency: int, seconds: float) -> Run:
    return Wrk(wrk, url, bodies, concurrency, seconds).result()


@dataclass(frozen=True)
class Sample:
    """One process at one moment: resident memory and open file descriptors."""

    rss: int
    fds: int

    @property
    def rss_mib(self) -> float:
        return self.rss / MIB


def sample(pid: int) -> Sample:
    """RSS and fd count of ``pid`` and its children (a server that forks is counted whole);
    the fds are those listed in /proc/PID/fd."""
    process = psutil.Process(pid)
    family = [process, *process.children(recursive=True)]
    return Sample(sum(p.memory_info().rss for p in family), sum(p.num_fds() for p in family))


def growth(before: float, after: float) -> float:
    """Relative change in percent."""
    return (after - before) / before * 100 if before else math.nan
