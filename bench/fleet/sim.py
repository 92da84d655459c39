"""Simulated subscribers: a node's side of the Sync stream without a model behind it, for the
benchmarks that need many (``bench.fleet``, the rollout's fan-out).

Each simulated node has its own gRPC channel (its own TCP connection, the client options a real
node uses), its own node token, and says what a real edge or center says: a hello, acks for
every Release (its manifest's sha256 checked; DOWNLOADING first when it fetches the artifacts,
then ACTIVE with the directive seq it acted on and a fidelity on its platform), and, when it
serves traffic, a quality report every interval the registry's Welcome names. The model run is
skipped: a node that does not fetch acks from a shared cache, which the report says.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import grpc
from prometheus_client import CollectorRegistry

from serving import tasks
from serving.config.tokens import node_token
from serving.release import hardware
from serving.release.manifest import Artifact, decode
from serving.release.store import InstalledReleases
from serving.telemetry.quality import QualityWindow
from sync.gen import sync_pb2 as pb
from sync.gen import sync_pb2_grpc as pb_grpc
from sync.node.converge import directive_seq
from sync.node.download import Downloader
from sync.node.reports import report_message
from sync.node.subscriber import client_options
from sync.node.transfer import DownloadMetrics
from sync.wire import auth
from sync.wire.backoff import Backoff

OPTIONS = [*client_options(), ("grpc.use_local_subchannel_pool", 1)]
"""A real node's channel options; the local pool keeps one connection per simulated node."""
RUNTIME = "simulated (no model run)"
BACKOFF_MAX_S = 30.0  # a node's default (``sync_backoff_max_s``)
PREFIX = "sim"  # of the download metrics
PROBE_ROWS = 64  # the fidelity acks claim this many probe rows


@functools.cache
def platform() -> pb.Platform:
    p = hardware.here(RUNTIME)
    return pb.Platform(cpu=p.cpu, machine=p.machine, features=p.features, runtime=p.runtime)


@functools.cache
def _window(model: str, version: int, window_s: float, capacity: float | None,
            seed: int) -> dict[str, Any]:
    """A real quality window's report: a center's, idle but for its capacity; or an edge's,
    fed a sample of requests (its shape: latencies, confidence and length buckets). Made once
    per shape and process, then only its counts vary: drawing it per report cost the
    simulated nodes more than the registry spent on them."""
    quality = QualityWindow()
    if capacity is not None:
        quality.add_source(lambda m, v: {"capacity_rows_s": capacity}, idle=True)
        (drained,) = quality.drain([(model, version)])
        return drained | {"window_s": window_s}
    rng = random.Random(seed)
    for _ in range(200):
        quality.request(model, version, rng.uniform(0.004, 0.03))
        quality.rows(model, version, [rng.randint(8, 96)], ["edge"])
        quality.confidence(model, version, [rng.uniform(0.5, 1.0)])
    (drained,) = quality.drain()
    return drained | {"window_s": window_s, "threshold": 0.8, "budget_rows_s": 2.0}


@dataclass
class Traffic:
    """What a serving node reports each interval: a quality window's report of
    ``rows_per_s`` rows (``None``: idle, nothing to report, as a real idle edge), and a
    center's capacity."""

    rows_per_s: float | None = None
    capacity_rows_s: float | None = None

    def report(self, model: str, version: int, window_s: float, fidelity: float,
               rng: random.Random) -> pb.QualityReport | None:
        if self.capacity_rows_s is None and self.rows_per_s is None:
            return None
        report = dict(_window(model, version, window_s, self.capacity_rows_s, 0))
        if self.rows_per_s is not None:
            requests = max(1, int(self.rows_per_s * window_s * rng.uniform(0.95, 1.05)))
            report |= {"requests": requests, "rows": requests}
        message = report_message(report)
        message.fidelity = fidelity
        return message


