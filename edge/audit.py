"""Live accuracy without labels: a random sample of the rows the edge answered itself is also
sent to the center, off the request's path, and the edge-center agreement on it is held to what
the release's calibration split predicts for the same rows.

Each audited row with edge confidence ``c`` has an expected agreement ``p(c)`` and a
disagreement cost ``g(c)`` (the center right minus the edge right, where they differ) from its
calibration bin (``registry.publish.calibrate.agreement_bins``). Over the last ``window`` audited
rows:

- agreement ``A/n`` with a Wilson 95% interval;
- **drift** when the agreements fall short of the expected ones by more than ``drift_z``
  standard deviations: ``(A - sum p) / sqrt(sum p(1-p)) < -drift_z`` (each row a Bernoulli with
  its own ``p``; ``min_rows`` rows before any verdict);
- **estimated cascade accuracy**: center-only accuracy from calibration minus the edge's share
  of rows times the mean cost of the audited rows' disagreements, ``mean((1 - a) g)``. It
  assumes the center is as accurate as on the calibration split; the audit cannot see the
  center's own errors (docs/cascade.md says where this stops).

Agreement cannot see a shift both models fail alike (the demo's edge is distilled from its
center). So every row reaching the gate also counts towards **confidence drift**: the last
``CONFIDENCE_WINDOW`` rows' edge confidences, binned by the calibration's bins (equal shares of
the calibration split), against those shares: an alarm when a chi-square test rejects them
(p < 0.001) and the shift is material (population stability index >= ``psi_floor``).
"""

from __future__ import annotations

import asyncio
import math
import random
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from edge.cache import Answers
from edge.controller import Controller
from edge.errors import CenterUnavailable
from edge.escalation import Centers
from edge.metrics import EdgeMetrics
from edge.settings import EdgeSettings
from serving.protocol import v2
from serving.release.manifest import Calibration, Manifest
from serving.runtime.repository import Resident
from serving.telemetry.quality import psi

Z95 = 1.959964
CONFIDENCE_WINDOW = 2000  # rows reaching the gate the confidence test looks at
CONFIDENCE_MIN_ROWS = 500  # ... before any verdict
Z999 = 3.090232  # one-sided 0.001


def chi2_critical(df: int, z: float = Z999) -> float:
    """The chi-square quantile for ``df`` degrees of freedom at the normal quantile ``z``
    (Wilson-Hilferty; within 2% of the exact value from df 3 up)."""
    k = 2 / (9 * df)
    return float(df * (1 - k + z * math.sqrt(k)) ** 3)


@dataclass(frozen=True)
class AuditState:
    rows: int  # audited rows in the window
    agreement: float  # edge == center on them (0 when rows is 0)
    interval: float  # Wilson 95% half-width of agreement
    expected: float | None  # what the calibration split predicts for the same rows
    drift: bool
    estimated_accuracy: float | None  # of the cascade, live
    accuracy_interval: float
    confidence_psi: float | None = None  # live confidences vs the calibration's (None: too few)
    confidence_drift: bool = False


def wilson(successes: int, n: int, z: float = Z95) -> float:
    """Half-width of the Wilson score interval (0 for no rows)."""
    if n == 0:
        return 0.0
    p = successes / n
    return float(z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n))


