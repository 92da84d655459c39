"""The model-sync benchmark's measurements: a registry and two nodes started empty, then
(1) propagation of a publish, (2) fan-out to simulated subscribers, (3) edge p99 during a swap.
How and why: docs/benchmark-methods.md, "Model sync (rollout)".
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from bench.fleet.sim import Sim, make_sim, subscribe
from bench.harness import MODEL, Cpu, Plan, console, wrk
from bench.kit import ROOT
from bench.loadgen import MIB
from harness.load import Load, process_cpu_s
from harness.metrics import metric, samples
from harness.processes import (
    BIN,
    RegistryProcess,
    TierProcess,
    start_tier,
)

RELEASE = ROOT / "var" / "demo" / "release"
TOKEN = "bench-sync-token-0123456789"
SIM_REGION = "bench"  # the region in each simulated node's token and hello
SYNC_FLAGS = ("--sync-backoff-max-s", "1")
EDGE_FLAGS = ("--cache-size", "0")
NODES = ("center", "edge")
POLL_S = 0.02  # propagation: /ready polling interval
SWAP_POLL_S = 0.05  # during wrk: lighter polling
SWAP_AFTER_S = 1.0  # promote this long into the swap run
CONCURRENCY = 8
PUBLISH_TIMEOUT_S = 600.0
PROPAGATION_TIMEOUT_S = 180.0
FANOUT_TIMEOUT_S = 180.0
GOAL_PUSH_S = 1.0
GOAL_FANOUT_S = 10.0
PUSHING = re.compile(r"pushing (\S+) version (\d+) \((\w+)\) to (\S+)")


# --- results ---------------------------------------------------------------------------------

@dataclass
class NodeRollout:
    """One node during one rollout; times in seconds after the registry command returned
    (``*_s``) and after its transaction committed (``*_commit_s``)."""

    node: str
    tier: str
    push_s: float | None
    push_commit_s: float | None
    serving_s: float | None
    serving_commit_s: float | None
    received: float
    reused: float
    artifact_bytes: int
    status: str


@dataclass
class Propagation:
    kind: str
    version: int
    publish_s: float
    exit_s: float  # from the commit (audit record) to the publish command's return
    registry_sent: float
    other_cores: float
    nodes: list[NodeRollout]


@dataclass
class Round:
    """One fan-out round; times in seconds after ``trigger`` (the moment it was issued)."""

    name: str
    trigger: str
    version: int
    subscribers: int
    verified: int
    errors: list[str]
    command_s: float
    push_first_s: float
    push_last_s: float
    all_received_s: float
    all_verified_s: float
    verified_p50_s: float
    verified_p99_s: float
    verified_max_s: float
    received_p50_s: float
    received_p99_s: float
    bytes_min: float
    bytes_max: float
    artifact_bytes: int
    total_bytes: float
    registry_sent: float
    other_cores: float

    @property
    def mib_per_s(self) -> float:
        return self.total_bytes / MIB / self.all_verified_s if self.all_verified_s > 0 else 0.0


@dataclass
class Fanout:
    subscribers: int
    connections: int
    sessions: float
    rounds: list[Round]


@dataclass
class LoadRun:
    name: str
    load: Load
    other_cores: float
    by_version: dict[str, float] = field(default_factory=dict)


@dataclass
class Swap:
    canary_publish_s: float
    steady: LoadRun
    swap: LoadRun
    promote_at_s: float  # seconds into the swap run when promote returned
    switched_s: float | None  # seconds after promote returned until the edge served the new one
    switched_commit_s: float | None  # the same, from the promote's commit
    old: int
    new: int

    @property
    def inside(self) -> bool:
        """The edge switched while wrk ran, and both versions answered requests of the run."""
        return self.switched_s is not None and \
            self.promote_at_s + self.switched_s < self.swap.load.seconds and \
            self.swap.by_version.get(str(self.old), 0) > 0 and \
            self.swap.by_version.get(str(self.new), 0) > 0


@dataclass(frozen=True)
class Busy:
    """CPU seconds so far: the whole machine, and ours (this process, its reaped children such
    as registry commands and wrk, and the live servers ``pids``)."""

    machine_s: float
    ours_s: float
    at: float

    @classmethod
    def now(cls, pids: Sequence[int]) -> Busy:
        base = Cpu.now()
        ours = base.own_s
        for pid in pids:
            with contextlib.suppress(OSError):
                ours += process_cpu_s(pid)
        return cls(base.machine_s, ours, time.monotonic())

    def others_since(self, start: Busy) -> float:
        """Cores used by other processes (another user of the machine) since ``start``."""
        seconds = self.at - start.at
        others = (self.machine_s - start.machine_s) - (self.ours_s - start.ours_s)
        return max(0.0, others) / seconds if seconds > 0 else 0.0


@dataclass
class Results:
    rollouts: list[Propagation]
    fanout: Fanout
    swap: Swap
    logs: dict[str, dict[str, int]] = field(default_factory=dict)  # process -> level -> lines


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return math.nan
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def fmt_s(value: float | None, digits: int = 2) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.{digits}f}"


# --- the registry command and the fleet ------------------------------------------------------

@dataclass(frozen=True)
class Cli:
    """The installed ``registry`` command against one home."""

    home: Path

    def env(self) -> dict[str, str]:
        return {"PATH": str(BIN), "REGISTRY_HOME": str(self.home), "HOME": str(self.home.parent),
                "REGISTRY_ACTOR": "bench@sync", "COLUMNS": "200"}

    def command(self, *args: str) -> list[str]:
        return [str(BIN / "registry"), "--home", str(self.home), *args]

    def run(self, *args: str, timeout: float = 120) -> str:
        result = subprocess.run(self.command(*args), capture_output=True, text=True,
                                env=self.env(), timeout=timeout)
        if result.returncode != 0:
            raise RuntimeError(f"registry {' '.join(args)} exited {result.returncode}: "
                               f"{result.stderr[-2000:]}")
        return result.stdout

    def json(self, *args: str) -> Any:
        return json.loads(self.run(*args, "--json"))

    def committed(self, action: str, version: int) -> float:
        """Wall-clock time (epoch s) of the audit record of the last ``action`` of ``version``:
        written in the transaction that made the change, just before it committed."""
        records = [r for r in self.json("audit", "--model", MODEL)
                   if r["action"] == action and r["version"] == version]
        return datetime.fromisoformat(records[-1]["at"]).timestamp()

    def artifact_bytes(self, version: int) -> dict[str, int]:
        """Per tier, the bytes a node of that tier needs: its model, the tokenizer and the
        fidelity probe."""
        manifest = self.json("show", f"{MODEL}@{version}")["manifest"]
        shared = sum(int(manifest[role]["size"]) for role in ("tokenizer", "probe")
                     if manifest.get(role))
        return {tier: int(manifest[tier]["size"]) + shared for tier in NODES}


def start_node(tier: str, store: Path, logs: Path, *flags: str,
               timeout: float = 60) -> TierProcess:
    """A node with an empty store: waits for /v2/health/live only (sync installs the model)."""
    return start_tier(tier, store, logs, *flags, timeout=timeout, until="live",
                      env={"PATH": str(BIN), "HOME": str(logs)}, registry_secret=TOKEN)


def node_id(node: TierProcess) -> str:
    return f"{node.tier}-{node.port}"


def served(http: httpx.Client, url: str) -> int | None:
    """The version ``url`` serves by default (None: none yet, or no answer)."""
    try:
        response = http.get(f"{url}/v2/models/{MODEL}/ready")
    except httpx.HTTPError:
        return None
    return int(response.json()["version"]) if response.status_code == 200 else None


def successes_by_version(edge: TierProcess) -> dict[str, float]:
    counts: dict[str, float] = {}
    for name, labels, value in samples(f"{edge.url}/metrics"):
        version = re.search(r'version="(\d+)"', labels)
        if name == "edge_request_success_total" and version:
            counts[version[1]] = counts.get(version[1], 0.0) + value
    return counts


def sync_bytes(node: TierProcess) -> tuple[float, float]:
    """(received, reused) artifact bytes so far."""
    values = {n: v for n, _, v in samples(f"{node.url}/metrics")}
    return (values.get(f"{node.tier}_sync_bytes_received_total", 0.0),
            values.get(f"{node.tier}_sync_bytes_reused_total", 0.0))


def push_times(log: Path, version: int, prefix: str = "") -> dict[str, float]:
    """Per node (whose id starts with ``prefix``), the wall-clock time (epoch s) of the
    registry's first push of ``version`` to it."""
    pushed: dict[str, float] = {}
    for line in log.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        match = PUSHING.match(str(entry.get("msg", ""))) if isinstance(entry, dict) else None
        if match and match[1] == MODEL and int(match[2]) == version and \
                match[4].startswith(prefix):
            at = datetime.strptime(entry["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
            pushed.setdefault(match[4], at.timestamp())
    return pushed


# --- part 1: propagation ---------------------------------------------------------------------

def watch(urls: dict[str, str], version: int, stop: threading.Event,
          interval: float) -> dict[str, float]:
    """Monotonic time at which each node first served ``version``, polling until all do or
    ``stop`` is set."""
    seen: dict[str, float] = {}
    with httpx.Client(timeout=2) as http:
        while len(seen) < len(urls) and not stop.is_set():
            for name, url in urls.items():
                if name not in seen and served(http, url) == version:
                    seen[name] = time.monotonic()
            time.sleep(interval)
    return seen


@dataclass(frozen=True)
class Issued:
    """A registry command run while nodes were watched."""

    seconds: float  # how long the command ran
    returned: float  # monotonic
    returned_wall: float  # epoch
    serving: dict[str, float]  # node -> monotonic time it served the version


def issue(cli: Cli, nodes: Sequence[TierProcess], version: int, *args: str,
          interval: float = POLL_S) -> Issued:
    """Run ``registry ARGS`` and wait until every node serves ``version`` (or time runs out)."""
    stop = threading.Event()
    urls = {node_id(n): n.url for n in nodes}
    with ThreadPoolExecutor(1, thread_name_prefix="watch") as pool:
        future = pool.submit(watch, urls, version, stop, interval)
        try:
            started = time.monotonic()
            cli.run(*args, timeout=PUBLISH_TIMEOUT_S)
            returned, wall = time.monotonic(), time.time()
            with contextlib.suppress(FutureTimeout):
                future.result(timeout=PROPAGATION_TIMEOUT_S)
        finally:
            stop.set()
        serving = future.result()
    return Issued(returned - started, returned, wall, serving)


def registry_view(cli: Cli, nodes: Sequence[TierProcess], version: int,
                  timeout: float = 10) -> dict[str, str]:
    """Each node's row in ``registry status --json``, once it shows ``version`` ACTIVE."""
    deadline = time.monotonic() + timeout
    while True:
        rows = {r["node"]: r for r in cli.json("status") if r["model"] == MODEL}
        view = {}
        for n in nodes:
            r = rows.get(node_id(n), {})
            view[node_id(n)] = (f"{r.get('state')} v{r.get('version')}"
                                f"{'' if r.get('connected') else ' (offline)'}"
                                f"{' lagging' if r.get('lagging') else ''}")
        if all(v.startswith(f"ACTIVE v{version}") for v in view.values()) or \
                time.monotonic() > deadline:
            return view
        time.sleep(0.5)


def propagate(kind: str, cli: Cli, registry: RegistryProcess, nodes: Sequence[TierProcess],
              version: int, release: Path) -> Propagation:
    before = {node_id(n): sync_bytes(n) for n in nodes}
    sent = metric(registry.metrics_url, "registry_sync_bytes_sent_total")
    console.log(f"{kind}: registry publish {release} --name {MODEL} (version {version})")
    pids = [registry.pid, *(n.pid for n in nodes)]
    busy = Busy.now(pids)
    issued = issue(cli, nodes, version, "publish", str(release), "--name", MODEL)
    others = Busy.now(pids).others_since(busy)
    commit = cli.committed("publish", version)
    to_commit = issued.returned_wall - commit  # seconds from the commit to the return
    sizes = cli.artifact_bytes(version)
    view = registry_view(cli, nodes, version)
    pushed = push_times(registry.log, version)
    rows = []
    for n in nodes:
        name = node_id(n)
        (received, reused), (received0, reused0) = sync_bytes(n), before[name]
        at, push = issued.serving.get(name), pushed.get(name)
        serving = None if at is None else at - issued.returned
        row = NodeRollout(name, n.tier, None if push is None else push - issued.returned_wall,
                          None if push is None else push - commit, serving,
                          None if serving is None else serving + to_commit,
                          received - received0, reused - reused0, sizes[n.tier], view[name])
        rows.append(row)
        console.log(f"{kind}: {name} serving v{version} {fmt_s(row.serving_commit_s)} s after "
                    f"the commit ({fmt_s(row.serving_s)} s after publish returned); pushed "
                    f"{fmt_s(row.push_commit_s, 3)} s after the commit; received "
                    f"{row.received / MIB:.2f} MiB")
    sent_now = metric(registry.metrics_url, "registry_sync_bytes_sent_total")
    return Propagation(kind, version, issued.seconds, to_commit, sent_now - sent, others, rows)


# --- part 2: fan-out -------------------------------------------------------------------------

async def wait_round(sims: Sequence[Sim], version: int) -> None:
    deadline = time.monotonic() + FANOUT_TIMEOUT_S
    while not all(s.finished(version) for s in sims) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)


@dataclass(frozen=True)
class Trigger:
    """What started a round: when (monotonic and wall clock), and how long its command ran."""

    what: str
    at: float
    wall: float
    command_s: float = 0.0


def summarize(name: str, trigger: Trigger, version: int, sims: Sequence[Sim],
              pushed: dict[str, float], artifact_bytes: int, registry_sent: float,
              other_cores: float) -> Round:
    start = trigger.wall  # the simulated nodes' times are wall-clock
    pushes = [at - trigger.wall for at in pushed.values()]
    done = [s for s in sims if version in s.verified]
    verified = [s.verified[version] - start for s in done]
    received = [s.received[version] - start for s in sims if version in s.received]
    sizes = [s.bytes[version] for s in done]
    errors = [s.error for s in sims if s.error] + \
        [f"{s.node_id}: not verified" for s in sims if s not in done and not s.error]
    return Round(name, trigger.what, version, len(sims), len(done), errors, trigger.command_s,
                 min(pushes, default=math.nan), max(pushes, default=math.nan),
                 max(received, default=math.nan), max(verified, default=math.nan),
                 percentile(verified, 50), percentile(verified, 99),
                 max(verified, default=math.nan), percentile(received, 50),
                 percentile(received, 99), min(sizes, default=0.0), max(sizes, default=0.0),
                 artifact_bytes, sum(sizes), registry_sent, other_cores)


async def run_command(cli: Cli, *args: str) -> tuple[float, float, str]:
    """(seconds it ran, monotonic return time, stdout) of ``registry ARGS``, off the loop."""
    started = time.monotonic()
    process = await asyncio.create_subprocess_exec(
        *cli.command(*args), env=cli.env(), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    returned = time.monotonic()
    if process.returncode != 0:
        raise RuntimeError(f"registry {' '.join(args)} exited {process.returncode}: "
                           f"{err.decode()[-2000:]}")
    return returned - started, returned, out.decode()


async def fanout(cli: Cli, registry: RegistryProcess, count: int, root: Path,
                 production: int) -> Fanout:
    size = cli.artifact_bytes(production)["edge"]
    sims = [make_sim(f"sim-{i}", registry.target, TOKEN, SIM_REGION, store=root / f"sim-{i}")
            for i in range(count)]
    tasks: list[asyncio.Task[None]] = []
    try:
        sent, busy = await sent_bytes(registry), Busy.now([registry.pid])
        start = Trigger(f"{count} subscribers connect (production v{production} pushed on "
                        f"hello)", time.monotonic(), time.time())
        tasks = [asyncio.create_task(subscribe(s)) for s in sims]
        await wait_round(sims, production)
        others = Busy.now([registry.pid]).others_since(busy)
        sent_now = await sent_bytes(registry)
        connect = summarize("connect", start, production, sims,
                            push_times(registry.log, production, "sim-"), size, sent_now - sent,
                            others)
        console.log(f"fan-out connect round: {connect.verified}/{count} verified v{production} "
                    f"{connect.all_verified_s:.2f} s after connecting began")
        connections = tcp_connections(registry.port)
        sessions = await asyncio.to_thread(metric, registry.metrics_url,
                                           "registry_sync_nodes_connected")
        for sim in sims:  # nothing local any more: the rollback must be downloaded again
            assert sim.downloader is not None
            shutil.rmtree(sim.downloader.folder, ignore_errors=True)
        sent, busy = sent_now, Busy.now([registry.pid])
        command_s, returned, out = await run_command(cli, "rollback", MODEL, "--json")
        trigger = Trigger(f"registry rollback {MODEL}", returned, time.time(), command_s)
        version = int(json.loads(out)["production"])
        await wait_round(sims, version)
        others = Busy.now([registry.pid]).others_since(busy)
        sent_now = await sent_bytes(registry)
        rollback = summarize("rollback", trigger, version, sims,
                             push_times(registry.log, version, "sim-"),
                             cli.artifact_bytes(version)["edge"], sent_now - sent, others)
        console.log(f"fan-out rollback round (v{production} -> v{version}): "
                    f"{rollback.verified}/{count} verified {rollback.all_verified_s:.2f} s "
                    f"after the command returned")
        return Fanout(count, connections, sessions, [connect, rollback])
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(s.channel.close() for s in sims), return_exceptions=True)


async def sent_bytes(registry: RegistryProcess) -> float:
    return await asyncio.to_thread(metric, registry.metrics_url,
                                   "registry_sync_bytes_sent_total")


def tcp_connections(port: int) -> int:
    """Established TCP connections whose remote end is ``port`` (the client ends)."""
    count = 0
    for table in (Path("/proc/net/tcp"), Path("/proc/net/tcp6")):
        with contextlib.suppress(OSError):
            for line in table.read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "01" and int(fields[2].rsplit(":", 1)[1], 16) == port:
                    count += 1
    return count


# --- part 3: p99 during a swap ---------------------------------------------------------------

def measure(plan: Plan, edge: TierProcess, name: str, pids: Sequence[int]) -> LoadRun:
    before, busy = successes_by_version(edge), Busy.now(pids)
    load = wrk(plan, edge.url, CONCURRENCY, plan.seconds)
    others = Busy.now(pids).others_since(busy)
    after = successes_by_version(edge)
    answered = {v: n - before.get(v, 0.0) for v, n in after.items()}
    return LoadRun(name, load, others, {v: n for v, n in answered.items() if n > 0})


def swap_run(plan: Plan, cli: Cli, edge: TierProcess, new: int,
             pids: Sequence[int]) -> tuple[LoadRun, float, Issued]:
    """wrk on the edge while ``registry promote`` rolls ``new`` out: (the run, when promote
    returned as seconds into the run, the promote)."""
    with ThreadPoolExecutor(1, thread_name_prefix="wrk") as pool:
        begun = time.monotonic()
        future = pool.submit(measure, plan, edge, "during swap", pids)
        time.sleep(SWAP_AFTER_S)
        if future.done():  # wrk failed at once
            future.result()
        issued = issue(cli, [edge], new, "promote", MODEL, interval=SWAP_POLL_S)
        run = future.result()
    return run, issued.returned - begun, issued


def swap(plan: Plan, cli: Cli, edge: TierProcess, registry: RegistryProcess,
         release: Path) -> Swap:
    console.log(f"swap: registry publish {release} --name {MODEL} --canary nobody")
    started = time.monotonic()
    created = json.loads(cli.run("publish", str(release), "--name", MODEL, "--canary", "nobody",
                                 "--json", timeout=PUBLISH_TIMEOUT_S))
    canary_s = time.monotonic() - started
    new = int(created["manifest"]["version"])
    time.sleep(1.0)  # well past the registry's 0.2 s watch: a push would have happened
    with httpx.Client(timeout=5) as http:
        old = served(http, edge.url)
    if old is None or old == new:
        raise RuntimeError(f"the edge serves {old} after a canary for nobody; expected the "
                           f"production version")
    pids = [edge.pid, registry.pid]
    wrk(plan, edge.url, CONCURRENCY, plan.warmup)
    steady = measure(plan, edge, "steady", pids)
    console.log(f"swap: steady p99 {steady.load.p99_ms:.2f} ms, {steady.load.rps:.1f} req/s")
    run, promote_at, issued = swap_run(plan, cli, edge, new, pids)
    at = issued.serving.get(node_id(edge))
    switched = None if at is None else at - issued.returned
    commit = cli.committed("promote", new)
    switched_commit = None if switched is None else \
        switched + issued.returned_wall - commit
    console.log(f"swap: promote returned {promote_at:.2f} s into the run; edge served v{new} "
                f"{fmt_s(switched)} s later ({fmt_s(switched_commit)} s after the commit); "
                f"p99 {run.load.p99_ms:.2f} ms")
    return Swap(canary_s, steady, run, promote_at, switched, switched_commit, old, new)