@dataclass
class Sim:
    """One simulated node; times are wall-clock (``time.time()``)."""

    node_id: str
    tier: Literal["edge", "center"]
    region: str
    secret: str  # the registry's token secret: the node's own token is derived from it
    channel: grpc.aio.Channel
    downloader: Downloader | None = None  # None: acks from the shared cache, fetches nothing
    metrics: CollectorRegistry | None = None
    fetch_from: int = 1  # the first version it fetches (earlier ones: from the cache)
    fetch_delay_s: float = 0.0  # the wave's pace: wait this long before fetching
    interrupt: bool = False  # its first fetch of each artifact breaks in its first chunk
    cut: int = 0  # bytes its broken fetches left in partial files (then resumed)
    traffic: Traffic = field(default_factory=Traffic)
    fidelity: float = 1.0
    welcomed: float | None = None
    interval_s: float = 10.0
    received: dict[int, float] = field(default_factory=dict)  # version -> its Release arrived
    fetching: dict[int, float] = field(default_factory=dict)  # version -> fetch began
    verified: dict[int, float] = field(default_factory=dict)  # version -> acked ACTIVE
    bytes: dict[int, float] = field(default_factory=dict)  # version -> artifact bytes fetched
    active: dict[str, int] = field(default_factory=dict)  # model -> version it serves
    reports: int = 0
    budgets: int = 0
    connected: bool = False  # a stream is open now (welcomed)
    failures: int = 0  # streams that failed
    last_error: str | None = None
    error: str | None = None  # the failure it stopped at (without reconnect)

    def held(self) -> list[pb.Held]:
        """What its hello says it holds: what it serves (reconnecting, as a real node)."""
        return [pb.Held(model=m, versions=[v], active=v) for m, v in sorted(self.active.items())]

    def resumed(self) -> int:
        """Fetches that resumed a partial file at its offset."""
        if self.metrics is None:
            return 0
        return int(self.metrics.get_sample_value(f"{PREFIX}_sync_fetch_resumed_total") or 0)

    def bytes_received(self) -> float:
        if self.metrics is None:
            return 0.0
        return self.metrics.get_sample_value(f"{PREFIX}_sync_bytes_received_total") or 0.0

    def finished(self, version: int) -> bool:
        return version in self.verified or self.error is not None


def make_sim(node_id: str, target: str, secret: str, region: str, *,
             tier: Literal["edge", "center"] = "edge",
             store: Path | None = None, **kwargs: Any) -> Sim:
    """A node with its own channel; with ``store`` it fetches artifacts into it for real."""
    channel = auth.channel(target, None, OPTIONS)
    sim = Sim(node_id, tier, region, secret, channel, **kwargs)
    if store is not None:
        model_store = InstalledReleases(store)
        model_store.root.mkdir(parents=True, exist_ok=True)
        sim.metrics = CollectorRegistry()
        stub = pb_grpc.SyncStub(channel)
        sim.downloader = Downloader(lambda: stub, _metadata(sim), model_store,
                                    DownloadMetrics(PREFIX, sim.metrics))
    return sim


def _metadata(sim: Sim) -> list[tuple[str, str]]:
    return auth.metadata(node_token(sim.secret, sim.node_id, sim.tier, sim.region))


async def subscribe(sim: Sim, seed: int = 0, reconnect: bool = False) -> None:
    """Hello, Welcome, then until cancelled: apply every Release, send reports every
    interval. A failed stream is recorded (``failures``, ``last_error``); with ``reconnect``
    it is opened again after an exponential, jittered backoff as a real node does
    (``sync.wire.backoff``, at most ``BACKOFF_MAX_S``), else it ends there (``error``: the
    caller's round does not wait for it)."""
    backoff = Backoff(BACKOFF_MAX_S)
    rng = random.Random(seed)
    while True:
        try:
            await _session(sim, rng, backoff)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            sim.failures += 1
            sim.last_error = f"{sim.node_id}: {type(exc).__name__}: {_said(exc)}"
            if not reconnect:
                sim.error = sim.last_error
                return
        finally:
            sim.connected = False
        await asyncio.sleep(backoff.next())


def _said(exc: Exception) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name} {exc.details()}"
    return str(exc)


