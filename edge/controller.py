"""The cascade controller: each edge holds its escalations to the budget the registry gives it.

The registry splits the centers' capacity (rows/s) over the edges by their traffic
(``registry.fleet.budgets``) and pushes each edge its share. The edge turns that budget into a
threshold on its own, per request, with two parts (docs/cascade.md):

- **Feed-forward threshold.** The share of rows it may escalate is ``target x budget /
  arrival rate``. The threshold is that quantile of the confidences of its last ``window`` rows:
  escalating "confidence below it" then escalates that share of rows like the recent ones. By
  the DKW inequality the empirical quantile's escalation share is within
  ``sqrt(ln(2/0.05) / (2 x window))`` of the aim with 95% probability (3 points at 2,000 rows)
  while traffic keeps its shape; under drift it follows within a window. The threshold is
  clamped to ``[floor, 1]``: the floor is the lowest calibrated threshold whose cascade accuracy
  stays within ``floor_tolerance`` of center-only (the accuracy it will not trade away); 1 is
  center-only, reached when spare capacity allows.
- **Token bucket.** Escalations take tokens refilled at the budget's rate (a burst of
  ``burst_s`` seconds' worth), least confident rows first. Rows below the floor are the ones
  the accuracy promise needs at the center: those beyond the tokens are answered by the edge and
  marked ``edge-shed``. Rows between the floor and the threshold only spend spare capacity: they
  escalate while the bucket holds more than its reserve (``RESERVE``, kept for the next
  requests' rows below the floor) and are otherwise answered by the edge as any confident row,
  never shed. So a center with spare capacity never causes a shed row, however large a request
  (up to the burst's worth of rows below the floor), the center never sees more than its budget
  (every escalation takes a token), and nothing queues at the center.

A request's ``parameters.threshold`` replaces the threshold for that request but not the
bucket: every row below it is needed (the client asked for it) and takes tokens like the rows
below the floor, the rest ``edge-shed``, so no client escalates beyond the budget.
The edge's ``threshold`` setting (or ``controller`` off) bypasses both (the precedence is
``edge.threshold``'s).
Without a budget (no registry, no center capacity known yet, or the model's policy is
``static``) the threshold is the release's calibrated one and nothing is shed.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable

import numpy as np

from serving.protocol.budget import Budget
from serving.release.manifest import Calibration

Clock = Callable[[], float]
RECOMPUTE_S = 0.1  # the quantile is re-taken at most this often
MIN_ROWS = 50  # rows seen before the quantile is trusted; until then the calibrated threshold
RESERVE = 0.5
"""Share of the bucket that rows above the floor leave to the rows below it: a request whose
spare-capacity rows drain the bucket would otherwise shed the needed rows of the next one."""


def floor_threshold(calibration: Calibration, tolerance: float) -> float:
    """The lowest calibrated threshold from which the cascade's accuracy stays within
    ``tolerance`` of center-only on the calibration curve; the calibrated threshold itself when
    the release has no curve (or nothing lower qualifies)."""
    center = calibration.center_accuracy
    if center is None or not calibration.curve:
        return calibration.threshold
    points = sorted(calibration.curve, key=lambda p: p.threshold)
    floor = calibration.threshold
    for point in reversed(points):  # from center-only down, while every point qualifies
        if point.cascade_accuracy < center - tolerance - 1e-12:
            break
        floor = min(floor, point.threshold)
    return floor


def quantile_threshold(confidences: np.ndarray, share: float) -> float:
    """A threshold that escalates ``share`` of ``confidences`` (escalate if below it)."""
    if share >= 1 or not len(confidences):
        return 1.0 if share >= 1 else 0.0
    if share <= 0:
        return 0.0
    ordered = np.sort(confidences)
    k = int(share * len(ordered))
    return float(ordered[k]) if k < len(ordered) else 1.0


class TokenBucket:
    """Escalations held to a budget: tokens refill at its rate up to ``burst_s`` seconds'
    worth; without a budget every row may go. Thread-safe."""

    def __init__(self, burst_s: float, clock: Clock = time.monotonic) -> None:
        self.burst_s, self.clock = burst_s, clock
        self._lock = threading.Lock()
        self.budget = Budget(False)
        self._tokens = 0.0
        self._refilled = clock()

    def set_budget(self, budget: Budget) -> None:
        with self._lock:
            self._refill()
            first = not self.budget.controlled
            self.budget = budget
            # a first budget starts with a full bucket; a changed one keeps what is left
            self._tokens = self._burst() if first else min(self._tokens, self._burst())

    def _burst(self) -> float:
        return max(self.budget.rows_per_s * self.burst_s, 1.0)

    def _refill(self) -> None:
        now = self.clock()
        if self.budget.controlled:
            self._tokens = min(self._burst(),
                               self._tokens + (now - self._refilled) * self.budget.rows_per_s)
        self._refilled = now

    def admit(self, needed: int, spare: int = 0) -> tuple[int, int]:
        """How many of ``needed`` rows, then of ``spare`` rows, may go now (taken): needed
        rows from every token, spare ones only from the tokens above the reserve; all of them
        without a budget."""
        with self._lock:
            if not self.budget.controlled:
                return needed, spare
            self._refill()
            first = min(needed, int(self._tokens))
            self._tokens -= first
            above = int(self._tokens - math.floor(RESERVE * self._burst()))
            second = min(spare, max(above, 0))
            self._tokens -= second
            return first, second

    def take(self, rows: int) -> bool:
        """Take ``rows`` tokens if they are all there (never part of them, never waits)."""
        with self._lock:
            if not self.budget.controlled:
                return True
            self._refill()
            if self._tokens < rows:
                return False
            self._tokens -= rows
            return True


class Controller:
    """One model's threshold and escalation bucket on this edge. Thread-safe: requests and the
    sync stream both touch it."""

    def __init__(self, calibration: Calibration, *, floor_tolerance: float, window: int,
                 horizon_s: float, target: float, burst_s: float,
                 clock: Clock = time.monotonic) -> None:
        self.clock = clock
        self.window, self.horizon_s, self.target = window, horizon_s, target
        self.bucket = TokenBucket(burst_s, clock)
        self._lock = threading.Lock()
        self._confidences: deque[float] = deque(maxlen=window)
        self._arrivals: deque[tuple[float, int]] = deque()  # (time, rows) within the horizon
        self._arrived = 0
        self._started = clock()
        self._threshold: float | None = None
        self._computed = -math.inf
        self.release(calibration, floor_tolerance)

    def release(self, calibration: Calibration, floor_tolerance: float) -> None:
        """A new version is served: its calibration sets the default threshold and the floor
        (the traffic seen so far still says what the confidences look like)."""
        with self._lock:
            self.calibrated = calibration.threshold
            self.floor = floor_threshold(calibration, floor_tolerance)
            self._computed = -math.inf

    def set_budget(self, budget: Budget) -> None:
        self.bucket.set_budget(budget)
        with self._lock:
            self._computed = -math.inf

    @property
    def budget(self) -> Budget:
        return self.bucket.budget

    @property
    def controlled(self) -> bool:
        return self.bucket.budget.controlled

    def _rate(self, now: float) -> float:
        """Rows per second reaching the gate, over the last ``horizon_s`` (at least 1 s); under
        the lock."""
        while self._arrivals and self._arrivals[0][0] < now - self.horizon_s:
            self._arrived -= self._arrivals.popleft()[1]
        span = min(self.horizon_s, max(now - self._started, 1.0))
        return self._arrived / span

    def observe(self, confidences: np.ndarray) -> None:
        """Rows that reached the gate (cache misses), their edge confidence."""
        with self._lock:
            self._confidences.extend(confidences.tolist())
            now = self.clock()
            self._arrivals.append((now, len(confidences)))
            self._arrived += len(confidences)

    def threshold(self) -> float:
        """The threshold for the next rows."""
        budget = self.bucket.budget
        with self._lock:
            if not budget.controlled:
                return self.calibrated
            now = self.clock()
            if self._threshold is None or now - self._computed >= RECOMPUTE_S:
                rate = self._rate(now)
                if len(self._confidences) < MIN_ROWS or rate <= 0:
                    wanted = self.calibrated
                else:
                    share = self.target * budget.rows_per_s / rate
                    wanted = quantile_threshold(np.fromiter(self._confidences, float), share)
                self._threshold = min(1.0, max(self.floor, wanted))
                self._computed = now
            return self._threshold

    def admit(self, confidence: np.ndarray, unsure: list[int],
              promised: float) -> tuple[list[int], list[int]]:
        """Of the ``unsure`` rows (indices into ``confidence``), those that escalate now and
        those shed, each in request order. Rows below ``promised`` (the floor, or a request's
        own threshold) are needed: they take tokens first, least confident first, and those
        left without are shed. The others spend spare capacity: they escalate while the bucket
        holds more than its reserve, least confident first, and are otherwise the edge's
        answer (in neither list). Without a budget every unsure row escalates."""
        needed = int(np.count_nonzero(confidence[unsure] < promised)) if unsure else 0
        got, spare = self.bucket.admit(needed, len(unsure) - needed)
        if got == needed and spare == len(unsure) - needed:
            return unsure, []
        ordered = sorted(unsure, key=confidence.__getitem__)  # the needed rows are a prefix
        return sorted(ordered[:got] + ordered[needed:needed + spare]), ordered[got:needed]

    def take(self, rows: int) -> bool:
        """Spend budget on ``rows`` audit rows if it is there (never sheds, never waits)."""
        return self.bucket.take(rows)