class Auditor:
    """One release's audit on this edge. Thread-safe."""

    def __init__(self, calibration: Calibration, *, share: float, window: int, drift_z: float,
                 min_rows: int, psi_floor: float = 0.05, seed: int | None = None) -> None:
        self.share, self.drift_z, self.min_rows = share, drift_z, min_rows
        self.psi_floor = psi_floor
        self.center_accuracy = calibration.center_accuracy
        bins = calibration.agreement
        self._edges = np.array([b.le for b in bins])
        self._agreement = np.array([b.agreement for b in bins])
        self._gain = np.array([b.gain for b in bins])
        self._rows: deque[tuple[bool, float, float]] = deque(maxlen=window)
        total = sum(b.rows for b in bins)
        self._shares = np.array([b.rows / total for b in bins]) if total else np.zeros(0)
        self._seen: deque[int] = deque()  # bin of each recent gate row
        self._seen_counts = np.zeros(len(bins), np.int64)
        self._lock = threading.Lock()
        self._random = random.Random(seed)
        self._skip = self._gap()  # rows before the next pick
        self.kept_share = 1.0  # share of rows the edge answers itself (moving average)
        self.audited = 0  # rows compared since start

    @property
    def baseline(self) -> bool:
        """Whether the release carries the calibration's agreement baseline."""
        return len(self._edges) > 0

    def _bin(self, confidence: np.ndarray) -> np.ndarray:
        """The calibration bin of each confidence (the last bin takes anything above it)."""
        return np.searchsorted(self._edges, confidence, side="left").clip(  # pragma: no mutate
            0, len(self._edges) - 1)

    def pick(self, rows: int) -> list[int]:
        """Which of ``rows`` rows the edge answered itself go to the audit: each row with
        probability ``share``, independently of every other. Drawn as the gaps between picked
        rows (geometric), which carry over from request to request: no draw per row, none for
        a request that falls in a gap (most of them, at a share of a few percent)."""
        if self.share <= 0 or rows == 0:
            return []
        with self._lock:
            picked, at = [], self._skip
            while at < rows:
                picked.append(at)
                at += 1 + self._gap()
            self._skip = at - rows
            return picked

    def _gap(self) -> int:
        """Rows passed over before the next pick: geometric with success ``share``."""
        if not 0 < self.share < 1:  # every row (or none: pick() never asks)
            return 0
        return int(math.log(1.0 - self._random.random()) / math.log(1.0 - self.share))

    def observe(self, confidence: np.ndarray) -> None:
        """Rows that reached the gate: their edge confidence (for the confidence drift)."""
        if not self.baseline or not len(confidence):
            return
        at = self._bin(confidence)
        with self._lock:
            self._seen.extend(at.tolist())
            self._seen_counts += np.bincount(at, minlength=len(self._edges))
            while len(self._seen) > CONFIDENCE_WINDOW:
                self._seen_counts[self._seen.popleft()] -= 1

    def _confidence_shift(self) -> tuple[float | None, bool]:
        counts = self._seen_counts.astype(float)  # pragma: no mutate
        n = counts.sum()
        if n < CONFIDENCE_MIN_ROWS or len(counts) < 2:
            return None, False
        expected = self._shares * n
        chi2 = float((((counts - expected) ** 2) / np.maximum(expected, 1e-9)).sum())
        shift = psi(counts, self._shares)
        return shift, chi2 > chi2_critical(len(counts) - 1) and shift >= self.psi_floor

    def traffic(self, rows: int, kept: int) -> None:
        """A request's rows, ``kept`` of them answered by the edge (any edge tier)."""
        if rows:
            with self._lock:
                weight = min(1.0, rows / 5000)
                self.kept_share += weight * (kept / rows - self.kept_share)

    def record(self, confidence: np.ndarray, edge: np.ndarray, center: np.ndarray) -> None:
        """Audited rows: edge confidence, edge and center answers (class indices)."""
        if self.baseline:
            at = self._bin(confidence)
            expected, gain = self._agreement[at], self._gain[at]
        else:
            expected = gain = np.full(len(confidence), math.nan)  # pragma: no mutate
        agree = edge == center
        with self._lock:
            self.audited += len(agree)
            self._rows.extend(zip(agree.tolist(), expected.tolist(), gain.tolist(),
                                  strict=True))

    def state(self) -> AuditState:
        with self._lock:
            rows = list(self._rows)
            kept = self.kept_share
            psi, shifted = self._confidence_shift()
        n = len(rows)
        if not n:
            return AuditState(0, 0.0, 0.0, None, False, None, 0.0, psi, shifted)
        agree = np.array([r[0] for r in rows], float)  # pragma: no mutate
        successes = int(agree.sum())
        if not self.baseline:  # no bins: no confidence test either (psi None, not shifted)
            return AuditState(n, successes / n, wilson(successes, n), None, False, None, 0.0)
        p = np.array([r[1] for r in rows])
        g = np.array([r[2] for r in rows])
        variance = float((p * (1 - p)).sum())
        z = (successes - p.sum()) / math.sqrt(variance) if variance > 0 else 0.0
        drift = n >= self.min_rows and z < -self.drift_z
        cost = (1 - agree) * g
        accuracy = interval = None
        if self.center_accuracy is not None and n >= self.min_rows:
            accuracy = self.center_accuracy - kept * float(cost.mean())
            interval = Z95 * kept * float(cost.std(ddof=1)) / math.sqrt(n) if n > 1 else 0.0
        return AuditState(n, successes / n, wilson(successes, n), float(p.mean()), bool(drift),
                          accuracy, interval or 0.0, psi, shifted)


