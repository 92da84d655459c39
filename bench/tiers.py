"""Serving benchmark: the edge and center servers under HTTP load vs the raw model in-process.

Run from the repository root (about 2.5 minutes by default, under a minute with ``--quick``)::

    .venv/bin/python -m bench.tiers [--duration SECONDS] [--quick] [--server-threads N]
        [--markdown PATH]

What it measures, all on the demo release ``sentiment`` pulled from ``var/registry`` into
temporary stores, with the same 200 real test review texts (``examples.sentiment.data``,
split seed 7) rotated through, one text per request:

1. **Raw model, in-process**: ``session.run`` of the INT8 ONNX edge model (the server's own
   session options, ``edge.runtime.OnnxRuntime``) and ``predict`` of the fp32 TorchScript
   center model (``center.runtime.TorchScriptRuntime``) at batch sizes 1, 8 and 32. Rows are
   tokenized once up front and padded to the longest row of each batch, as the batcher does.
   Reported as rows/s (= requests/s), plus the mean padded length and time per token.
2. **Edge server** throughput, p50 and p99 latency at concurrency 1, 8 and 32, each for
   ``--duration`` seconds, driven by ``wrk`` (one thread, keep-alive connections) with
   ``bench/v2_infer.lua``, which POSTs KServe V2 bodies (``threshold: 0``: the edge never
   escalates). The edge's response cache is disabled (``--cache-size 0``); otherwise every
   repeat of the 200 texts would be a cache hit and no inference would run. The goal
   (reported, not asserted) is that the server at concurrency 32 keeps >= 80% of the raw
   rows/s at the best raw batch size.
3. **Adaptive batching** on (``--max-batch-size 32 --max-batch-delay-ms 5``, the defaults) vs
   off (``--max-batch-size 1``) at concurrency 32, for the edge and the center; goal >= 3x.
4. **INT8 edge vs fp32 center cost per request**: latency at concurrency 1 with batching off
   (no batch wait) and on (a lone request waits up to 5 ms for company), the model compute
   per row inside the server, and the in-process time of one row.

Alongside wrk's numbers, each server run reports from the server's ``/metrics`` (scraped
before and after) the rows per model execution and model compute time per row, and from
``/proc`` the cores the server process used and the cores used by *other* processes (the
machine's busy time minus this script, wrk and the server): a shared machine skews results,
and such rows are flagged in red.

Threads: the servers run with ``--threads 0`` by default (the runtime's default: onnxruntime
and torch take one intra-op thread per core); ``--server-threads N`` changes that. wrk runs
with one thread on the same machine, so load generator, HTTP stack and model share the cores;
the in-process raw numbers have the cores to themselves. Each server is started on a free
127.0.0.1 port, checked with one request, warmed up with a short unrecorded wrk run, and
stopped by PID in a ``finally``; stores, request bodies and server logs live in a temporary
directory. wrk is installed with ``apt-get install -y wrk`` when it is missing (root or
password-less sudo needed); otherwise the script stops with a message saying so.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from bench.loadgen import wrk_summary
from bench.markdown import Shown
from tiered.processes import TierProcess, start_tier

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

BIN = Path(sys.executable).parent
LUA = HERE / "v2_infer.lua"
MODEL = "sentiment"
TEXTS = 200
SPLIT_SEED = 7
RAW_BATCHES = (1, 8, 32)
CONCURRENCY = (1, 8, 32)
SATURATION = 32
BATCHING_ON = ("--max-batch-size", "32", "--max-batch-delay-ms", "5")
BATCHING_OFF = ("--max-batch-size", "1")
EDGE_FLAGS = ("--cache-size", "0")
GOAL_KEEP = 0.8
GOAL_BATCHING = 3.0
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
BUSY_OTHERS = 0.1  # cores used by other processes above which a result is flagged

console = Console(width=None if sys.stdout.isatty() else 132)


# --- results ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Load:
    """What wrk saw during one run."""

    requests: int
    seconds: float
    p50_ms: float
    p99_ms: float
    mean_ms: float
    errors: int

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0


@dataclass(frozen=True)
class Counters:
    """The server's cumulative batch counters (from /metrics)."""

    rows: float = 0.0
    executions: float = 0.0
    compute_s: float = 0.0

    def __sub__(self, other: Counters) -> Counters:
        return Counters(self.rows - other.rows, self.executions - other.executions,
                        self.compute_s - other.compute_s)

    @property
    def mean_batch(self) -> float:
        return self.rows / self.executions if self.executions else math.nan

    @property
    def compute_ms_per_row(self) -> float:
        return 1000 * self.compute_s / self.rows if self.rows else math.nan


