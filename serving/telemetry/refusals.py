"""A warning line and a count for each request a guard refused or that was slow, whether the
access log is on or not: an operator sees which requests burned a node's CPU, not only the
proxy's 503s. Lines are throttled (a flood of refusals must not become a flood of log
writes); the count is not, and each line says how many were left out before it."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from serving.telemetry.metrics import Metrics

log = logging.getLogger(__name__)
LINES_PER_S = 10  # warning lines a second, at most; beyond it only counted


class RefusalLog:
    def __init__(self, metrics: Metrics, slow_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.metrics, self.slow_s, self.clock = metrics, slow_s, clock
        self._second, self._lines, self._suppressed = 0, 0, 0

    def refused(self, model: str, reason: str, message: str, wall_s: float,
                cpu_s: float) -> None:
        self.metrics.request_refused.labels(model, reason).inc()
        self._line(f"request refused ({reason}): {message}", model, reason, wall_s, cpu_s)

    def answered(self, model: str, wall_s: float, cpu_s: float) -> None:
        """A request answered: a line when it took longer than ``slow_s``."""
        if wall_s > self.slow_s:
            self.metrics.request_slow.labels(model).inc()
            self._line(f"slow request: {wall_s:.2f} s", model, "slow", wall_s, cpu_s)

    def _line(self, message: str, model: str, reason: str, wall_s: float, cpu_s: float) -> None:
        second = int(self.clock())
        if second != self._second:
            self._second, self._lines = second, 0
        self._lines += 1
        if self._lines > LINES_PER_S:
            self._suppressed += 1
            return
        fields = {"model": model, "reason": reason, "wall_ms": round(wall_s * 1000, 1),
                  "cpu_ms": round(cpu_s * 1000, 1)}
        if self._suppressed:
            fields["suppressed"] = self._suppressed
            self._suppressed = 0
        log.warning(message, extra={"fields": fields})
