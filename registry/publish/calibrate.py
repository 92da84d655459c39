"""Calibrate the edge's confidence threshold against the center on a labelled split.

A row whose edge confidence (max softmax probability) is below the threshold is escalated to
the center. Sorting rows by confidence, escalating the k least confident gives one point of the
curve; the chosen threshold is the lowest escalation rate whose cascade accuracy is within
``tolerance`` of center-only accuracy and stays within it at every higher rate.

A calibration split of a few thousand rows is noisy: a gap of half a point between edge and
center is a handful of rows. So a point also has to be within tolerance in ``confidence``
(default 90%) of bootstrap resamples of the split, compared pairwise with the center on the same
resample; ``confidence=0`` gives the plain rule.
"""

from __future__ import annotations

import math

import numpy as np

from serving.model.scores import softmax
from serving.release.manifest import AgreementBin, Calibration, CurvePoint

DEFAULT_THRESHOLD = 0.9
"""Threshold used when no labelled calibration data is given (escalate below 90% confidence)."""

CURVE_POINTS = 51

DEFAULT_CONFIDENCE = 0.9
"""Share of bootstrap resamples in which the chosen point must be within tolerance."""

RESAMPLES = 400

AGREEMENT_BINS = 10
"""Confidence bins of the agreement baseline (equal row counts: ~200 rows each on 2,000)."""

PRIOR_ROWS = 5.0
"""Pseudo-rows pulling a bin's disagreement cost towards the cost over all disagreements."""


class _Sorted:
    """Rows ordered by edge confidence, and the distinct escalation counts k (0..n)."""

    def __init__(self, center_logits: np.ndarray, edge_logits: np.ndarray,
                 labels: np.ndarray) -> None:
        confidence = softmax(edge_logits).max(axis=1)
        self.order = np.argsort(confidence, kind="stable")
        self.conf = confidence[self.order]
        self.center_ok = (center_logits.argmax(1) == labels)[self.order].astype(np.float64)
        self.edge_ok = (edge_logits.argmax(1) == labels)[self.order].astype(np.float64)
        n = len(labels)
        self.ks = np.array([0] + [k for k in range(1, n) if self.conf[k - 1] < self.conf[k]]
                           + [n])

    def correct(self, weights: np.ndarray) -> np.ndarray:
        """Weighted correct answers when escalating the k least confident rows, for each k.

        ``weights`` is ``[..., n]`` (ones for the plain count, resample counts for bootstrap).
        """
        zeros = np.zeros((*weights.shape[:-1], 1))
        center = np.concatenate([zeros, np.cumsum(weights * self.center_ok, -1)], -1)
        edge = np.concatenate([np.cumsum((weights * self.edge_ok)[..., ::-1], -1)[..., ::-1],
                               zeros], -1)
        return np.asarray((center + edge)[..., self.ks])