@dataclass(frozen=True)
class Cpu:
    """CPU seconds so far: the whole machine's busy time, this process with its reaped
    children (wrk), and one server process (0 when none)."""

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
        return cls(busy / CLOCK_TICKS, own, process_cpu_s(server_pid) if server_pid else 0.0)

    def cores_since(self, start: Cpu, seconds: float) -> Usage:
        """Cores used by the server and by everything else (other users of the machine)."""
        server = self.server_s - start.server_s
        other = (self.machine_s - start.machine_s) - (self.own_s - start.own_s) - server
        return Usage(server / seconds, max(0.0, other) / seconds)


@dataclass(frozen=True)
class Usage:
    server_cores: float
    other_cores: float


def process_cpu_s(pid: int) -> float:
    """utime + stime of a live process (all its threads), from /proc/PID/stat."""
    after_name = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(after_name[11]) + int(after_name[12])) / CLOCK_TICKS


@dataclass(frozen=True)
class Run:
    tier: str
    batching: str
    concurrency: int
    load: Load
    server: Counters
    usage: Usage


@dataclass(frozen=True)
class Raw:
    tier: str
    batch: int
    rows_per_s: float
    ms_per_batch: float
    padded_len: float
    other_cores: float

    @property
    def us_per_token(self) -> float:
        return 1000 * self.ms_per_batch / (self.batch * self.padded_len)


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


def write_bodies(texts: Sequence[str], path: Path) -> Path:
    """One V2 request body per line (json.dumps escapes newlines inside texts)."""
    lines = (json.dumps({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES",
                                     "data": [t]}], "parameters": {"threshold": 0}})
             for t in texts)
    path.write_text("\n".join(lines) + "\n")
    return path


# --- raw model, in-process -------------------------------------------------------------------

def rotating_batches(texts: Sequence[str], size: int) -> list[list[str]]:
    """Consecutive batches through the rotation until it lines up again (every text equally)."""
    count = len(texts) // math.gcd(len(texts), size)
    return [[texts[(k * size + i) % len(texts)] for i in range(size)] for k in range(count)]


def time_batches(predict: Callable[[Any], object], batches: Sequence[Any],
                 seconds: float) -> tuple[int, float]:
    """(batches run, elapsed seconds) for ``predict`` cycling through ``batches``."""
    for batch in batches[:3]:
        predict(batch)  # warm-up
    done, started = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - started) < seconds:
        predict(batches[done % len(batches)])
        done += 1
    return done, elapsed


def raw_runs(tier: str, release: Release, texts: Sequence[str], seconds: float) -> list[Raw]:
    from serving.text import encode, load_tokenizer

    predict = load_predict(tier, release)
    tokenizer = load_tokenizer(release.tokenizer, release.max_length)
    runs = []
    for size in RAW_BATCHES:
        encoded = [encode(tokenizer, b) for b in rotating_batches(texts, size)]
        start, wall = Cpu.now(), time.perf_counter()
        done, elapsed = time_batches(predict, encoded, seconds)
        other = Cpu.now().cores_since(start, time.perf_counter() - wall).other_cores
        padded = sum(e.input_ids.shape[1] for e in encoded) / len(encoded)
        runs.append(Raw(tier, size, done * size / elapsed, 1000 * elapsed / done, padded,
                        other))
    return runs


