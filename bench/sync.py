"""Model-sync benchmark: rollout latency, bytes on the wire, fan-out, and edge p99 during a swap.

Run from the repository root (about 3.5 minutes by default, under 2 with ``--quick``)::

    .venv/bin/python bench/sync.py [--subscribers N] [--duration SECONDS] [--quick] [--json PATH]

Everything runs on 127.0.0.1 against a fresh registry home in a temporary directory (never
``var/registry``): one ``registry serve`` (token auth, ``start_registry``), one ``center`` and
one ``edge`` started with EMPTY stores and ``--registry``, and the demo release
``var/demo/release`` published as ``sentiment`` with the ``registry`` command, like an operator
would. Each ``publish`` builds a version in ~17 s (validate, ONNX export, INT8 quantize,
calibrate); all times below start when the registry command *returns*, so they measure sync,
not the build. The execution order is 1, 3, 2 (part 2 needs the real nodes stopped); the
tables are printed in part order.

1. **Propagation.** *Cold*: ``registry publish`` (version 1) while both nodes are subscribed
   with nothing in their stores. A thread polls ``GET /v2/models/sentiment/ready`` on both
   nodes every 20 ms (from before the publish starts) and records when each first serves the
   new version; ``registry status --json`` then shows what the registry recorded (the node's
   ACTIVE ack). *Warm*: publish the same release again (version 2, identical artifacts): each
   node copies the bytes it already holds, so the time is load + warm + swap. Per node: bytes
   received (``{tier}_sync_bytes_received_total``) and reused (``{tier}_sync_bytes_reused_total``)
   from its /metrics against the size of its tier's artifacts (``registry show sentiment@N
   --json``: model + tokenizer), the registry's ``registry_sync_bytes_sent_total``, and the
   **push latency**: the ``ts`` of the registry log's ``pushing sentiment version N ... to
   NODE`` line minus the wall-clock moment the publish command returned (goal < 1 s; the
   registry notices other processes' commits by polling ``PRAGMA data_version`` every 0.2 s;
   log times have millisecond resolution, so a push logged before the CLI process finished
   exiting reads negative).
2. **Fan-out** to ``--subscribers`` simulated edges, in this process (asyncio, grpc.aio), each
   with its own channel (``grpc.use_local_subchannel_pool``, so its own TCP connection; the
   count of established connections to the registry port is reported) and its own temporary
   store. Each says Hello (``sim-i``, tier edge, region bench, holding nothing), reads the
   Welcome, and for every pushed Release checks the manifest's sha256, decodes it, downloads
   ``manifest.artifacts("edge")`` with ``sync.download.Downloader`` (sha256-verified, into
   ``<store>/.downloads/``) and acks ACTIVE: the simulated node's "ACTIVE". How it is
   triggered: production is version 3 when the subscribers connect, so the registry pushes it
   to each at once (the *connect* round, reported for information: a fleet coming up). When
   all hold it, their downloads are deleted and ``registry rollback sentiment`` (3 -> 2, an
   instant command; same edge artifact, which no simulated store holds any more) makes the
   registry push version 2 to all of them: the *rollback* round, timed from the command's
   return to (a) every subscriber having the Release and (b) every download verified, with
   per-subscriber p50/p99/max, bytes per subscriber vs the artifact size, and aggregate MiB/s.
   Goal (reported, not asserted): all N verified within 10 s. The stores are deleted after.
3. **Edge p99 during a swap vs steady state.** Before this part ``registry publish --canary
   nobody`` makes version 3 a canary that targets no node (production stays 2), and the center
   is stopped: on a small machine its 86 MiB TorchScript reload would compete with the edge
   for the cores, which says nothing about the edge's own swap (the bodies carry
   ``threshold: 0``, so the edge never escalates). wrk (``bench/v2_infer.lua``, one thread,
   concurrency 8, ``--duration`` seconds, 200 real review texts rotated, edge cache off) runs
   once steady, then again while, 1 s in, ``registry promote sentiment`` rolls version 3 out:
   the edge copies its local bytes into a new version folder, loads, warms and swaps under
   load. Reported: requests, req/s, p50, p99, non-2xx/socket errors (must be 0), the p99
   ratio, when the edge switched (polled every 50 ms), and the requests each version answered
   during the run (the edge's ``edge_request_success_total`` by version) to show that the swap
   landed inside the window.

Every process is started on a free loopback port and stopped by PID in a ``finally`` (also on
Ctrl-C); logs, stores and bodies live in the temporary directory. wrk is installed with
apt-get when missing (see ``bench/tiers.py``).
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, bench/ is sys.path[0] and this file would shadow the ``sync`` package.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import asyncio
import contextlib
import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from typing import Any

import grpc
import httpx
from prometheus_client import CollectorRegistry
from rich.table import Table

from bench.tiers import (
    Cpu,
    Load,
    Plan,
    console,
    cpu_model,
    ensure_wrk,
    review_texts,
    write_bodies,
    wrk,
)
from serving.manifest import decode
from serving.store import ModelStore
from sync import auth
from sync.download import Downloader, DownloadMetrics
from sync.gen import sync_pb2 as pb
from sync.gen import sync_pb2_grpc as pb_grpc
from tiered.processes import BIN, RegistryProcess, TierProcess, free_port, start_registry

ROOT = Path(__file__).resolve().parent.parent
RELEASE = ROOT / "var" / "demo" / "release"
MODEL = "sentiment"
TOKEN = "bench-sync-token-0123456789"
SYNC_FLAGS = ("--registry-token", TOKEN, "--sync-backoff-max-s", "1")
EDGE_FLAGS = ("--cache-size", "0")
NODES = ("center", "edge")
POLL_S = 0.02  # propagation: /ready polling interval
SWAP_POLL_S = 0.05  # during wrk: lighter polling
SWAP_AFTER_S = 1.0  # promote this long into the swap run
CONCURRENCY = 8
TEXTS = 200
PUBLISH_TIMEOUT_S = 600.0
PROPAGATION_TIMEOUT_S = 180.0
FANOUT_TIMEOUT_S = 180.0
GOAL_PUSH_S = 1.0
GOAL_FANOUT_S = 10.0
MIB = 1024 * 1024
SIM_OPTIONS = [("grpc.keepalive_time_ms", 10_000), ("grpc.keepalive_timeout_ms", 5_000),
               ("grpc.use_local_subchannel_pool", 1)]  # one connection per subscriber
PUSHING = re.compile(r"pushing (\S+) version (\d+) \((\w+)\) to (\S+)")
SAMPLE = re.compile(r"^(\w+)(?:\{(.*)\})?\s+(\S+)$")


# --- results ---------------------------------------------------------------------------------

@dataclass
class NodeRollout:
    """One node during one rollout; times in seconds after the registry command returned."""

    node: str
    tier: str
    serving_s: float | None
    push_s: float | None
    received: float
    reused: float
    artifact_bytes: int
    status: str


@dataclass
class Propagation:
    kind: str
    version: int
    publish_s: float
    registry_sent: float
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
    run_s: float  # wall-clock length of the swap run
    old: int
    new: int

    @property
    def inside(self) -> bool:
        return self.switched_s is not None and \
            self.promote_at_s + self.switched_s < self.run_s and \
            self.swap.by_version.get(str(self.old), 0) > 0 and \
            self.swap.by_version.get(str(self.new), 0) > 0


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

    def artifact_bytes(self, version: int) -> dict[str, int]:
        """Per tier, the bytes a node of that tier needs: its model and the tokenizer."""
        manifest = self.json("show", f"{MODEL}@{version}")["manifest"]
        tokenizer = int(manifest["tokenizer"]["size"]) if manifest.get("tokenizer") else 0
        return {tier: int(manifest[tier]["size"]) + tokenizer for tier in NODES}


def start_node(tier: str, store: Path, logs: Path, *flags: str,
               timeout: float = 60) -> TierProcess:
    """``start_tier``'s command line, but wait only for /v2/health/live: an empty store is not
    ready until sync has installed a model."""
    port = free_port()
    log = logs / f"{tier}-{port}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(BIN / tier), "--host", "127.0.0.1", "--port", str(port), "--store", str(store),
             "--node-id", f"{tier}-{port}", *flags],
            stdout=out, stderr=subprocess.STDOUT,
            env={"PATH": str(BIN), "HOME": str(logs)})
    node = TierProcess(tier, port, process, log)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"{tier} exited {process.returncode}: "
                                   f"{log.read_text()[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{node.url}/v2/health/live", timeout=1).status_code == 200:
                    return node
            time.sleep(0.1)
        raise RuntimeError(f"{tier} not live after {timeout}s: {log.read_text()[-2000:]}")
    except BaseException:
        node.stop()
        raise


def node_id(node: TierProcess) -> str:
    return f"{node.tier}-{node.port}"


def served(http: httpx.Client, url: str) -> int | None:
    """The version ``url`` serves by default (None: none yet, or no answer)."""
    try:
        response = http.get(f"{url}/v2/models/{MODEL}/ready")
    except httpx.HTTPError:
        return None
    return int(response.json()["version"]) if response.status_code == 200 else None


def samples(url: str) -> list[tuple[str, str, float]]:
    """(name, labels, value) of every sample a /metrics page shows."""
    found = []
    for line in httpx.get(url, timeout=10).text.splitlines():
        if (match := SAMPLE.match(line)) is not None:
            found.append((match[1], match[2] or "", float(match[3])))
    return found


def metric(url: str, name: str) -> float:
    return sum(value for n, _, value in samples(url) if n == name)


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


def push_times(log: Path, version: int) -> dict[str, float]:
    """Per node, the wall-clock time (epoch s) of the registry's first push of ``version``."""
    pushed: dict[str, float] = {}
    for line in log.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        match = PUSHING.match(str(entry.get("msg", ""))) if isinstance(entry, dict) else None
        if match and match[1] == MODEL and int(match[2]) == version:
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
    output: str
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
            output = cli.run(*args, timeout=PUBLISH_TIMEOUT_S)
            returned, wall = time.monotonic(), time.time()
            with contextlib.suppress(FutureTimeout):
                future.result(timeout=PROPAGATION_TIMEOUT_S)
        finally:
            stop.set()
        serving = future.result()
    return Issued(returned - started, returned, wall, output, serving)


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
    issued = issue(cli, nodes, version, "publish", str(release), "--name", MODEL)
    sizes = cli.artifact_bytes(version)
    view = registry_view(cli, nodes, version)
    pushed = push_times(registry.log, version)
    rows = []
    for n in nodes:
        name = node_id(n)
        (received, reused), (received0, reused0) = sync_bytes(n), before[name]
        at = issued.serving.get(name)
        push = pushed.get(name)
        rows.append(NodeRollout(name, n.tier, None if at is None else at - issued.returned,
                                None if push is None else push - issued.returned_wall,
                                received - received0, reused - reused0, sizes[n.tier],
                                view[name]))
        console.log(f"{kind}: {name} serving v{version} "
                    f"{fmt_s(rows[-1].serving_s)} s after publish returned; push "
                    f"{fmt_s(rows[-1].push_s)} s; received {rows[-1].received / MIB:.2f} MiB")
    sent_now = metric(registry.metrics_url, "registry_sync_bytes_sent_total")
    return Propagation(kind, version, issued.seconds, sent_now - sent, rows)


