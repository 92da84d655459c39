"""What ``bench.fleet`` measures for one fleet size: a real ``registry serve`` in a fresh home,
N simulated nodes in worker processes (``bench.fleet.worker``), then the connect storm, a
window at rest, a real ``registry publish`` and the download wave."""

from __future__ import annotations

import contextlib
import json
import math
import re
import resource
import shutil
import sqlite3
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.fleet.worker import Plan, Status
from bench.harness import console
from bench.rollout.measure import MODEL, Busy, Cli, percentile, push_times
from harness.load import process_cpu_s
from harness.processes import RegistryProcess, start_registry

TOKEN = "bench-fleet-token-0123456789"
REGION = "fleet"
PER_WORKER = 2_500  # simulated nodes per worker process
SEGMENT_HEADERS = 52  # IPv4 (20) + TCP (20) + the timestamp option (12) per segment
CONNECT_TIMEOUT_S = 600.0
ROUND_TIMEOUT_S = 300.0
PEER = re.compile(r"node (\S+) \(.*\) connected from ipv4:127\.0\.0\.1:(\d+)")
GOAL_RSS_MIB = 2048
Counts = tuple[int, int, int, int]  # bytes_sent, bytes_received, segs_out, segs_in
GOAL_IDLE_KBIT_S = 0.25
GOAL_DIRECTIVE_S = 10.0


@dataclass(frozen=True)
class Options:
    busy_every: int  # every busy_every-th edge reports traffic
    rows_per_s: float
    centers: int
    capacity_rows_s: float
    wave: int
    wave_pace_per_s: float
    rest_s: float
    fidelity: float = 0.995


@dataclass
class Traffic:
    """Bytes and segments per connection per second over the rest window, by class."""

    connections: int
    up_bytes_s: float  # TCP payload, node -> registry
    down_bytes_s: float  # registry -> node
    up_wire_s: float  # payload + IPv4/TCP headers (segment counts)
    down_wire_s: float

    @property
    def kbit_s(self) -> float:
        return (self.up_bytes_s + self.down_bytes_s) * 8 / 1000

    @property
    def wire_kbit_s(self) -> float:
        return (self.up_wire_s + self.down_wire_s) * 8 / 1000


@dataclass
class SizeResult:
    nodes: int
    edges: int
    centers: int
    busy: int
    workers: int
    connect_s: float
    connect_registry_cores: float
    connected: int
    storm_failures: int  # streams that failed during the storm (the nodes reconnected)
    rss_mib: float
    rest_cores: float
    rest_s: float
    rest_other_cores: float  # other processes on the machine during the window
    sim_cores: float
    sim_rss_mib: float
    metrics_bytes: int
    scrape_s: float
    traffic: dict[str, Traffic]
    publish_s: float
    directive_p50_s: float
    directive_p99_s: float
    directive_max_s: float
    pushed_first_s: float  # the registry's first and last push of it (its log)
    pushed_last_s: float
    directive_within_goal: int
    directive_received: int
    active_max_s: float
    publish_registry_cores: float
    wave: int
    wave_bytes: float
    wave_s: float
    wave_interrupted: int  # wave nodes whose first fetches broke (then resumed)
    wave_resumed: int  # fetches that resumed at the partial file's offset
    wave_cut_bytes: int  # bytes the broken fetches had written (not fetched again)
    recorded_active: int
    recorded_acks: int
    reports: int
    budgets: int
    errors: list[str] = field(default_factory=list)

    @property
    def wave_mib_s(self) -> float:
        return self.wave_bytes / 2**20 / self.wave_s if self.wave_s > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["wave_mib_s"] = self.wave_mib_s
        data["traffic"] = {k: asdict(t) | {"kbit_s": t.kbit_s, "wire_kbit_s": t.wire_kbit_s}
                           for k, t in self.traffic.items()}
        return data


def raise_nofile() -> None:
    """Up to the hard limit: the registry (started from here) holds a socket per node."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return math.nan


def sockets(port: int) -> dict[int, Counts]:
    """The node ends of established connections to ``port``: local port -> (bytes_sent,
    bytes_received, segs_out, segs_in), from ``ss -tinH``."""
    out = subprocess.run(["ss", "-tinH", "state", "established", f"( dport = :{port} )"],
                         capture_output=True, text=True, check=True).stdout
    found: dict[int, Counts] = {}
    local = None
    for line in out.splitlines():
        if not line.startswith((" ", "\t")):
            fields = line.split()
            local = int(fields[2].rsplit(":", 1)[1]) if len(fields) >= 4 else None
            continue
        if local is None:
            continue
        values = dict(re.findall(r"\b(bytes_sent|bytes_received|segs_out|segs_in):(\d+)", line))
        found[local] = tuple(int(values.get(k, 0)) for k in  # type: ignore[assignment]
                             ("bytes_sent", "bytes_received", "segs_out", "segs_in"))
        local = None
    return found


def peers(log: Path) -> dict[int, str]:
    """Node port -> node id, from the registry's "connected from" lines."""
    found: dict[int, str] = {}
    for line in log.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            match = PEER.search(str(json.loads(line).get("msg", "")))
            if match:
                found[int(match[2])] = match[1]
    return found


