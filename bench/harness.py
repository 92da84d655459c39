"""The library the benchmarks share: the demo release pulled into stores, the review texts,
tier servers under wrk, the servers' /metrics counters, CPU accounting (the machine, this
process, a server with its worker processes; per process from ``harness.load``), and the
options every benchmark takes. ``bench.tiers`` is the benchmark built on it."""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from rich.console import Console

from bench.loadgen import wrk_summary
from harness.load import CLOCK_TICKS, Load, tree_cpu_s
from harness.processes import TierProcess, start_tier

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

BIN = Path(sys.executable).parent
LUA = HERE / "v2_infer.lua"
MODEL = "sentiment"
TEXTS = 200
SPLIT_SEED = 7

console = Console(width=None if sys.stdout.isatty() else 132)


# --- results ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Counters:
    """The server's cumulative batch counters (from /metrics)."""

    rows: float = 0.0
    executions: float = 0.0  # model calls
    compute_s: float = 0.0
    tokens_useful: float = 0.0
    tokens_computed: float = 0.0  # padding included

    def __sub__(self, other: Counters) -> Counters:
        return Counters(self.rows - other.rows, self.executions - other.executions,
                        self.compute_s - other.compute_s,
                        self.tokens_useful - other.tokens_useful,
                        self.tokens_computed - other.tokens_computed)

    @property
    def useful_share(self) -> float:
        """Of the token positions the model computed, the real tokens' share."""
        return self.tokens_useful / self.tokens_computed if self.tokens_computed else math.nan

    @property
    def mean_batch(self) -> float:
        return self.rows / self.executions if self.executions else math.nan

    @property
    def compute_ms_per_row(self) -> float:
        return 1000 * self.compute_s / self.rows if self.rows else math.nan


@dataclass(frozen=True)
class Cpu:
    """CPU seconds so far: the whole machine's busy time, this process with its reaped
    children (wrk), and one server with the processes below it (0 when none)."""

    machine_s: float
    own_s: float
    server_s: float = 0.0

    @classmethod
    def now(cls, server_pid: int | None = None) -> Cpu:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]
        ticks = [int(f) for f in fields]
        busy = sum(ticks) - ticks[3] - ticks[4]  # minus idle and iowait
        t = os.times()
        own = t.user + t.system + t.children_user + t.children_system
        return cls(busy / CLOCK_TICKS, own, tree_cpu_s(server_pid) if server_pid else 0.0)

    def cores_since(self, start: Cpu, seconds: float) -> Usage:
        """Cores used by the server and by everything else (other users of the machine)."""
        server = self.server_s - start.server_s
        other = (self.machine_s - start.machine_s) - (self.own_s - start.own_s) - server
        return Usage(server / seconds, max(0.0, other) / seconds)


@dataclass(frozen=True)
class Usage:
    server_cores: float
    other_cores: float


@dataclass(frozen=True)
class Release:
    """One tier's pulled version folder and what the manifest says about it."""

    store: Path
    folder: Path
    model_file: Path
    tokenizer: Path
    max_length: int


# --- setup -----------------------------------------------------------------------------------

def ensure_wrk() -> str:
    """Path of wrk, installing it with apt-get when missing; exits with a message if it can't."""
    found = shutil.which("wrk")
    if found:
        return found
    apt = shutil.which("apt-get")
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"] if shutil.which("sudo") else None
    if apt is None or sudo is None:
        raise SystemExit("wrk is not installed and cannot be installed here (needs apt-get and "
                         "root or sudo); install wrk (https://github.com/wg/wrk) and rerun.")
    console.print("[yellow]wrk not found: running apt-get install -y wrk[/]")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = [*sudo, apt, "install", "-y", "wrk"]
    if subprocess.run(install, capture_output=True, env=env).returncode != 0:
        subprocess.run([*sudo, apt, "update"], capture_output=True, env=env)
        result = subprocess.run(install, capture_output=True, text=True, env=env)
        if result.returncode != 0:
            raise SystemExit(f"apt-get install -y wrk failed:\n{result.stderr[-2000:]}")
    found = shutil.which("wrk")
    if not found:
        raise SystemExit("apt-get installed wrk but it is not on PATH")
    return found