# --- part 2: fan-out -------------------------------------------------------------------------

@dataclass
class Sim:
    """One simulated edge: its own channel and store; what happened to each version."""

    index: int
    store: ModelStore
    metrics: CollectorRegistry
    channel: grpc.aio.Channel
    downloader: Downloader
    received: dict[int, float] = field(default_factory=dict)
    verified: dict[int, float] = field(default_factory=dict)
    bytes: dict[int, float] = field(default_factory=dict)
    error: str | None = None

    @property
    def node_id(self) -> str:
        return f"sim-{self.index}"

    def bytes_received(self) -> float:
        return self.metrics.get_sample_value("sim_sync_bytes_received_total") or 0.0

    def finished(self, version: int) -> bool:
        return version in self.verified or self.error is not None


def make_sim(index: int, root: Path, target: str) -> Sim:
    store = ModelStore(root / f"sim-{index}")
    store.root.mkdir(parents=True)
    channel = auth.channel(target, None, SIM_OPTIONS)
    metrics = CollectorRegistry()
    downloader = Downloader(pb_grpc.SyncStub(channel), auth.metadata(TOKEN), store,
                            DownloadMetrics("sim", metrics))
    return Sim(index, store, metrics, channel, downloader)


async def subscribe(sim: Sim) -> None:
    """Hello, Welcome, then for every Release: download the edge artifacts, ack ACTIVE."""
    call = pb_grpc.SyncStub(sim.channel).Sync(metadata=auth.metadata(TOKEN))
    try:
        await call.write(pb.NodeMessage(hello=pb.Hello(node_id=sim.node_id, tier="edge",
                                                       region="bench")))
        if await call.read() is grpc.aio.EOF:
            raise RuntimeError("the registry closed the stream before its welcome")
        while (message := await call.read()) is not grpc.aio.EOF:
            if message.WhichOneof("kind") == "release":
                await apply(sim, call, message.release)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # recorded and reported; the round does not wait for it
        sim.error = f"{sim.node_id}: {type(exc).__name__}: {exc}"
    finally:
        call.cancel()