class Audit:
    """The audit loop on this edge: samples rows the edge answered itself to the center in the
    background, keeps one ``Auditor`` per model (its served version), exports their state as
    gauges, quality-report fields and readiness notes."""

    def __init__(self, settings: EdgeSettings, center: Centers, metrics: EdgeMetrics) -> None:
        self.settings, self.center, self.metrics = settings, center, metrics
        self.auditors: dict[tuple[str, int], Auditor] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def auditor(self, manifest: Manifest) -> Auditor:
        key = (manifest.name, manifest.version)
        found = self.auditors.get(key)
        if found is None:
            s = self.settings
            for old in [k for k in self.auditors if k[0] == manifest.name]:
                self.auditors.pop(old, None)  # one version at a time: a new calibration
            found = self.auditors[key] = Auditor(
                manifest.calibration, share=s.audit_share, window=s.audit_window,
                drift_z=s.drift_z, min_rows=s.audit_min_rows, psi_floor=s.drift_psi)
        return found

    def sample(self, resident: Resident, parsed: v2.Parsed, indices: list[int],
               answers: Answers, confidence: np.ndarray,
               controller: Controller | None) -> None:
        """Send a random share of the rows the edge answered itself to the center too, in the
        background: the client's answer never waits for it, and it is skipped (not queued) when
        audits are already in flight or the budget has no room."""
        auditor = self.auditor(resident.manifest)  # its observe() saw the rows' confidence
        tiers = answers.tiers
        kept = [j for j, tier in enumerate(tiers) if tier == "edge"]
        auditor.traffic(len(tiers), len(tiers) - tiers.count("center"))
        picked = [kept[k] for k in auditor.pick(len(kept))]
        if not picked or len(self._tasks) >= self.settings.audit_in_flight:
            return
        if controller is not None and not controller.take(len(picked)):
            return
        m = resident.manifest
        chosen = [indices[j] for j in picked]
        task = asyncio.get_running_loop().create_task(self._audit(
            auditor, m, parsed.inputs.forward(chosen), len(chosen), confidence[picked],
            answers.probabilities[picked].argmax(axis=1)))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _audit(self, auditor: Auditor, m: Manifest, inputs: list[v2.Tensor], rows: int,
                     confidence: np.ndarray, edge: np.ndarray) -> None:
        try:
            answer = await self.center.classify(m.name, inputs, rows, None, len(m.labels))
        except CenterUnavailable:  # no center: nothing to compare, the row is not counted
            return
        auditor.record(confidence, edge, answer.probabilities.argmax(axis=1))
        labels = (m.name, str(m.version))
        g = self.metrics
        g.audit_rows.labels(*labels).inc(rows)
        state = auditor.state()
        g.audit_agreement.labels(*labels).set(state.agreement)
        if state.expected is not None:
            g.audit_expected.labels(*labels).set(state.expected)
        g.audit_drift.labels(*labels).set(1 if state.drift else 0)
        if state.estimated_accuracy is not None:
            g.estimated_accuracy.labels(*labels).set(state.estimated_accuracy)
        self._export_confidence(labels, state)

    def _export_confidence(self, labels: tuple[str, str], state: AuditState) -> None:
        if state.confidence_psi is not None:
            self.metrics.confidence_psi.labels(*labels).set(state.confidence_psi)
            self.metrics.confidence_drift.labels(*labels).set(1 if state.confidence_drift
                                                              else 0)

    def report(self, model: str, version: int) -> dict[str, Any]:
        """The audit's part of a quality report."""
        out: dict[str, Any] = {}
        auditor = self.auditors.get((model, version))
        if auditor is None:
            return out
        state = auditor.state()
        if state.confidence_psi is not None:
            out |= {"confidence_psi": state.confidence_psi,  # pragma: no mutate
                    "confidence_drift": state.confidence_drift}
            self._export_confidence((model, str(version)), state)
        if auditor.audited:
            out |= {"audit_rows": state.rows, "audit_agreement": state.agreement,
                    "audit_interval": state.interval, "drift": state.drift}
            if state.expected is not None:
                out["audit_expected"] = state.expected
            if state.estimated_accuracy is not None:
                out |= {"estimated_accuracy": state.estimated_accuracy,
                        "accuracy_interval": state.accuracy_interval}
        return out

    def notes(self) -> list[str]:
        """What the readiness answer (and so the Consul check's output) should say."""
        notes = []
        for (model, version), auditor in sorted(self.auditors.items()):
            state = auditor.state()
            if state.drift and state.expected is not None:
                notes.append(f"drift: {model} v{version} agrees with the center on "
                             f"{state.agreement:.1%} ± {state.interval:.1%} of audited rows, "
                             f"calibration predicts {state.expected:.1%}")
            if state.confidence_drift and state.confidence_psi is not None:
                notes.append(f"drift: {model} v{version} edge confidences moved from the "
                             f"calibration split's (PSI {state.confidence_psi:.2f} over the "
                             f"last rows)")
        return notes

    async def stop(self) -> None:
        """Cancel the audit calls in flight (the center client is closed by its owner)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
