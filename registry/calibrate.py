"""Calibrate the edge's confidence threshold against the center on a labelled split.

A row whose edge confidence (max softmax probability) is below the threshold is escalated to
the center. Sorting rows by confidence, escalating the k least confident gives one point of the
curve; the chosen threshold is the lowest escalation rate whose cascade accuracy is within
``tolerance`` of center-only accuracy and stays within it at every higher rate.
"""

from __future__ import annotations

import math

import numpy as np

from registry.validate import softmax
from serving.manifest import Calibration, CurvePoint

DEFAULT_THRESHOLD = 0.9
"""Threshold used when no labelled calibration data is given (escalate below 90% confidence)."""

CURVE_POINTS = 51


def cascade_curve(center_logits: np.ndarray, edge_logits: np.ndarray,
                  labels: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every distinct operating point: thresholds, escalation rates, cascade accuracies."""
    confidence = softmax(edge_logits).max(axis=1)
    order = np.argsort(confidence, kind="stable")
    conf = confidence[order]
    center_ok = (center_logits.argmax(1) == labels)[order]
    edge_ok = (edge_logits.argmax(1) == labels)[order]
    n = len(labels)
    # correct(k) = center right on the k escalated rows + edge right on the rest
    correct = (np.concatenate([[0], np.cumsum(center_ok)])
               + np.concatenate([np.cumsum(edge_ok[::-1])[::-1], [0]]))
    ks = [0] + [k for k in range(1, n) if conf[k - 1] < conf[k]] + [n]
    thresholds = np.array([_threshold(conf, k) for k in ks])
    return thresholds, np.array(ks) / n, correct[ks] / n


def _threshold(conf: np.ndarray, k: int) -> float:
    """A threshold that escalates exactly the k least confident rows (escalate if conf < t)."""
    if k == 0:
        return 0.0
    if k == len(conf):
        return max(1.0, math.nextafter(float(conf[-1]), math.inf))
    return float((conf[k - 1] + conf[k]) / 2)


def calibrate(center_logits: np.ndarray, edge_logits: np.ndarray, labels: list[int],
              tolerance: float) -> Calibration:
    y = np.asarray(labels)
    thresholds, rates, accuracy = cascade_curve(center_logits, edge_logits, y)
    center_acc = float((center_logits.argmax(1) == y).mean())
    within = accuracy >= center_acc - tolerance - 1e-12
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
        source="labelled", threshold=float(thresholds[best]),
        escalation_rate=float(rates[best]), center_accuracy=center_acc,
        edge_accuracy=float((edge_logits.argmax(1) == y).mean()),
        cascade_accuracy=float(accuracy[best]), tolerance=tolerance, rows=len(y), curve=curve)


def default_calibration() -> Calibration:
    return Calibration(source="default", threshold=DEFAULT_THRESHOLD)


def agreement(a: np.ndarray, b: np.ndarray) -> float:
    return float((a.argmax(1) == b.argmax(1)).mean())