async def apply(sim: Sim, call: grpc.aio.StreamStreamCall, release: pb.Release) -> None:
    sim.received[release.version] = time.monotonic()
    if hashlib.sha256(release.manifest).hexdigest() != release.manifest_sha256:
        raise RuntimeError(f"release v{release.version}: manifest sha256 mismatch")
    manifest = decode(release.manifest)
    before = sim.bytes_received()
    for artifact in manifest.artifacts("edge"):
        await sim.downloader.get(artifact)
    sim.verified[release.version] = time.monotonic()
    sim.bytes[release.version] = sim.bytes_received() - before
    await call.write(pb.NodeMessage(ack=pb.Ack(model=release.model, version=release.version,
                                               state=pb.ACTIVE)))


async def wait_round(sims: Sequence[Sim], version: int) -> None:
    deadline = time.monotonic() + FANOUT_TIMEOUT_S
    while not all(s.finished(version) for s in sims) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)


def summarize(name: str, trigger: str, version: int, sims: Sequence[Sim], start: float,
              command_s: float, artifact_bytes: int, registry_sent: float) -> Round:
    done = [s for s in sims if version in s.verified]
    verified = [s.verified[version] - start for s in done]
    received = [s.received[version] - start for s in sims if version in s.received]
    sizes = [s.bytes[version] for s in done]
    errors = [s.error for s in sims if s.error] + \
        [f"{s.node_id}: not verified" for s in sims if s not in done and not s.error]
    return Round(name, trigger, version, len(sims), len(done), errors, command_s,
                 max(received, default=math.nan), max(verified, default=math.nan),
                 percentile(verified, 50), percentile(verified, 99),
                 max(verified, default=math.nan), percentile(received, 50),
                 percentile(received, 99), min(sizes, default=0.0), max(sizes, default=0.0),
                 artifact_bytes, sum(sizes), registry_sent)


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
    sizes = cli.artifact_bytes(production)
    sent = await asyncio.to_thread(metric, registry.metrics_url,
                                   "registry_sync_bytes_sent_total")
    sims = [make_sim(i, root, registry.target) for i in range(count)]
    tasks: list[asyncio.Task[None]] = []
    try:
        start = time.monotonic()
        tasks = [asyncio.create_task(subscribe(s)) for s in sims]
        await wait_round(sims, production)
        sent_now = await asyncio.to_thread(metric, registry.metrics_url,
                                           "registry_sync_bytes_sent_total")
        connect = summarize("connect", f"{count} subscribers connect (production "
                            f"v{production} pushed on hello)", production, sims, start, 0.0,
                            sizes["edge"], sent_now - sent)
        console.log(f"fan-out connect round: {connect.verified}/{count} verified v{production} "
                    f"{connect.all_verified_s:.2f} s after connecting began")
        connections = tcp_connections(registry.port)
        sessions = await asyncio.to_thread(metric, registry.metrics_url,
                                           "registry_sync_nodes_connected")
        for sim in sims:  # nothing local any more: the rollback must be downloaded again
            shutil.rmtree(sim.store.root / ".downloads", ignore_errors=True)
        sent = sent_now
        command_s, returned, out = await run_command(cli, "rollback", MODEL, "--json")
        version = int(json.loads(out)["production"])
        await wait_round(sims, version)
        sent_now = await asyncio.to_thread(metric, registry.metrics_url,
                                           "registry_sync_bytes_sent_total")
        rollback = summarize("rollback", f"registry rollback {MODEL} (v{production} -> "
                             f"v{version})", version, sims, returned, command_s,
                             cli.artifact_bytes(version)["edge"], sent_now - sent)
        console.log(f"fan-out rollback round: {rollback.verified}/{count} verified v{version} "
                    f"{rollback.all_verified_s:.2f} s after the command returned")
        return Fanout(count, connections, sessions, [connect, rollback])
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(s.channel.close() for s in sims), return_exceptions=True)


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

