"""A small circuit breaker per center instance.

Written here rather than taken from pybreaker: that library is built around synchronous calls,
and what is needed is three states and a clock (about thirty lines).
"""

from __future__ import annotations

import time
from collections.abc import Callable


class CircuitBreaker:
    """closed -> (``failures`` in a row) -> open -> (``reset_s`` later) -> half-open: one probe;
    its success closes the circuit, its failure opens it again."""

    def __init__(self, failures: int, reset_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.failures_to_open, self.reset_s, self.clock = failures, reset_s, clock
        self.failures = 0
        self.open_until = 0.0
        self.probing = False

    @property
    def state(self) -> str:
        if self.failures < self.failures_to_open:
            return "closed"
        return "half-open" if self.clock() >= self.open_until else "open"

    def allow(self) -> bool:
        state = self.state
        if state == "closed":
            return True
        if state == "half-open" and not self.probing:
            self.probing = True
            return True
        return False

    def success(self) -> None:
        self.failures, self.probing = 0, False

    def failure(self, cooldown: float | None = None) -> None:
        """Count a failure; ``cooldown`` (a center's Retry-After) opens the circuit at once."""
        self.probing = False
        self.failures = self.failures_to_open if cooldown else self.failures + 1
        if self.failures >= self.failures_to_open:
            self.open_until = self.clock() + (cooldown or self.reset_s)