def traffic(before: dict[int, Counts], after: dict[int, Counts],
            classes: dict[int, str], seconds: float) -> dict[str, Traffic]:
    sums: dict[str, list[float]] = {}
    for port, b in after.items():
        a = before.get(port)
        kind = classes.get(port)
        if a is None or kind is None:
            continue
        d = [y - x for x, y in zip(a, b, strict=True)]
        s = sums.setdefault(kind, [0, 0, 0, 0, 0])
        s[0] += 1
        s[1] += d[0]
        s[2] += d[1]
        s[3] += d[0] + d[2] * SEGMENT_HEADERS
        s[4] += d[1] + d[3] * SEGMENT_HEADERS
    return {k: Traffic(int(s[0]), *(v / s[0] / seconds for v in s[1:])) for k, s in sums.items()}


class Workers:
    """The worker processes, driven over their stdin/stdout."""

    def __init__(self, plans: list[Plan], log_dir: Path) -> None:
        self.processes = []
        for i, plan in enumerate(plans):
            log = (log_dir / f"worker-{i}.log").open("wb")
            process = subprocess.Popen([sys.executable, "-m", "bench.fleet.worker"],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       stderr=log, text=True, bufsize=1)
            assert process.stdin is not None
            process.stdin.write(json.dumps(asdict(plan)) + "\n")
            self.processes.append(process)
        for process in self.processes:
            self._read(process)  # ready

    def _read(self, process: subprocess.Popen[str]) -> dict[str, Any]:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line:
            raise RuntimeError(f"worker {process.pid} exited {process.wait()}")
        return dict(json.loads(line))

    def ask(self, **command: Any) -> list[dict[str, Any]]:
        for process in self.processes:
            assert process.stdin is not None
            process.stdin.write(json.dumps(command) + "\n")
        return [self._read(p) for p in self.processes]

    def status(self, version: int) -> Status:
        parts = [Status(**s) for s in self.ask(cmd="status", version=version)]
        return Status(sum(p.connected for p in parts), sum(p.errors for p in parts),
                      sum(p.failures for p in parts),
                      [e for p in parts for e in p.errors_shown][:5],
                      sum(p.reports for p in parts), sum(p.budgets for p in parts),
                      [t for p in parts for t in p.received],
                      [t for p in parts for t in p.verified],
                      [t for p in parts for t in p.fetching],
                      sum(p.fetched_bytes for p in parts), sum(p.interrupted for p in parts),
                      sum(p.resumed for p in parts), sum(p.cut_bytes for p in parts))

    def rss_mib(self) -> float:
        return sum(rss_mib(p.pid) for p in self.processes if p.poll() is None)

    def stop(self) -> None:
        for process in self.processes:
            with contextlib.suppress(Exception):
                assert process.stdin is not None
                process.stdin.write(json.dumps({"cmd": "stop"}) + "\n")
                process.stdin.close()
        for process in self.processes:
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def wait_all(workers: Workers, version: int, count: int, timeout: float,
             what: str) -> Status:
    deadline = time.monotonic() + timeout
    said = 0.0
    while True:
        status = workers.status(version)
        if len(status.verified) + status.errors >= count or time.monotonic() > deadline:
            return status
        if time.monotonic() - said > 10:
            console.log(f"{what}: {status.connected} connected, {len(status.received)} "
                        f"received v{version}, {len(status.verified)} active, "
                        f"{status.failures} streams failed ({status.errors_shown[:1]})")
            said = time.monotonic()
        time.sleep(0.5)


def recorded(home: Path, version: int) -> tuple[int, int]:
    """(nodes the registry's database shows ACTIVE on ``version``, ack records of it)."""
    with contextlib.closing(sqlite3.connect(f"file:{home / 'registry.sqlite3'}?mode=ro",
                                            uri=True)) as conn:
        active = conn.execute("SELECT count(*) FROM node_models WHERE model = ? AND version = ? "
                              "AND state = 'ACTIVE'", [MODEL, version]).fetchone()[0]
        acks = conn.execute("SELECT count(*) FROM audit WHERE action = 'ack' AND model = ? AND "
                            "version = ?", [MODEL, version]).fetchone()[0]
    return int(active), int(acks)