def measure(plan: Plan, edge: TierProcess, name: str) -> LoadRun:
    before, cpu = successes_by_version(edge), Cpu.now(edge.pid)
    load = wrk(plan, edge.url, CONCURRENCY, plan.seconds)
    usage = Cpu.now(edge.pid).cores_since(cpu, load.seconds)
    after = successes_by_version(edge)
    return LoadRun(name, load, usage.other_cores,
                   {v: after[v] - before.get(v, 0.0) for v in after if after[v] > before.get(v, 0)})


def swap_run(plan: Plan, cli: Cli, edge: TierProcess, new: int) -> tuple[LoadRun, float,
                                                                          float | None, float]:
    """wrk on the edge while ``registry promote`` rolls ``new`` out: (run, promote return s
    into the run, s from promote return to the edge serving ``new``, run length s)."""
    with ThreadPoolExecutor(1, thread_name_prefix="wrk") as pool:
        begun = time.monotonic()
        future = pool.submit(measure, plan, edge, "during swap")
        time.sleep(SWAP_AFTER_S)
        if future.done():  # wrk failed at once
            future.result()
        issued = issue(cli, [edge], new, "promote", MODEL, interval=SWAP_POLL_S)
        run = future.result()
        ended = time.monotonic()
    at = issued.serving.get(node_id(edge))
    return (run, issued.returned - begun, None if at is None else at - issued.returned,
            ended - begun)


