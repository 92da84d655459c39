"""Real ``center``/``edge`` processes for the tests: quick store polling, a minimal env."""

from __future__ import annotations

from pathlib import Path

from tiered.processes import BIN, TierProcess, start_tier

Server = TierProcess


def start(tier: str, store: Path, log_dir: Path, *args: str, timeout: float = 60) -> Server:
    return start_tier(tier, store, log_dir, "--poll-interval-s", "0.2", *args, timeout=timeout,
                      env={"PATH": str(BIN)})