def load_predict(tier: str, release: Release) -> Callable[[Any], object]:
    """The tier's runtime exactly as its server builds it (threads=0: the runtime default)."""
    if tier == "edge":
        from edge.runtime import OnnxRuntime

        session = OnnxRuntime(release.model_file, 0).session
        return lambda encoded: session.run(None, encoded.feeds())
    import torch

    from center.runtime import TorchScriptRuntime

    return TorchScriptRuntime(release.model_file, torch.device("cpu"), "fp32", 0).predict


# --- servers under wrk -----------------------------------------------------------------------

@contextmanager
def server(tier: str, store: Path, logs: Path, *flags: str) -> Iterator[TierProcess]:
    """A running ``edge``/``center`` on a free loopback port, stopped by PID afterwards."""
    process = start_tier(tier, store, logs, *flags, timeout=120)
    try:
        yield process
    finally:
        process.stop()


def check_answers(url: str, bodies: Path) -> None:
    """One real request: 200, and the edge answered it alone (nothing escalated)."""
    body = bodies.read_text().splitlines()[0]
    response = httpx.post(f"{url}/v2/models/{MODEL}/infer", content=body, timeout=30,
                          headers={"Content-Type": "application/json"})
    if response.status_code != 200:
        raise RuntimeError(f"{url}: {response.status_code} {response.text[:500]}")
    if response.json().get("parameters", {}).get("escalated", 0):
        raise RuntimeError(f"{url}: the edge escalated with threshold 0: {response.text[:500]}")


@dataclass(frozen=True)
class Plan:
    """What every server run shares."""

    wrk: str
    logs: Path
    bodies: Path
    seconds: int
    warmup: int
    threads: int


def wrk(plan: Plan, url: str, concurrency: int, seconds: int) -> Load:
    command = [plan.wrk, "-t1", f"-c{concurrency}", f"-d{seconds}s", "--timeout", "10s", "-s",
               str(LUA), f"{url}/v2/models/{MODEL}/infer", "--", str(plan.bodies)]
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
                    totals.get(f"{tier}_compute_duration_seconds_sum", 0.0))


def measure(plan: Plan, handle: TierProcess, tier: str, batching: str, concurrency: int) -> Run:
    before, cpu = counters(handle.url, tier), Cpu.now(handle.pid)
    load = wrk(plan, handle.url, concurrency, plan.seconds)
    usage = Cpu.now(handle.pid).cores_since(cpu, load.seconds)
    run = Run(tier, batching, concurrency, load, counters(handle.url, tier) - before, usage)
    console.log(f"{tier:6} batching {batching:3} c={concurrency:<2} {load.rps:8.1f} req/s  "
                f"p50 {load.p50_ms:7.2f} ms  p99 {load.p99_ms:7.2f} ms  errors {load.errors}  "
                f"server {usage.server_cores:.2f} cores, others {usage.other_cores:.2f}")
    return run


def server_runs(plan: Plan, tier: str, store: Path, batching: str,
                levels: Sequence[int]) -> list[Run]:
    flags = (*(EDGE_FLAGS if tier == "edge" else ()), "--threads", str(plan.threads),
             *(BATCHING_ON if batching == "on" else BATCHING_OFF))
    with server(tier, store, plan.logs, *flags) as handle:
        check_answers(handle.url, plan.bodies)
        wrk(plan, handle.url, SATURATION, plan.warmup)
        return [measure(plan, handle, tier, batching, c) for c in levels]


# --- report ----------------------------------------------------------------------------------

def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def machine_table(wrk: str, duration: int, threads: int) -> Table:
    table = Table(title="Machine", show_header=False)
    wrk_version = subprocess.run([wrk, "--version"], capture_output=True, text=True).stdout
    rows = [("date", datetime.now().astimezone().isoformat(timespec="seconds")),
            ("cpu", cpu_model()),
            ("cores", f"{os.cpu_count()} logical, {len(os.sched_getaffinity(0))} usable"),
            ("python", sys.version.split()[0]),
            ("onnxruntime / torch", f"{metadata.version('onnxruntime')} / "
                                    f"{metadata.version('torch')}"),
            ("wrk", (wrk_version.split("Copyright")[0] or "?").strip()),
            ("load", f"wrk -t1, {duration} s per run, {TEXTS} test texts rotated, 1 per req"),
            ("server flags", f"--threads {threads} (0 = runtime default); edge --cache-size 0"),
            ("load average", " ".join(Path("/proc/loadavg").read_text().split()[:3]))]
    for key, value in rows:
        table.add_row(key, value)
    return table


def ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f}"


def cores(value: float) -> str:
    """Cores used by other processes; flagged when they may have skewed the measurement."""
    return f"[red]{value:.2f}[/]" if value > BUSY_OTHERS else f"{value:.2f}"


def raw_table(raws: Sequence[Raw]) -> Table:
    table = Table(title="Raw model in-process (no HTTP)")
    for column in ("tier", "batch", "rows/s", "ms/batch", "ms/row", "padded len", "µs/token",
                   "others' cores"):
        table.add_column(column, justify="left" if column == "tier" else "right")
    for r in raws:
        table.add_row(r.tier, str(r.batch), f"{r.rows_per_s:.1f}", ms(r.ms_per_batch),
                      ms(r.ms_per_batch / r.batch), f"{r.padded_len:.1f}",
                      f"{r.us_per_token:.1f}", cores(r.other_cores))
    return table


def runs_table(title: str, runs: Sequence[Run]) -> Table:
    table = Table(title=title)
    columns = ("tier", "batch", "conc", "req/s", "p50 ms", "p99 ms", "errors", "rows/exec",
               "compute ms/row", "server cores", "others' cores")
    for column in columns:
        table.add_column(column, justify="left" if column in columns[:2] else "right")
    for r in runs:
        table.add_row(r.tier, r.batching, str(r.concurrency), f"{r.load.rps:.1f}",
                      ms(r.load.p50_ms), ms(r.load.p99_ms), str(r.load.errors),
                      ms(r.server.mean_batch), ms(r.server.compute_ms_per_row),
                      f"{r.usage.server_cores:.2f}", cores(r.usage.other_cores))
    return table


def verdict(ratio: float, goal: float) -> str:
    return "[green]met[/]" if ratio >= goal else "[red]missed[/]"


def keep_line(edge: Sequence[Run], raws: Sequence[Raw]) -> str:
    best = max((r for r in raws if r.tier == "edge"), key=lambda r: r.rows_per_s)
    saturated = next(r for r in edge if r.concurrency == SATURATION)
    ratio = saturated.load.rps / best.rows_per_s
    return (f"Edge server at concurrency {SATURATION}: {saturated.load.rps:.1f} req/s = "
            f"{ratio:.0%} of raw onnxruntime at its best batch size ({best.batch}: "
            f"{best.rows_per_s:.1f} rows/s); goal >= {GOAL_KEEP:.0%}: "
            f"{verdict(ratio, GOAL_KEEP)}")


def batching_table(on: Sequence[Run], off: Sequence[Run]) -> Table:
    table = Table(title=f"Adaptive batching at concurrency {SATURATION}: on (32 rows, 5 ms) "
                        f"vs off (1 row)")
    for column in ("tier", "req/s on", "req/s off", "on/off", "p99 on ms", "p99 off ms",
                   f"goal >= {GOAL_BATCHING:.0f}x"):
        table.add_column(column, justify="left" if column == "tier" else "right")
    for a, b in zip(on, off, strict=True):
        ratio = a.load.rps / b.load.rps if b.load.rps else math.nan
        table.add_row(a.tier, f"{a.load.rps:.1f}", f"{b.load.rps:.1f}", f"{ratio:.2f}x",
                      ms(a.load.p99_ms), ms(b.load.p99_ms), verdict(ratio, GOAL_BATCHING))
    return table