def swap(plan: Plan, cli: Cli, edge: TierProcess, release: Path, warmup: int) -> Swap:
    console.log(f"swap: registry publish {release} --name {MODEL} --canary nobody")
    started = time.monotonic()
    created = json.loads(cli.run("publish", str(release), "--name", MODEL, "--canary", "nobody",
                                 "--json", timeout=PUBLISH_TIMEOUT_S))
    canary_s = time.monotonic() - started
    new = int(created["manifest"]["version"])
    with httpx.Client(timeout=5) as http:
        old = served(http, edge.url)
    if old is None or old == new:
        raise RuntimeError(f"the edge serves {old} after a canary for nobody; expected the "
                           f"production version")
    wrk(plan, edge.url, CONCURRENCY, warmup)
    steady = measure(plan, edge, "steady")
    console.log(f"swap: steady p99 {steady.load.p99_ms:.2f} ms, {steady.load.rps:.1f} req/s")
    run, promote_at, switched, length = swap_run(plan, cli, edge, new)
    console.log(f"swap: promote returned {promote_at:.2f} s into the run; edge served v{new} "
                f"{fmt_s(switched)} s later; p99 {run.load.p99_ms:.2f} ms")
    return Swap(canary_s, steady, run, promote_at, switched, length, old, new)


# --- report ----------------------------------------------------------------------------------

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