async def _session(sim: Sim, rng: random.Random, backoff: Backoff) -> None:
    call = pb_grpc.SyncStub(sim.channel).Sync(metadata=_metadata(sim))
    reporter: asyncio.Task[None] | None = None
    lock = asyncio.Lock()

    async def send(message: pb.NodeMessage) -> None:
        async with lock:
            await call.write(message)

    try:
        await call.write(pb.NodeMessage(hello=pb.Hello(node_id=sim.node_id, tier=sim.tier,
                                                       region=sim.region, platform=platform(),
                                                       held=sim.held())))
        welcome = await call.read()
        if welcome is grpc.aio.EOF:
            raise RuntimeError("the registry closed the stream before its welcome")
        sim.welcomed = time.time()
        sim.connected = True
        backoff.reset()
        sim.interval_s = welcome.welcome.report_interval_s or 10.0
        reporter = asyncio.create_task(_report(sim, send, rng))
        while (message := await call.read()) is not grpc.aio.EOF:
            kind = message.WhichOneof("kind")
            if kind == "release":
                await apply(sim, send, message.release)
            elif kind == "budget":
                sim.budgets += 1
        raise RuntimeError("the registry ended the stream")
    finally:
        await tasks.stop(reporter)
        call.cancel()


async def _report(sim: Sim, send: Any, rng: random.Random) -> None:
    """Like ``sync.node.reports.send_reports``: every interval, a report per served version that
    saw traffic (an idle edge sends none); the first at a random point of the interval, as
    nodes that connected at different times would."""
    await asyncio.sleep(rng.uniform(0, sim.interval_s))
    while True:
        for model, version in list(sim.active.items()):
            message = sim.traffic.report(model, version, sim.interval_s, sim.fidelity, rng)
            if message is not None:
                await send(pb.NodeMessage(report=message))
                sim.reports += 1
        await asyncio.sleep(sim.interval_s)


async def apply(sim: Sim, send: Any, release: pb.Release) -> None:
    """What a node does with a Release, the model run skipped: check the manifest's sha256,
    fetch the tier's artifacts (DOWNLOADING first) or take them from the shared cache, ack
    ACTIVE with the directive seq and a fidelity."""
    sim.received.setdefault(release.version, time.time())
    if hashlib.sha256(release.manifest).hexdigest() != release.manifest_sha256:
        raise RuntimeError(f"release v{release.version}: manifest sha256 mismatch")
    seq = directive_seq(release.directive) if release.directive else 0
    if sim.downloader is not None and release.version >= sim.fetch_from:
        manifest = decode(release.manifest)  # what to fetch (the others skip it: their cost
        # would delay the next Release's arrival in this process, not the registry)
        await send(pb.NodeMessage(ack=pb.Ack(model=release.model, version=release.version,
                                             state=pb.DOWNLOADING, directive_seq=seq)))
        await asyncio.sleep(sim.fetch_delay_s)
        sim.fetching[release.version] = time.time()
        before = sim.bytes_received()
        for artifact in manifest.artifacts(sim.tier):
            if sim.interrupt:
                await cut_short(sim, sim.downloader, artifact)
            await sim.downloader.get(artifact)
        sim.bytes[release.version] = sim.bytes_received() - before
    sim.active[release.model] = release.version
    await send(pb.NodeMessage(ack=pb.Ack(
        model=release.model, version=release.version, state=pb.ACTIVE, directive_seq=seq,
        fidelity=sim.fidelity, fidelity_rows=PROBE_ROWS, platform=platform())))
    sim.verified[release.version] = time.time()


async def cut_short(sim: Sim, downloader: Downloader, artifact: Artifact) -> None:
    """Begin ``artifact``'s Fetch and drop the call in its first chunk, as a lost connection
    would: half of what the chunk held stays in the partial file (the registry's chunks are
    1 MiB and most artifacts of a small release fit one), from whose offset
    ``Downloader.get`` resumes."""
    downloader.folder.mkdir(parents=True, exist_ok=True)
    part = downloader.folder / f"{artifact.sha256}.part"
    call = downloader.stub().Fetch(pb.FetchRequest(sha256=artifact.sha256, offset=0),
                                   metadata=downloader.metadata)
    try:
        async for chunk in call:
            kept = chunk.data[:len(chunk.data) // 2]
            if chunk.offset == 0 and kept:
                part.write_bytes(kept)
                sim.cut += len(kept)
            break
    finally:
        call.cancel()