def cost_table(edge: tuple[Run, Run], center: tuple[Run, Run], raws: Sequence[Raw]) -> Table:
    """``edge``/``center``: the concurrency-1 runs with batching (off, on)."""
    table = Table(title="Cost per request at concurrency 1: INT8 edge vs fp32 center")
    for column in ("measure", "edge INT8", "center fp32", "center/edge"):
        table.add_column(column, justify="left" if column == "measure" else "right")
    raw = {r.tier: r.ms_per_batch for r in raws if r.batch == 1}
    (e_off, e_on), (c_off, c_on) = edge, center
    rows = [("server p50 latency, batching off (ms)", e_off.load.p50_ms, c_off.load.p50_ms),
            ("server mean latency, batching off (ms)", e_off.load.mean_ms, c_off.load.mean_ms),
            ("server p50 latency, batching on: + up to 5 ms wait (ms)", e_on.load.p50_ms,
             c_on.load.p50_ms),
            ("server model compute per row, batching off (ms)",
             e_off.server.compute_ms_per_row, c_off.server.compute_ms_per_row),
            ("in-process model, one row (ms)", raw["edge"], raw["center"])]
    for name, e, c in rows:
        table.add_row(name, ms(e), ms(c), f"{c / e:.2f}x")
    return table


def interference_note(raws: Sequence[Raw], runs: Sequence[Run]) -> str:
    busy = max([r.other_cores for r in raws] + [r.usage.other_cores for r in runs])
    if busy <= BUSY_OTHERS:
        return f"Other processes used at most {busy:.2f} cores during any measurement."
    return (f"[red]Other processes used up to {busy:.2f} cores during a measurement: the "
            f"flagged rows are skewed; rerun on a quiet machine.[/]")


# --- main ------------------------------------------------------------------------------------

def bench_parser(doc: str | None, quick: str) -> argparse.ArgumentParser:
    """The options every benchmark takes: --duration, --quick, --registry, --markdown."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0] if doc else "")
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


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = bench_parser(__doc__, "3 s runs, 1 s raw timing and warm-up (a smoke run, ~1 min)")
    parser.add_argument("--server-threads", type=int, default=0,
                        help="--threads for both servers (default 0: the runtime's default)")
    return parse_bench_args(parser, argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    show = Shown(console)
    wrk_path = ensure_wrk()
    raw_seconds, warmup = (1.0, 1) if args.quick else (3.0, 2)
    show(machine_table(wrk_path, args.duration, args.server_threads))
    texts = review_texts(TEXTS)
    with tempfile.TemporaryDirectory(prefix="bench-serving-") as tmp:
        work = Path(tmp)
        edge, center = (pull(args.registry, t, work / t) for t in ("edge", "center"))
        bodies = write_bodies(texts, work / "bodies.jsonl")
        console.log(f"{MODEL}: edge version {edge.folder.name} ({edge.model_file.name}), "
                    f"center version {center.folder.name} ({center.model_file.name})")
        console.log("raw in-process timing")
        raws = [*raw_runs("edge", edge, texts, raw_seconds),
                *raw_runs("center", center, texts, raw_seconds)]
        plan = Plan(wrk_path, work, bodies, args.duration, warmup, args.server_threads)
        edge_on = server_runs(plan, "edge", edge.store, "on", CONCURRENCY)
        edge_off = server_runs(plan, "edge", edge.store, "off", (1, SATURATION))
        center_on = server_runs(plan, "center", center.store, "on", (1, SATURATION))
        center_off = server_runs(plan, "center", center.store, "off", (1, SATURATION))
    show(raw_table(raws))
    show(runs_table("Edge server under wrk (batching on)", edge_on))
    show(keep_line(edge_on, raws))
    show(batching_table([edge_on[-1], center_on[-1]], [edge_off[-1], center_off[-1]]))
    show(cost_table((edge_off[0], edge_on[0]), (center_off[0], center_on[0]), raws))
    everything = [*edge_on, *edge_off, *center_on, *center_off]
    show(runs_table("All server runs", everything))
    show(interference_note(raws, everything))
    if args.markdown:
        show.write(args.markdown, "Serving: edge and center under wrk vs the raw runtimes")


if __name__ == "__main__":
    main()