def plans(n: int, options: Options, target: str, store: Path, first: int,
          second: int) -> list[Plan]:
    edges = n - options.centers
    workers = max(1, math.ceil(n / PER_WORKER))
    wave = list(range(0, edges, max(1, edges // options.wave)))[:options.wave]
    out = []
    for w in range(workers):
        start = w * edges // workers
        stop = (w + 1) * edges // workers
        centers = options.centers if w == 0 else 0
        out.append(Plan(target, TOKEN, REGION, MODEL, start, stop - start, options.busy_every,
                        options.rows_per_s, centers, options.capacity_rows_s,
                        [i for i in wave if start <= i < stop], second,
                        options.wave_pace_per_s, str(store), options.fidelity))
    del first
    return out


def run_size(n: int, options: Options, template: Path, second: Path,
             work: Path) -> SizeResult:
    """One fleet of ``n`` nodes against a fresh copy of ``template`` (v1 published)."""
    root = work / f"n{n}"
    home = root / "registry"
    shutil.copytree(template, home)
    cli = Cli(home)
    registry: RegistryProcess | None = None
    workers: Workers | None = None
    try:
        registry = start_registry(home, root, TOKEN, env={"HOME": str(root)})
        worker_plans = plans(n, options, registry.target, root / "stores", 1, 2)
        edges = n - options.centers
        busy = sum(1 for i in range(edges)
                   if options.busy_every and i % options.busy_every == 0)
        workers = Workers(worker_plans, root)
        cpu0 = process_cpu_s(registry.pid)
        started = min(float(s["started"]) for s in workers.ask(cmd="go"))
        status = wait_all(workers, 1, n, CONNECT_TIMEOUT_S, f"connect storm ({n})")
        connect_s = max(status.verified, default=math.nan) - started
        connect_cores = (process_cpu_s(registry.pid) - cpu0) / max(time.time() - started, 1e-9)
        errors = list(status.errors_shown)
        storm_failures = status.failures
        console.log(f"{n} nodes: {len(status.verified)} holding v1 {connect_s:.1f} s after the "
                    f"storm began ({status.failures} streams failed and reconnected)")
        # at rest: every node has had a report interval to send its first report
        time.sleep(10.0 + 2.0)
        classes = {port: ("center" if "center" in node else
                          "busy edge" if options.busy_every and
                          int(node.rsplit("-", 1)[1]) % options.busy_every == 0 else "idle edge")
                   for port, node in peers(registry.log).items()}
        pids = [registry.pid, *(p.pid for p in workers.processes)]
        machine0 = Busy.now(pids)
        sims_cores = sum(process_cpu_s(p.pid) for p in workers.processes)
        before, cpu_a, at_a = sockets(registry.port), process_cpu_s(registry.pid), time.time()
        time.sleep(options.rest_s)
        after, cpu_b, at_b = sockets(registry.port), process_cpu_s(registry.pid), time.time()
        others = Busy.now(pids).others_since(machine0)
        rest = at_b - at_a
        rest_cores = (cpu_b - cpu_a) / rest
        sims_cores = (sum(process_cpu_s(p.pid) for p in workers.processes) - sims_cores) / rest
        rss = rss_mib(registry.pid)
        scraped = time.monotonic()
        metrics_bytes = len(httpx.get(registry.metrics_url, timeout=60).content)
        scrape_s = time.monotonic() - scraped
        by_class = traffic(before, after, classes, rest)
        held = workers.status(1)
        console.log(f"{n} nodes at rest: registry RSS {rss:.0f} MiB, {rest_cores:.3f} cores; "
                    + ", ".join(f"{k} {t.kbit_s:.3f} kbit/s" for k, t in by_class.items()))
        cpu_p = process_cpu_s(registry.pid)
        begun = time.monotonic()
        cli.run("publish", str(second), "--name", MODEL, timeout=600)
        returned, publish_s = time.time(), time.monotonic() - begun
        status = wait_all(workers, 2, n, ROUND_TIMEOUT_S, f"publish ({n})")
        publish_cores = (process_cpu_s(registry.pid) - cpu_p) / max(time.monotonic() - begun,
                                                                     1e-9)
        errors += status.errors_shown
        delays = [t - returned for t in status.received]
        pushed = [t - returned for t in push_times(registry.log, 2, "fleet-").values()]
        wave_bytes, wave_s = status.fetched_bytes, 0.0
        if status.fetching:
            wave_done = sorted(status.verified)  # the wave's are the last to go ACTIVE
            wave_s = wave_done[-1] - min(status.fetching)
        result = SizeResult(
            n, edges, options.centers, busy, len(worker_plans), connect_s, connect_cores,
            held.connected, storm_failures, rss, rest_cores, rest, others, sims_cores,
            workers.rss_mib(),
            metrics_bytes, scrape_s, by_class,
            publish_s, percentile(delays, 50), percentile(delays, 99),
            max(delays, default=math.nan), min(pushed, default=math.nan),
            max(pushed, default=math.nan),
            sum(1 for d in delays if d <= GOAL_DIRECTIVE_S), len(delays),
            max(status.verified, default=math.nan) - returned, publish_cores,
            len(status.fetching), wave_bytes, wave_s, status.interrupted, status.resumed,
            status.cut_bytes, 0, 0, held.reports, held.budgets, errors)
        console.log(f"{n} nodes: directive p50 {result.directive_p50_s:.2f} s, max "
                    f"{result.directive_max_s:.2f} s after publish returned; all active "
                    f"{result.active_max_s:.2f} s")
    finally:
        if workers is not None:
            workers.stop()
        if registry is not None:
            registry.stop()  # SIGTERM: a clean stop writes what it holds
    result.recorded_active, result.recorded_acks = recorded(home, 2)
    shutil.rmtree(root / "stores", ignore_errors=True)
    return result
