"""A 40-second soak: steady load on an edge that escalates to a center, both subscribed to a
registry (quality reports flow all along). Memory and file descriptors stay flat, nothing
fails, latency does not creep. ``bench/soak.py`` runs the same for ten minutes with wrk.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from harness.processes import RegistryProcess
from tests.conftest import RegistryCli
from tests.integration.test_sync import BODY, REGISTRY_ENV, SYNC_FLAGS, TOKEN, metric
from tests.load import Load, p99
from tests.servers import PINNED_ALLOCATOR, PINNED_THREADS, Server, subscribed_pair

pytestmark = [pytest.mark.integration, pytest.mark.slow]
SOAK_S = 40
WARMUP_S = 10  # pools, caches and the first batches settle; growth is measured from here
WINDOW_S = 15
RSS_WINDOW_S = 5  # RSS: the median of 5 s of samples, not one caught mid-batch
FDS_SLACK = 5  # sockets of in-flight escalations and reports come and go
# the calibrated gate decides for BODY; "threshold": 1 escalates every row to the center
ESCALATING = json.dumps({**json.loads(BODY), "parameters": {"threshold": 1}})


@dataclass
class Trio:
    registry: RegistryProcess
    center: Server
    edge: Server


@pytest.fixture
def trio(tmp_path: Path, tiny_release: Path) -> Iterator[Trio]:
    cli = RegistryCli(tmp_path / "registry")
    cli("publish", tiny_release, "--name", "tiny")
    with subscribed_pair(cli.home, tmp_path, TOKEN, *SYNC_FLAGS, *PINNED_THREADS,
                         env={**REGISTRY_ENV, **PINNED_ALLOCATOR},
                         tier_env=PINNED_ALLOCATOR) as fleet:
        yield Trio(*fleet)


def sampled(pids: dict[str, int], stop: threading.Event,
            into: list[tuple[float, str, int, int]]) -> None:
    """Every second: (time, name, RSS, open fds) of each process, until ``stop``."""
    while not stop.wait(1.0):
        for name, pid in pids.items():
            process = psutil.Process(pid)
            into.append((time.monotonic(), name, process.memory_info().rss, process.num_fds()))


def test_a_soak_keeps_memory_fds_and_latency_flat(trio: Trio) -> None:
    pids = {"edge": trio.edge.pid, "center": trio.center.pid, "registry": trio.registry.pid}
    samples: list[tuple[float, str, int, int]] = []
    stop = threading.Event()
    sampler = threading.Thread(target=sampled, args=(pids, stop, samples), daemon=True)
    load = Load([f"{trio.edge.url}/v2/models/tiny/infer"], [BODY, ESCALATING], threads=2)
    started = time.monotonic()
    load.start()
    sampler.start()
    try:
        time.sleep(SOAK_S)
    finally:
        load.stop()
        stop.set()
        sampler.join()
    assert load.failed() == []
    escalated = metric(f"{trio.edge.url}/metrics", "edge_rows_total", tier="center")
    assert escalated >= len(load.answers) // 2  # the center took part all along
    for name in pids:
        mine = [(t - started, rss, fds) for t, n, rss, fds in samples if n == name]
        since = next(s[0] for s in mine if s[0] >= WARMUP_S)
        warm = [s for s in mine if since <= s[0] < since + RSS_WINDOW_S]
        end = [s for s in mine if s[0] > mine[-1][0] - RSS_WINDOW_S]
        warm_rss = statistics.median(s[1] for s in warm)
        end_rss = statistics.median(s[1] for s in end)
        print(f"{name}: after {warm[0][0]:.0f} s {warm_rss / 2**20:.1f} MiB {warm[0][2]} fds, "
              f"after {end[-1][0]:.0f} s {end_rss / 2**20:.1f} MiB {end[-1][2]} fds")
        assert end[-1][2] <= warm[0][2] + FDS_SLACK, (name, warm, end)  # no descriptor leak
        assert end_rss < warm_rss * 1.10, (name, warm, end)  # no memory leak
    first = [a for a in load.answers if a.at - started < WINDOW_S]
    last = [a for a in load.answers if a.at - started >= SOAK_S - WINDOW_S]
    print(f"{len(load.answers)} requests, {escalated:.0f} rows escalated; p99 first "
          f"{WINDOW_S} s {p99(first) * 1000:.1f} ms, last {WINDOW_S} s {p99(last) * 1000:.1f} ms")
    # generous: the machine is shared; a creeping latency (a queue or a list growing per
    # request) would show as a steady rise well past 3x over 40 s
    assert p99(last) <= 3 * p99(first)