def mib(value: float) -> str:
    return f"{value / MIB:.2f}"


def verdict(ok: bool) -> str:
    return "[green]met[/]" if ok else "[red]missed[/]"


def git_commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True,
                              text=True).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    return commit + (" (+ local changes)" if git("status", "--porcelain",
                                                 "--untracked-files=no") else "")


def machine_info(args: argparse.Namespace, wrk_path: str) -> dict[str, str]:
    wrk_version = subprocess.run([wrk_path, "--version"], capture_output=True,
                                 text=True).stdout
    return {"date": datetime.now().astimezone().isoformat(timespec="seconds"),
            "cpu": cpu_model(),
            "cores": f"{os.cpu_count()} logical, {len(os.sched_getaffinity(0))} usable",
            "git commit": git_commit(),
            "python / grpcio": f"{sys.version.split()[0]} / {metadata.version('grpcio')}",
            "wrk": (wrk_version.split("Copyright")[0] or "?").strip(),
            "run": f"{args.subscribers} simulated subscribers, wrk {args.duration} s per run "
                   f"at concurrency {CONCURRENCY}{', --quick' if args.quick else ''}",
            "load average": " ".join(Path("/proc/loadavg").read_text().split()[:3])}


def machine_table(info: dict[str, str]) -> Table:
    table = Table(title="Machine", show_header=False)
    for key, value in info.items():
        table.add_row(key, value)
    return table


def propagation_table(rollouts: Sequence[Propagation]) -> Table:
    table = Table(title="1. Propagation: registry publish -> node serving (times from the "
                        "publish command's return)")
    columns = ("rollout", "node", "publish s", "push s (log)", "-> serving s", "received MiB",
               "reused MiB", "artifacts MiB", "received/size", "registry status")
    for column in columns:
        table.add_column(column, justify="left" if column in ("rollout", "node",
                                                               "registry status") else "right")
    for p in rollouts:
        for n in p.nodes:
            table.add_row(f"{p.kind} v{p.version}", n.node, fmt_s(p.publish_s, 1),
                          fmt_s(n.push_s, 3), fmt_s(n.serving_s), mib(n.received),
                          mib(n.reused), mib(n.artifact_bytes),
                          f"{n.received / n.artifact_bytes:.3f}", n.status)
    sent = ", ".join(f"{p.kind} {mib(p.registry_sent)} MiB" for p in rollouts)
    table.caption = f"registry_sync_bytes_sent_total: {sent}"
    return table


def fanout_table(f: Fanout) -> Table:
    table = Table(title=f"2. Fan-out to {f.subscribers} simulated edges (own channel and store "
                        f"each; times from the trigger)")
    columns = ("round", "verified", "all received s", "all verified s", "verified p50/p99/max s",
               "received p50/p99 s", "MiB/subscriber (min-max)", "artifact MiB", "total MiB",
               "MiB/s", "registry sent MiB")
    for column in columns:
        table.add_column(column, justify="left" if column == "round" else "right")
    for r in f.rounds:
        table.add_row(r.name, f"{r.verified}/{r.subscribers}", fmt_s(r.all_received_s),
                      fmt_s(r.all_verified_s),
                      f"{fmt_s(r.verified_p50_s)} / {fmt_s(r.verified_p99_s)} / "
                      f"{fmt_s(r.verified_max_s)}",
                      f"{fmt_s(r.received_p50_s)} / {fmt_s(r.received_p99_s)}",
                      f"{mib(r.bytes_min)}-{mib(r.bytes_max)}", mib(r.artifact_bytes),
                      f"{r.total_bytes / MIB:.1f}", f"{r.mib_per_s:.1f}",
                      f"{r.registry_sent / MIB:.1f}")
    triggers = "; ".join(f"{r.name}: {r.trigger}" + (f", command ran {r.command_s:.2f} s"
                                                      if r.command_s else "")
                         for r in f.rounds)
    table.caption = (f"{triggers}. Established TCP connections to the registry: "
                     f"{f.connections}; registry_sync_nodes_connected: {f.sessions:.0f}")
    return table


