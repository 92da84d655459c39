"""Real ``center``/``edge`` processes for the tests: quick store polling, a minimal env."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from harness.processes import BIN, RegistryProcess, TierProcess, start_registry, start_tier

Server = TierProcess
# For the RSS bounds: glibc makes up to 8 malloc arenas per core and the model runtimes size
# their thread pools by the core count, so the same bound would mean something else on another
# machine. The memory tests pin both (as a deployment sized for its machine would).
PINNED_ALLOCATOR = {"MALLOC_ARENA_MAX": "8"}
PINNED_THREADS = ("--threads", "2")


def start(tier: str, store: Path, log_dir: Path, *args: str, timeout: float = 60,
          env: dict[str, str] | None = None, registry_secret: str | None = None,
          ca: Path | None = None) -> Server:
    """``env``: variables added to the minimal one (PATH only); ``registry_secret``: the
    registry's, from which the node's own token is derived."""
    return start_tier(tier, store, log_dir, "--poll-interval-s", "0.2", *args, timeout=timeout,
                      env={"PATH": str(BIN), **(env or {})}, registry_secret=registry_secret,
                      ca=ca)


@contextmanager
def subscribed_pair(home: Path, folder: Path, token: str, *sync_flags: str,
                    env: dict[str, str], tier_env: dict[str, str] | None = None,
                    ) -> Iterator[tuple[RegistryProcess, Server, Server]]:
    """``registry serve`` on ``home`` (with ``env``), and a center and an edge (escalating to
    it, no response cache; with ``tier_env``) subscribed to it with empty stores under
    ``folder``; all stopped on exit."""
    registry = start_registry(home, folder, token, env=env)
    servers: list[Server] = []
    try:
        flags = ("--registry", registry.target, *sync_flags)
        servers.append(start("center", folder / "center", folder, *flags, env=tier_env,
                             registry_secret=token))
        servers.append(start("edge", folder / "edge", folder, *flags, "--center-url",
                             servers[0].url, "--cache-size", "0", env=tier_env,
                             registry_secret=token))
        yield registry, servers[0], servers[1]
    finally:
        for server in servers:
            server.stop()
        registry.stop()


def log_lines(server: Server, request_id: str, timeout: float = 10) -> list[dict[str, Any]]:
    """The JSON log lines of ``request_id``, once its access line (written after the answer
    went out) is there."""
    deadline = time.monotonic() + timeout
    while True:
        lines = [json.loads(line) for line in server.log.read_text().splitlines()
                 if line.startswith("{")]
        mine = [line for line in lines if line.get("request_id") == request_id]
        if any(line["logger"] == "serving.access" for line in mine) or \
                time.monotonic() > deadline:
            return mine
        time.sleep(0.05)
