"""Quality telemetry a node reports to the registry: per model version and report window,
request count, latency percentiles, escalation share, edge confidence, input lengths and
input drift.

Input-length drift is the population stability index (PSI) of the window's length histogram
against everything this node saw for that version before it (0 = same shape; above 0.2 is
usually read as a real shift). Input drift compares the rows' statistics with the release's
calibration rows (``serving.inputs.drift``) over a sliding window, the last report windows
holding at least ``INPUT_ROWS`` measured rows: ``input_shift`` is the largest standardised shift
of a statistic's mean there, ``input_outliers`` the share of its rows with a statistic beyond
4 reference stds, ``input_rows`` how many rows that is. ``low_confidence_share`` is the share
of edge rows whose confidence is below ``LOW_CONFIDENCE`` (most rows there: a data-quality
problem).
"""

from __future__ import annotations

import bisect
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from serving.inputs.drift import InputSums

TOKEN_BUCKETS = (8, 16, 32, 64, 128, 256, math.inf)
CONFIDENCE_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, math.inf)
INPUT_ROWS = 1_000  # input drift is measured over at least the last this many rows (the seed's)
MAX_LATENCIES = 20_000  # per window; enough for a p99, bounded memory
THROUGHPUT_S = 60.0  # a center's capacity is measured over its last minute of batches
MIN_COMPUTE_S = 0.2  # ... once they took at least this much compute
MAX_BATCHES = 50_000  # and at most this many batches of it (bounded memory)
SMALL = 32  # values up to which a histogram is counted in Python, not numpy
LOW_CONFIDENCE = 0.3  # a row below it counts in low_confidence_share

Source = Callable[[str, int], dict[str, Any]]
"""More fields for one model version's report (the edge's controller and audit, say)."""