def swap_table(s: Swap) -> Table:
    table = Table(title=f"3. Edge under wrk (c={CONCURRENCY}): steady vs swap to v{s.new} by "
                        f"registry promote")
    for column in ("run", "requests", "req/s", "p50 ms", "p99 ms", "mean ms", "errors",
                   "answered by version", "others' cores"):
        table.add_column(column, justify="left" if column == "run" else "right")
    for r in (s.steady, s.swap):
        versions = ", ".join(f"v{v}: {n:.0f}" for v, n in sorted(r.by_version.items()))
        table.add_row(r.name, str(r.load.requests), f"{r.load.rps:.1f}", f"{r.load.p50_ms:.2f}",
                      f"{r.load.p99_ms:.2f}", f"{r.load.mean_ms:.2f}", str(r.load.errors),
                      versions, f"{r.other_cores:.2f}")
    ratio = s.swap.load.p99_ms / s.steady.load.p99_ms if s.steady.load.p99_ms else math.nan
    p50 = s.swap.load.p50_ms / s.steady.load.p50_ms if s.steady.load.p50_ms else math.nan
    table.add_row("swap / steady", "", f"{s.swap.load.rps / s.steady.load.rps:.2f}x",
                  f"{p50:.2f}x", f"{ratio:.2f}x", "", "", "", "")
    table.caption = (f"setup: publish v{s.new} --canary nobody took {s.canary_publish_s:.1f} s; "
                     f"promote returned {s.promote_at_s:.2f} s into the {s.run_s:.1f} s run; "
                     f"the edge served v{s.new} {fmt_s(s.switched_s)} s later (copy local bytes, "
                     f"install, load, warm, swap); swap inside the window: "
                     f"{'yes' if s.inside else 'NO'}")
    return table


def goals(rollouts: Sequence[Propagation], f: Fanout, s: Swap) -> list[tuple[str, bool]]:
    pushes = [n.push_s for p in rollouts for n in p.nodes]
    cold, warm = rollouts
    measured = f.rounds[-1]
    worst = max((x for x in pushes if x is not None), default=math.nan)
    return [
        (f"push latency < {GOAL_PUSH_S:.0f} s after publish returned (worst {fmt_s(worst, 3)} s)",
         None not in pushes and worst < GOAL_PUSH_S),
        ("every node serving after each publish (cold: "
         + ", ".join(f"{n.node} {fmt_s(n.serving_s)} s" for n in cold.nodes) + "; warm: "
         + ", ".join(f"{n.node} {fmt_s(n.serving_s)} s" for n in warm.nodes) + ")",
         all(n.serving_s is not None for p in rollouts for n in p.nodes)),
        ("cold: each node received its tier's artifacts once (received/size 1.00-1.01)",
         all(1.0 <= n.received / n.artifact_bytes <= 1.01 for n in cold.nodes)),
        ("warm: nothing downloaded, all reused from the local store",
         all(n.received == 0 and n.reused >= n.artifact_bytes for n in warm.nodes)),
        (f"fan-out: all {f.subscribers} verified within {GOAL_FANOUT_S:.0f} s of the rollback "
         f"({fmt_s(measured.all_verified_s)} s)",
         measured.verified == f.subscribers and measured.all_verified_s <= GOAL_FANOUT_S),
        (f"swap: 0 failed requests (steady {s.steady.load.errors}, swap {s.swap.load.errors}) "
         f"and the edge switched v{s.old} -> v{s.new} inside the wrk window",
         s.steady.load.errors == 0 and s.swap.load.errors == 0 and s.inside),
    ]


