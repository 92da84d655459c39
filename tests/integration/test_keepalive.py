"""Keepalive over real gRPC on loopback: the registry's sync server (``SyncServer``, as
``registry serve`` runs it, in this process) and a node's ``Subscriber`` share one keepalive
policy, so an idle Sync stream stays open however many pings it carries; a node that pings
more often than the registry permits is cut with a GOAWAY (too_many_pings), and counts it.

Periods are shortened to seconds; gRPC's client sends a ping without data at most once a
second whatever its keepalive time, so 1 s is the shortest period that means what it says.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from pydantic import SecretStr

from registry.server.metrics import SyncMetrics
from registry.server.rpc import SyncServer
from registry.settings import RegistrySettings
from serving.config.settings import ServingSettings
from serving.config.tokens import node_token
from serving.protocol.keepalive import Keepalive
from serving.release.manifest import Manifest
from serving.release.store import ModelStore
from serving.runtime.repository import Repository, Runtime, VersionLoader
from serving.telemetry.metrics import Metrics
from sync.node.subscriber import Subscriber

pytestmark = [pytest.mark.integration, pytest.mark.slow]
SECRET = "keepalive-secret-0123456789"
NODE = "edge-1"
PERIOD_MS = 1_000  # the node's pings, in both tests


@dataclass
class Seen:
    """What a run showed: the registry's and the node's series, and the node's log."""

    connections: float  # Sync streams the registry opened
    disconnections: float
    cuts: dict[str, float]  # the node's counted cuts, by reason
    open_at_end: bool  # the node's stream was open when the run ended


def nothing(manifest: Manifest, folder: Path) -> Runtime:
    raise AssertionError("the store is empty: nothing is loaded")


def node(root: Path, target: str, keepalive: Keepalive) -> tuple[Subscriber, CollectorRegistry]:
    """An edge with an empty store, subscribed to ``target`` with ``keepalive``."""
    token = node_token(SECRET, NODE, "edge", "local")
    settings = ServingSettings(node_id=NODE, region="local", registry=target,
                               registry_token=SecretStr(token), sync_backoff_max_s=0.5)
    metrics = Metrics("edge")
    loading = VersionLoader(ModelStore(root / "store"), "edge", nothing, settings, metrics)
    subscriber = Subscriber(settings, Repository(loading), metrics.quality, metrics.registry,
                            "edge", lambda: target, keepalive=keepalive)
    return subscriber, metrics.registry


async def until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.05)


def run(root: Path, registry_policy: Keepalive, node_policy: Keepalive, hold_s: float,
        done: Callable[[Seen], bool] = lambda seen: False) -> Seen:
    """Connect one node and hold its stream for ``hold_s`` (or until ``done``)."""
    metrics = SyncMetrics()
    settings = RegistrySettings(home=root / "registry", token=SecretStr(SECRET), grpc_port=0,
                                metrics_port=None, report_interval_s=3600)

    async def main() -> Seen:
        server = SyncServer(settings, metrics, registry_policy)
        port = await server.start()
        subscriber, series = node(root, f"127.0.0.1:{port}", node_policy)

        def seen() -> Seen:
            sample = metrics.registry.get_sample_value
            return Seen(sample("registry_sync_connections_total") or 0.0,
                        sample("registry_sync_disconnections_total") or 0.0,
                        {reason: series.get_sample_value("edge_sync_stream_cuts_total",
                                                         {"reason": reason}) or 0.0
                         for reason in ("too_many_pings", "unavailable")},
                        series.get_sample_value("edge_sync_connected") == 1.0)

        task = asyncio.create_task(subscriber.run())
        try:
            await until(lambda: seen().open_at_end, 15, "the node's stream")
            deadline = time.monotonic() + hold_s
            while time.monotonic() < deadline and not done(seen()):
                await asyncio.sleep(0.1)
            return seen()
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await subscriber.close()
            await server.stop(grace=0)

    return asyncio.run(main())


def test_an_idle_sync_stream_stays_open_through_many_keepalive_pings(tmp_path: Path) -> None:
    """Six periods without a message either way: gRPC's default server policy (a ping every
    5 minutes) would cut this stream at its fourth ping, about 3 s in."""
    policy = Keepalive(period_ms=PERIOD_MS)
    seen = run(tmp_path, policy, policy, hold_s=6 * PERIOD_MS / 1000)
    assert seen == Seen(connections=1, disconnections=0,
                        cuts={"too_many_pings": 0, "unavailable": 0}, open_at_end=True)


def test_a_node_pinging_more_often_than_the_registry_permits_is_cut_and_counts_it(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The registry permits a ping every 4 s, the node sends one a second: the third early
    ping is one strike too many, the registry sends a GOAWAY (too_many_pings), the node
    counts it, says why, and reconnects."""
    caplog.set_level(logging.WARNING, logger="sync.node.subscriber")
    registry, eager = Keepalive(period_ms=8 * PERIOD_MS), Keepalive(period_ms=PERIOD_MS)
    assert registry.permitted_ms > eager.period_ms
    seen = run(tmp_path, registry, eager, hold_s=15,
               done=lambda seen: seen.cuts["too_many_pings"] >= 1 and seen.connections >= 2)
    assert seen.cuts == {"too_many_pings": 1, "unavailable": 0}
    assert seen.connections == 2 and seen.disconnections == 1
    assert any("cut the Sync stream: Too many pings" in r.getMessage() and
               "keepalive policies differ" in r.getMessage() for r in caplog.records)