class Throughput:
    """What a model computes while busy, from its last ``THROUGHPUT_S`` seconds of batches.

    Each batch's compute time is fitted as ``fixed + per_row x rows`` (least squares over the
    batches' sizes; with one size only, all of it is per-row cost: conservative). The capacity
    is then the rows per second of the largest batch that computes within ``budget_s`` (and at
    most ``max_batch``): what the model takes while answering within its latency target."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._batches: deque[tuple[float, int, float]] = deque(maxlen=MAX_BATCHES)
        self._seconds = 0.0
        self._lock = threading.Lock()

    def add(self, rows: int, seconds: float) -> None:
        with self._lock:
            now = self.clock()
            if len(self._batches) == MAX_BATCHES:  # the oldest falls out: keep the sum right
                self._seconds -= self._batches[0][2]
            self._batches.append((now, rows, seconds))
            self._seconds += seconds
            while self._batches and self._batches[0][0] < now - THROUGHPUT_S:
                self._seconds -= self._batches.popleft()[2]

    def rows_per_s(self, max_batch: int = 1 << 30, budget_s: float = math.inf) -> float | None:
        """None until the window holds ``MIN_COMPUTE_S`` of compute."""
        with self._lock:
            if self._seconds < MIN_COMPUTE_S:
                return None
            rows = np.array([b[1] for b in self._batches], float)
            seconds = np.array([b[2] for b in self._batches])
        fixed, per_row = 0.0, float(seconds.sum() / rows.sum())
        if rows.min() != rows.max():
            slope, intercept = np.polyfit(rows, seconds, 1)
            if slope > 0:
                fixed, per_row = max(float(intercept), 0.0), float(slope)
        fits = int((budget_s - fixed) / per_row) if math.isfinite(budget_s) else max_batch
        batch = max(1, min(max_batch, fits))
        return batch / (fixed + per_row * batch)


def psi(current: np.ndarray, baseline: np.ndarray, floor: float = 1e-4) -> float:
    if current.sum() == 0 or baseline.sum() == 0:
        return 0.0
    p = np.maximum(current / current.sum(), floor)
    q = np.maximum(baseline / baseline.sum(), floor)
    return float(np.sum((p - q) * np.log(p / q)))


def _counts(values: list[float] | list[int], buckets: tuple[float, ...]) -> np.ndarray:
    return np.bincount(np.searchsorted(buckets, values, side="left"), minlength=len(buckets))


def _add_counts(counts: np.ndarray, values: list[float] | list[int],
                buckets: tuple[float, ...]) -> None:
    """``counts += _counts(values, buckets)``; a request's few rows bisected one by one (the
    numpy calls cost more than the work below a few dozen values: once per request)."""
    if len(values) > SMALL:
        counts += _counts(values, buckets)
        return
    for value in values:
        counts[bisect.bisect_left(buckets, value)] += 1


@dataclass
class _Window:
    requests: int = 0
    latencies: list[float] = field(default_factory=list)
    tiers: dict[str, int] = field(default_factory=dict)
    tokens: np.ndarray = field(default_factory=lambda: np.zeros(len(TOKEN_BUCKETS), np.int64))
    token_sum: int = 0
    confidence: np.ndarray = field(
        default_factory=lambda: np.zeros(len(CONFIDENCE_BUCKETS), np.int64))
    low_confidence: int = 0
    input_shift: np.ndarray | None = None  # per statistic: the rows' z summed (drift.InputSums)
    input_outliers: int = 0
    input_rows: int = 0

    def add_inputs(self, shift: np.ndarray, outliers: int, rows: int) -> None:
        if self.input_shift is None:
            self.input_shift = np.zeros(len(shift))
        if len(shift) != len(self.input_shift):  # another worker on another release's code
            return
        self.input_shift += shift
        self.input_outliers += outliers
        self.input_rows += rows


class QualityWindow:
    """Fed by the serving path (any thread), drained by the sync subscriber."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._windows: dict[tuple[str, int], _Window] = {}
        self._baselines: dict[tuple[str, int], np.ndarray] = {}
        self._recent: dict[tuple[str, int], deque[_Sums]] = {}  # the last INPUT_ROWS measured
        self._started = time.monotonic()
        self.sources: list[Source] = []
        self.idle_sources: list[Source] = []
        self.inflows: list[Callable[[QualityWindow], None]] = []  # run first in each drain
        self.outflows: list[Callable[[dict[str, Any]], None]] = []  # given each drained report

    def _window(self, model: str, version: int) -> _Window:
        found = self._windows.get((model, version))
        if found is None:  # built only when missing: it holds two numpy arrays
            found = self._windows[(model, version)] = _Window()
        return found

    def request(self, model: str, version: int, seconds: float) -> None:
        with self._lock:
            w = self._window(model, version)
            w.requests += 1
            if len(w.latencies) < MAX_LATENCIES:
                w.latencies.append(seconds)

    def rows(self, model: str, version: int, lengths: list[int], tiers: list[str]) -> None:
        with self._lock:
            w = self._window(model, version)
            _add_counts(w.tokens, lengths, TOKEN_BUCKETS)
            w.token_sum += sum(lengths)
            for tier in tiers:
                w.tiers[tier] = w.tiers.get(tier, 0) + 1

    def confidence(self, model: str, version: int, values: list[float]) -> None:
        low = sum(1 for v in values if v < LOW_CONFIDENCE)
        with self._lock:
            w = self._window(model, version)
            _add_counts(w.confidence, values, CONFIDENCE_BUCKETS)
            w.low_confidence += low

    def inputs(self, model: str, version: int, measured: InputSums) -> None:
        """Rows' input statistics against the release's reference (``InputDrift.measure``)."""
        with self._lock:
            self._window(model, version).add_inputs(measured.shift, measured.outliers,
                                                    measured.rows)

    def add_source(self, source: Source, idle: bool = False) -> None:
        """Fields ``source`` adds to each report; with ``idle``, also to a report of a served
        version that saw no traffic in the window (sent only when such a source has something
        to say: a center's capacity must stay visible while no edge escalates, but an idle
        edge's last traffic report should not be replaced by an empty one)."""
        self.sources.append(source)
        if idle:
            self.idle_sources.append(source)

    def drain(self, served: Sequence[tuple[str, int]] = ()) -> list[dict[str, Any]]:
        """One report per model version seen since the last drain, and per idle ``served`` one
        that an idle source adds fields to; starts a new window."""
        # e.g. the other workers' windows (serving/telemetry/quality_pool.py)
        for inflow in self.inflows:
            inflow(self)
        with self._lock:
            windows, self._windows = self._windows, {}
            idle = sorted(set(served) - set(windows))
            now = time.monotonic()
            span, self._started = now - self._started, now
        reports = []
        for (model, version), w in sorted(windows.items()):
            report = self._report(model, version, w, span)
            for source in self.sources:
                report |= source(model, version)
            reports.append(report)
        for model, version in idle:
            extra: dict[str, Any] = {}
            for source in self.idle_sources:
                extra |= source(model, version)
            if extra:
                reports.append(self._report(model, version, _Window(), span) | extra)
        reports.sort(key=lambda r: (r["model"], r["version"]))
        for outflow in self.outflows:  # e.g. the edge's gauges of the last window
            for report in reports:
                outflow(report)
        return reports

    def export(self) -> list[dict[str, Any]]:
        """The windows as they are (JSON-ready), for another process to :meth:`absorb`;
        starts new ones."""
        with self._lock:
            windows, self._windows = self._windows, {}
        return [{"model": model, "version": version, "requests": w.requests,
                 "latencies": w.latencies, "tiers": w.tiers, "tokens": w.tokens.tolist(),
                 "token_sum": w.token_sum, "confidence": w.confidence.tolist(),
                 "low_confidence": w.low_confidence,
                 "input_shift": None if w.input_shift is None else w.input_shift.tolist(),
                 "input_outliers": w.input_outliers, "input_rows": w.input_rows}
                for (model, version), w in windows.items()]

    def absorb(self, exported: list[dict[str, Any]]) -> None:
        """Add windows :meth:`export` gave (another worker's traffic) to this window."""
        with self._lock:
            for e in exported:
                w = self._window(str(e["model"]), int(e["version"]))
                w.requests += int(e["requests"])
                room = max(0, MAX_LATENCIES - len(w.latencies))
                w.latencies.extend(float(x) for x in e["latencies"][:room])
                for tier, count in e["tiers"].items():
                    w.tiers[str(tier)] = w.tiers.get(str(tier), 0) + int(count)
                w.tokens += np.asarray(e["tokens"], np.int64).reshape(w.tokens.shape)
                w.token_sum += int(e["token_sum"])
                w.confidence += np.asarray(e["confidence"], np.int64).reshape(
                    w.confidence.shape)
                w.low_confidence += int(e.get("low_confidence", 0))
                if e.get("input_shift") is not None:
                    w.add_inputs(np.asarray(e["input_shift"], np.float64),
                                 int(e["input_outliers"]), int(e["input_rows"]))

    def _recent_inputs(self, key: tuple[str, int], w: _Window) -> _Sums | None:
        """The input sums of the last windows holding at least ``INPUT_ROWS`` measured rows,
        ``w``'s included: the seed's sliding window. A window measuring nothing (idle, or every
        row answered from the cache) leaves the figure where the last rows put it."""
        recent = self._recent.setdefault(key, deque())
        if w.input_shift is not None and w.input_rows:
            if recent and len(recent[-1][0]) != len(w.input_shift):
                recent.clear()  # other statistics (another worker's code): start over
            recent.append((w.input_shift.copy(), w.input_outliers, w.input_rows))
        total = sum(r[2] for r in recent)
        while len(recent) > 1 and total - recent[0][2] >= INPUT_ROWS:
            total -= recent.popleft()[2]
        if not recent:
            return None
        return (np.sum([r[0] for r in recent], axis=0), sum(r[1] for r in recent), total)

    def _report(self, model: str, version: int, w: _Window, span: float) -> dict[str, Any]:
        rows = sum(w.tiers.values())
        baseline = self._baselines.get((model, version))
        drift = psi(w.tokens, baseline) if baseline is not None else 0.0
        self._baselines[(model, version)] = w.tokens + (0 if baseline is None else baseline)
        latencies = np.asarray(w.latencies) * 1000 if w.latencies else np.zeros(1)
        return {
            "model": model, "version": version, "window_s": span, "requests": w.requests,
            "rows": rows,
            "escalation_rate": w.tiers.get("center", 0) / rows if rows else 0.0,
            "degraded_rate": w.tiers.get("edge-degraded", 0) / rows if rows else 0.0,
            "shed_rate": w.tiers.get("edge-shed", 0) / rows if rows else 0.0,
            "confidence": _buckets(w.confidence, CONFIDENCE_BUCKETS),
            "mean_tokens": w.token_sum / rows if rows else 0.0,
            "tokens": _buckets(w.tokens, TOKEN_BUCKETS),
            "length_drift": drift,
            **_inputs(w, self._recent_inputs((model, version), w)),
            "p50_ms": float(np.percentile(latencies, 50)),
            "p99_ms": float(np.percentile(latencies, 99)),
        }


_Sums = tuple[np.ndarray, int, int]  # a window's input sums: z per statistic, outliers, rows


def _inputs(w: _Window, recent: _Sums | None) -> dict[str, Any]:
    """The input drift fields over ``recent`` (the last rows measured) and the window's
    low-confidence share (0 with no reference, rows or confidences)."""
    shift, outliers, rows = recent if recent is not None else (None, 0, 0)
    edge_rows = int(w.confidence.sum())
    return {
        "input_shift": float(np.abs(shift).max() / rows)
        if shift is not None and len(shift) and rows else 0.0,
        "input_outliers": outliers / rows if rows else 0.0,
        "input_rows": rows,
        "low_confidence_share": w.low_confidence / edge_rows if edge_rows else 0.0,
    }


def _buckets(counts: np.ndarray, bounds: tuple[float, ...]) -> list[dict[str, float]]:
    return [{"le": float(le), "count": int(c)} for le, c in zip(bounds, counts, strict=True)]