def review_texts(count: int) -> list[str]:
    from examples.sentiment import data

    return list(data.split(data.load_reviews(), seed=SPLIT_SEED).test.texts)[:count]

def pull(registry: Path, tier: str, store: Path) -> Release:
    subprocess.run([str(BIN / "registry"), "--home", str(registry), "pull", MODEL, "--tier",
                    tier, "--store", str(store)], check=True, capture_output=True)
    folder = store / MODEL / (store / MODEL / "CURRENT").read_text().strip()
    manifest = json.loads((folder / "release.json").read_text())
    return Release(store, folder, folder / manifest[tier]["file"],
                   folder / manifest["preprocessing"]["tokenizer"],
                   int(manifest["preprocessing"]["max_length"]))


# --- servers under wrk -----------------------------------------------------------------------

@contextmanager
def server(tier: str, store: Path, logs: Path, *flags: str) -> Iterator[TierProcess]:
    """A running ``edge``/``center`` on a free loopback port, stopped by PID afterwards."""
    process = start_tier(tier, store, logs, *flags, timeout=120)
    try:
        yield process
    finally:
        process.stop()


@dataclass(frozen=True)
class Plan:
    """What every server run shares."""

    wrk: str
    logs: Path
    bodies: Path
    seconds: int
    warmup: int
    threads: int
    model: str = MODEL  # the model the bodies are sent to (``bench.images.DIGITS``: digits)


def wrk(plan: Plan, url: str, concurrency: int, seconds: int) -> Load:
    command = [plan.wrk, "-t1", f"-c{concurrency}", f"-d{seconds}s", "--timeout", "10s", "-s",
               str(LUA), f"{url}/v2/models/{plan.model}/infer", "--", str(plan.bodies)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 60)
    values, _ = wrk_summary(result.stdout, result.stderr, result.returncode)
    return Load(int(values["requests"]), values["duration_us"] / 1e6, values["p50_us"] / 1e3,
                values["p99_us"] / 1e3, values["mean_us"] / 1e3, int(values["errors"]))


METRIC = re.compile(r"^(\w+)(?:\{[^}]*\})?\s+(\S+)$")


def counters(url: str, tier: str) -> Counters:
    totals: dict[str, float] = {}
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if (match := METRIC.match(line)) is not None:
            totals[match[1]] = totals.get(match[1], 0.0) + float(match[2])
    return Counters(totals.get(f"{tier}_inference_count_total", 0.0),
                    totals.get(f"{tier}_execution_count_total", 0.0),
                    totals.get(f"{tier}_compute_duration_seconds_sum", 0.0),
                    totals.get(f"{tier}_tokens_useful_total", 0.0),
                    totals.get(f"{tier}_tokens_computed_total", 0.0))


# --- options ---------------------------------------------------------------------------------

def bench_parser(doc: str | None, quick: str, prog: str | None = None) -> argparse.ArgumentParser:
    """The options every benchmark takes: --duration, --quick, --registry, --markdown."""
    parser = argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0] if doc else "")
    parser.add_argument("--duration", type=int, default=10,
                        help="seconds of load per measured wrk run (default 10)")
    parser.add_argument("--quick", action="store_true", help=quick)
    parser.add_argument("--registry", type=Path, default=ROOT / "var" / "registry",
                        help="registry home holding the demo release (default var/registry)")
    parser.add_argument("--markdown", type=Path, default=None,
                        help="also write the tables as a markdown fragment here")
    return parser


def parse_bench_args(parser: argparse.ArgumentParser,
                     argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse, check --duration, and shorten runs to 3 s with --quick."""
    args = parser.parse_args(argv)
    if args.duration < 1:
        parser.error("--duration must be >= 1 second")
    if args.quick:
        args.duration = min(args.duration, 3)
    return args

