"""Fixtures the tests and benchmarks share: a release published to a throwaway registry and
pulled into a center's and an edge's stores, and the two tiers serving them."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from harness.processes import BIN, TierProcess, start_tier

PUBLISH_TIMEOUT_S = 600


def _registry(home: Path, *args: str | Path) -> None:
    subprocess.run([str(BIN / "registry"), *map(str, args)], check=True, capture_output=True,
                   env={"PATH": str(BIN), "REGISTRY_HOME": str(home), "HOME": str(home),
                        "REGISTRY_ACTOR": "bench@fuzz"}, timeout=300)


def fill_stores(root: Path, release: Path, model: str = "tiny", *flags: str | Path) -> None:
    """Publish ``release`` (with ``registry publish``'s ``flags``) to a registry under ``root``
    and pull it into both tiers' stores."""
    home = root / "registry"
    _registry(home, "publish", release, "--name", model, "--create", *flags)
    for tier in ("center", "edge"):
        _registry(home, "pull", model, "--tier", tier, "--store", root / tier)


def publish(home: Path, release: Path, model: str, actor: str = "bench@reliability") -> None:
    """``registry publish`` of ``release`` as ``model`` into the registry at ``home``."""
    subprocess.run([str(BIN / "registry"), "--home", str(home), "publish", str(release),
                    "--name", model, "--create"], check=True, capture_output=True,
                   timeout=PUBLISH_TIMEOUT_S,
                   env={"PATH": str(BIN), "REGISTRY_ACTOR": actor, "HOME": str(home)})


@contextmanager
def tiers(root: Path, env: dict[str, str] | None = None) -> Iterator[tuple[TierProcess,
                                                                            TierProcess]]:
    """A center and an edge escalating to it, serving the stores under ``root``."""
    center = start_tier("center", root / "center", root, env=env)
    try:
        edge = start_tier("edge", root / "edge", root, "--center-url", center.url, env=env)
        try:
            yield center, edge
        finally:
            edge.stop()
    finally:
        center.stop()