def report(info: dict[str, str], rollouts: Sequence[Propagation], f: Fanout, s: Swap) -> None:
    console.print(machine_table(info))
    console.print(propagation_table(rollouts))
    console.print(fanout_table(f))
    for error in f.rounds[-1].errors[:5]:
        console.print(f"[red]{error}[/]")
    console.print(swap_table(s))
    console.print("[bold]Summary[/]")
    ratio = s.swap.load.p99_ms / s.steady.load.p99_ms if s.steady.load.p99_ms else math.nan
    for text, ok in goals(rollouts, f, s):
        console.print(f"  {verdict(ok)}  {text}")
    console.print(f"  [cyan]info[/]  edge p99 {s.steady.load.p99_ms:.2f} ms steady vs "
                  f"{s.swap.load.p99_ms:.2f} ms during the swap ({ratio:.2f}x)")


def write_json(path: Path, info: dict[str, str], rollouts: Sequence[Propagation], f: Fanout,
               s: Swap) -> None:
    data = {"machine": info, "propagation": [asdict(p) for p in rollouts],
            "fanout": {**asdict(f), "rounds": [{**asdict(r), "mib_per_s": r.mib_per_s}
                                               for r in f.rounds]},
            "swap": {**asdict(s), "inside_window": s.inside},
            "goals": [{"goal": text, "met": ok} for text, ok in goals(rollouts, f, s)]}
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")


# --- main ------------------------------------------------------------------------------------

@contextlib.contextmanager
def stopping(processes: list[TierProcess | RegistryProcess]) -> Iterator[None]:
    """Stop (by PID) every process appended to ``processes``, last started first."""
    try:
        yield
    finally:
        for process in reversed(processes):
            process.stop()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--subscribers", type=int, default=None,
                        help="simulated subscribers in the fan-out (default 50; 20 with --quick)")
    parser.add_argument("--duration", type=int, default=10,
                        help="seconds per measured wrk run (default 10; at most 5 with --quick)")
    parser.add_argument("--quick", action="store_true",
                        help="fewer subscribers, shorter wrk runs (under 2 minutes)")
    parser.add_argument("--release", type=Path, default=RELEASE,
                        help="release folder to publish (default var/demo/release)")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH",
                        help="also write the results as JSON to PATH")
    args = parser.parse_args(argv)
    if args.subscribers is None:
        args.subscribers = 20 if args.quick else 50
    if args.quick:
        args.duration = min(args.duration, 5)
    if args.subscribers < 1 or args.duration < 3:
        parser.error("--subscribers must be >= 1 and --duration >= 3 seconds")
    if not (args.release / "tiered.json").is_file():
        parser.error(f"{args.release} is not a release folder (no tiered.json)")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    wrk_path = ensure_wrk()
    info = machine_info(args, wrk_path)
    texts = review_texts(TEXTS)
    processes: list[TierProcess | RegistryProcess] = []
    with tempfile.TemporaryDirectory(prefix="bench-sync-") as tmp, stopping(processes):
        work = Path(tmp)
        cli = Cli(work / "registry")
        registry = start_registry(cli.home, work, TOKEN)
        processes.append(registry)
        flags = ("--registry", registry.target, *SYNC_FLAGS)
        center = start_node("center", work / "center", work, *flags)
        processes.append(center)
        edge = start_node("edge", work / "edge", work, *flags, *EDGE_FLAGS, "--center-url",
                          center.url)
        processes.append(edge)
        rollouts = [propagate(kind, cli, registry, [center, edge], version, args.release)
                    for version, kind in ((1, "cold"), (2, "warm"))]
        center.stop()  # part 3 measures the edge's own swap (see the docstring)
        plan = Plan(wrk_path, work, write_bodies(texts, work / "bodies.jsonl"), args.duration,
                    1 if args.quick else 2, 0)
        swapped = swap(plan, cli, edge, args.release, plan.warmup)
        edge.stop()  # part 2: only the simulated subscribers talk to the registry
        sims = work / "sims"
        try:
            fanned = asyncio.run(fanout(cli, registry, args.subscribers, sims, swapped.new))
        finally:
            shutil.rmtree(sims, ignore_errors=True)
    report(info, rollouts, fanned, swapped)
    if args.json is not None:
        write_json(args.json, info, rollouts, fanned, swapped)
        console.print(f"results written to {args.json}")


if __name__ == "__main__":
    main()
