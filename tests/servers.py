"""Real ``center``/``edge`` processes for the tests: quick store polling, a minimal env."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tiered.processes import BIN, RegistryProcess, TierProcess, start_registry, start_tier

Server = TierProcess


def start(tier: str, store: Path, log_dir: Path, *args: str, timeout: float = 60) -> Server:
    return start_tier(tier, store, log_dir, "--poll-interval-s", "0.2", *args, timeout=timeout,
                      env={"PATH": str(BIN)})


@contextmanager
def subscribed_pair(home: Path, folder: Path, token: str, *sync_flags: str,
                    env: dict[str, str]) -> Iterator[tuple[RegistryProcess, Server, Server]]:
    """``registry serve`` on ``home``, and a center and an edge (escalating to it, no response
    cache) subscribed to it with empty stores under ``folder``; all stopped on exit."""
    registry = start_registry(home, folder, token, env=env)
    servers: list[Server] = []
    try:
        flags = ("--registry", registry.target, *sync_flags)
        servers.append(start("center", folder / "center", folder, *flags))
        servers.append(start("edge", folder / "edge", folder, *flags, "--center-url",
                             servers[0].url, "--cache-size", "0"))
        yield registry, servers[0], servers[1]
    finally:
        for server in servers:
            server.stop()
        registry.stop()
