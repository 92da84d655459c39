"""A small synced fleet for the reliability benchmarks: ``registry serve``, one center and one
edge on 127.0.0.1, both subscribed with ``--registry``, in a temporary REGISTRY_HOME (never
``var/registry``).

Two releases are published as versions 1 and 2: the demo release (``var/demo/release``)
twice, or, when it has not been built, two tiny releases (``examples/sentiment/tiny.py``, two
seeds: every artifact but the tokenizer differs; built in ~15 s).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from harness.processes import RegistryProcess, TierProcess, start_registry, start_tier
from harness.stores import publish
from registry.releases.catalog import Catalog
from registry.store.db import connect

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "var" / "demo" / "release"
MODEL = "sentiment"
TOKEN = "bench-reliability-token-0123456789"
SYNC_FLAGS = ("--sync-backoff-max-s", "1")


def releases(work: Path, demo: Path = DEMO) -> tuple[Path, Path, str]:
    """The two release folders to publish, and what they are (for the report)."""
    if (demo / "tiered.json").is_file():
        shown = demo.relative_to(ROOT) if demo.is_relative_to(ROOT) else demo
        return demo, demo, f"demo release {shown} (published twice)"
    from examples.sentiment.tiny import build_tiny_release

    return (build_tiny_release(work / "tiny-a" / "release"),
            build_tiny_release(work / "tiny-b" / "release", seed=1),
            "tiny releases (var/demo/release not built): 2-layer center, 1-layer edge")


@dataclass
class Fleet:
    home: Path
    registry: RegistryProcess
    center: TierProcess
    edge: TierProcess
    processes: list[TierProcess | RegistryProcess] = field(default_factory=list)

    @property
    def nodes(self) -> tuple[TierProcess, TierProcess]:
        return self.center, self.edge

    def infer_url(self, node: TierProcess) -> str:
        return f"{node.url}/v2/models/{MODEL}/infer"

    def republish(self, version: int) -> int:
        """Commit a new production version with ``version``'s artifacts: what ``registry
        publish`` commits, without the minutes of export and calibration. Every node then
        copies the bytes it holds into a new version folder, loads and warms a fresh model
        copy, swaps, and drops the oldest copy it keeps resident."""
        catalog = Catalog(connect(self.home / "registry.sqlite3"), "bench@reliability")
        try:
            return catalog.create_version(catalog.resolve(MODEL, str(version)).manifest)
        finally:
            catalog.db.conn.close()


def served(node: TierProcess) -> int | None:
    """The version a node serves by default (None: none, or no answer)."""
    try:
        response = httpx.get(f"{node.url}/v2/models/{MODEL}/ready", timeout=5)
    except httpx.HTTPError:
        return None
    return int(response.json()["version"]) if response.status_code == 200 else None


def wait_serving(nodes: tuple[TierProcess, ...], version: int, timeout: float = 300,
                 interval: float = 0.02) -> dict[str, float]:
    """Poll until every node serves ``version``; the seconds each took, by tier."""
    started, took = time.monotonic(), dict[str, float]()
    while len(took) < len(nodes):
        for node in nodes:
            if node.tier not in took and served(node) == version:
                took[node.tier] = time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise RuntimeError(f"not every node serves {MODEL} version {version} after "
                               f"{timeout:.0f} s (got {[served(n) for n in nodes]})")
        time.sleep(interval)
    return took


@contextlib.contextmanager
def fleet(work: Path, first: Path, second: Path, *edge_flags: str) -> Iterator[Fleet]:
    """Publish ``first`` (v1) and ``second`` (v2), start the fleet from empty stores, wait
    until both nodes serve version 2; stop every process by PID on the way out."""
    home = work / "registry"
    publish(home, first, MODEL)
    publish(home, second, MODEL)
    processes: list[TierProcess | RegistryProcess] = []
    try:
        registry = start_registry(home, work, TOKEN)
        processes.append(registry)
        flags = ("--registry", registry.target, *SYNC_FLAGS)
        center = start_tier("center", work / "center", work, *flags, until="live",
                            registry_secret=TOKEN)
        processes.append(center)
        edge = start_tier("edge", work / "edge", work, *flags, "--center-url", center.url,
                          "--cache-size", "0", *edge_flags, until="live",
                          registry_secret=TOKEN)
        processes.append(edge)
        wait_serving((center, edge), 2)
        yield Fleet(home, registry, center, edge, processes)
    finally:
        for process in reversed(processes):
            with contextlib.suppress(Exception):  # keep stopping the others
                process.stop()