def cascade_curve(center_logits: np.ndarray, edge_logits: np.ndarray,
                  labels: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every distinct operating point: thresholds, escalation rates, cascade accuracies."""
    rows = _Sorted(center_logits, edge_logits, labels)
    n = len(labels)
    thresholds = np.array([_threshold(rows.conf, int(k)) for k in rows.ks])
    return thresholds, rows.ks / n, rows.correct(np.ones(n)) / n


def _threshold(conf: np.ndarray, k: int) -> float:
    """A threshold that escalates exactly the k least confident rows (escalate if conf < t)."""
    if k == 0:
        return 0.0
    if k == len(conf):
        return max(1.0, math.nextafter(float(conf[-1]), math.inf))
    return float((conf[k - 1] + conf[k]) / 2)


def bootstrap_within(rows: _Sorted, tolerance: float, resamples: int,
                     seed: int = 0) -> np.ndarray:
    """Per operating point: the share of bootstrap resamples of the calibration split in which
    the cascade is within ``tolerance`` of center-only (paired: same resample for both)."""
    n = len(rows.conf)
    weights = np.random.default_rng(seed).multinomial(n, np.full(n, 1 / n), size=resamples)
    cascade = rows.correct(weights.astype(np.float64))
    center = (weights * rows.center_ok).sum(-1, keepdims=True)
    return np.asarray(((cascade - center) / n >= -tolerance - 1e-12).mean(0))


def calibrate(center_logits: np.ndarray, edge_logits: np.ndarray, labels: list[int],
              tolerance: float, confidence: float = DEFAULT_CONFIDENCE,
              resamples: int = RESAMPLES) -> Calibration:
    y = np.asarray(labels)
    thresholds, rates, accuracy = cascade_curve(center_logits, edge_logits, y)
    center_acc = float((center_logits.argmax(1) == y).mean())
    within = accuracy >= center_acc - tolerance - 1e-12
    if confidence > 0:
        rows = _Sorted(center_logits, edge_logits, y)
        within &= bootstrap_within(rows, tolerance, resamples) >= confidence
    # The lowest escalation rate from which the cascade stays within tolerance: a lucky early
    # point followed by a dip is noise that would not hold on new data. Escalating everything
    # is center-only accuracy, so the last point always qualifies.
    stays = np.logical_and.accumulate(within[::-1])[::-1]
    best = int(np.argmax(stays))
    picks = np.unique(np.searchsorted(rates, np.linspace(0, 1, CURVE_POINTS)).clip(
        0, len(rates) - 1))
    curve = [CurvePoint(round(float(thresholds[i]), 6), round(float(rates[i]), 6),
                        round(float(accuracy[i]), 6)) for i in sorted({*picks.tolist(), best})]
    return Calibration(
        agreement=agreement_bins(center_logits, edge_logits, y),
        source="labelled", threshold=float(thresholds[best]),
        escalation_rate=float(rates[best]), center_accuracy=center_acc,
        edge_accuracy=float((edge_logits.argmax(1) == y).mean()),
        cascade_accuracy=float(accuracy[best]), tolerance=tolerance, confidence=confidence,
        rows=len(y), curve=curve)


def agreement_bins(center_logits: np.ndarray, edge_logits: np.ndarray, labels: np.ndarray,
                   bins: int = AGREEMENT_BINS, prior: float = PRIOR_ROWS) -> list[AgreementBin]:
    """Edge-center agreement by edge confidence, in bins of (nearly) equal row counts, and per
    bin what a disagreement costs: the share of those rows the center gets right minus the share
    the edge does. A node's audit compares its live agreement with this, row by row.

    Both are smoothed, so a bin that happened to agree on all its rows does not predict that
    no row ever disagrees: agreement by Laplace's rule ((agree + 1) / (rows + 2)), the cost
    shrunk towards the cost over all disagreements by ``prior`` pseudo-rows."""
    confidence = softmax(edge_logits).max(axis=1)
    edge, center = edge_logits.argmax(1), center_logits.argmax(1)
    cost = (center == labels).astype(float) - (edge == labels)
    overall = float(cost[edge != center].mean()) if (edge != center).any() else 0.0
    order = np.argsort(confidence, kind="stable")
    chunks = [c for c in np.array_split(order, min(bins, len(order))) if len(c)]
    out = []
    for k, chunk in enumerate(chunks):
        differ = edge[chunk] != center[chunk]
        agreement = (float((~differ).sum()) + 1) / (len(chunk) + 2)
        gain = (float(cost[chunk][differ].sum()) + prior * overall) / (int(differ.sum()) + prior)
        le = 1.0 if k == len(chunks) - 1 else float(confidence[chunk[-1]])
        out.append(AgreementBin(round(le, 6), len(chunk), round(agreement, 6), round(gain, 6)))
    return out


def default_calibration() -> Calibration:
    return Calibration(source="default", threshold=DEFAULT_THRESHOLD)


def agreement(a: np.ndarray, b: np.ndarray) -> float:
    return float((a.argmax(1) == b.argmax(1)).mean())
