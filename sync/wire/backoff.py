"""Exponential backoff with full jitter, for the subscriber's reconnects and retried installs."""

from __future__ import annotations

import random


class Backoff:
    """Exponential backoff with full jitter: a fleet that lost the registry does not come back
    in lockstep."""

    def __init__(self, maximum: float, base: float = 0.5) -> None:
        self.maximum, self.base, self.failures = maximum, base, 0

    def next(self) -> float:
        delay = random.uniform(0, min(self.maximum, self.base * 2 ** self.failures))
        self.failures += 1
        return delay

    def reset(self) -> None:
        self.failures = 0
