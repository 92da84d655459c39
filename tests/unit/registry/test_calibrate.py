from __future__ import annotations

import numpy as np
import pytest

from registry.publish.calibrate import (
    DEFAULT_THRESHOLD,
    calibrate,
    cascade_curve,
    default_calibration,
)
from serving.model.scores import softmax


def _logits(pred: np.ndarray, confidence: np.ndarray) -> np.ndarray:
    """Two-class logits whose softmax max-probability equals ``confidence``."""
    margin = np.log(confidence / (1 - confidence))
    out = np.zeros((len(pred), 2), dtype=np.float32)
    out[np.arange(len(pred)), pred] = margin
    return out


def test_threshold_escalates_exactly_the_unsure_wrong_rows() -> None:
    labels = np.array([0, 1] * 50)
    center = _logits(labels, np.full(100, 0.99))  # the center is always right
    edge_pred = labels.copy()
    confidence = np.linspace(0.55, 0.99, 100)
    edge_pred[:20] = 1 - labels[:20]  # the 20 least confident edge answers are wrong
    cal = calibrate(center, _logits(edge_pred, confidence), labels.tolist(), tolerance=0.0)
    # every resample agrees here: escalating exactly the wrong rows is right in all of them
    assert cal.confidence == 0.9
    assert cal.center_accuracy == 1.0 and cal.edge_accuracy == pytest.approx(0.8)
    assert cal.escalation_rate == pytest.approx(0.2)
    assert cal.cascade_accuracy == 1.0
    conf = softmax(_logits(edge_pred, confidence)).max(1)
    assert ((conf < cal.threshold) == (np.arange(100) < 20)).all()


def test_tolerance_trades_accuracy_for_fewer_escalations() -> None:
    labels = np.array([0, 1] * 50)
    center = _logits(labels, np.full(100, 0.99))
    edge_pred = labels.copy()
    edge_pred[:20] = 1 - labels[:20]
    edge = _logits(edge_pred, np.linspace(0.55, 0.99, 100))
    strict = calibrate(center, edge, labels.tolist(), tolerance=0.0, confidence=0)
    loose = calibrate(center, edge, labels.tolist(), tolerance=0.05, confidence=0)
    assert loose.escalation_rate == pytest.approx(0.15)
    assert loose.cascade_accuracy == pytest.approx(0.95)
    assert loose.threshold < strict.threshold


def test_curve_spans_edge_only_to_center_only() -> None:
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 500)
    center = rng.normal(size=(500, 2)).astype(np.float32)
    edge = rng.normal(size=(500, 2)).astype(np.float32)
    thresholds, rates, acc = cascade_curve(center, edge, labels)
    assert rates[0] == 0 and rates[-1] == 1
    assert acc[0] == pytest.approx((edge.argmax(1) == labels).mean())
    assert acc[-1] == pytest.approx((center.argmax(1) == labels).mean())
    assert (np.diff(thresholds) > 0).all() and (np.diff(rates) > 0).all()
    cal = calibrate(center, edge, labels.tolist(), tolerance=0.005)
    assert cal.curve[0].escalation_rate == 0 and cal.curve[-1].escalation_rate == 1
    assert cal.cascade_accuracy is not None and cal.center_accuracy is not None
    assert cal.cascade_accuracy >= cal.center_accuracy - 0.005


def test_tied_confidences_are_never_split() -> None:
    labels = np.array([0, 0, 1, 1])
    edge = _logits(np.array([1, 0, 1, 0]), np.array([0.7, 0.7, 0.7, 0.7]))
    center = _logits(labels, np.full(4, 0.9))
    _, rates, _ = cascade_curve(center, edge, labels)
    assert rates.tolist() == [0.0, 1.0]


def test_default_without_labels() -> None:
    cal = default_calibration()
    assert cal.source == "default" and cal.threshold == DEFAULT_THRESHOLD and cal.curve == []


def test_a_lucky_early_point_followed_by_a_dip_is_not_chosen() -> None:
    """Escalating the 2 least confident rows fixes them; the next 3 break cascade accuracy again
    (the center is wrong there); only from 8 escalated rows on does it stay within tolerance."""
    n = 20
    labels = np.zeros(n, dtype=int)
    confidence = np.linspace(0.51, 0.99, n)
    edge_pred = np.zeros(n, dtype=int)
    edge_pred[:2] = 1  # edge wrong on the 2 least confident rows
    center_pred = np.zeros(n, dtype=int)
    center_pred[2:5] = 1  # center wrong on the next 3, where the edge is right
    center_pred[8:11] = 1  # ...and on 3 more further up
    edge_pred[5:8] = 1
    edge_pred[11:14] = 1
    cal = calibrate(_logits(center_pred, np.full(n, 0.9)), _logits(edge_pred, confidence),
                    labels.tolist(), tolerance=0.0, confidence=0)
    _, rates, accuracy = cascade_curve(_logits(center_pred, np.full(n, 0.9)),
                                       _logits(edge_pred, confidence), labels)
    lucky = np.flatnonzero(accuracy >= cal.center_accuracy)[0]
    assert rates[lucky] == pytest.approx(2 / n)  # the naive rule would stop here
    assert cal.escalation_rate is not None and cal.escalation_rate > rates[lucky]
    later = rates >= cal.escalation_rate
    assert (accuracy[later] >= cal.center_accuracy).all()


def test_bootstrap_refuses_a_gap_that_is_within_tolerance_only_by_luck() -> None:
    """Edge 0.4 points below the center on 2000 rows: the plain rule keeps everything on the
    edge, but the gap is noise-sized, so the bootstrap rule escalates the unsure rows."""
    rng = np.random.default_rng(1)
    n = 2000
    labels = rng.integers(0, 2, n)
    confidence = rng.uniform(0.5, 1.0, n)
    # the center is wrong on 360 rows (82%), the edge on 368 (81.6%), mostly its unsure ones
    center_pred = labels.copy()
    center_pred[rng.choice(n, 360, replace=False)] ^= 1
    weight = (1.0 - confidence) ** 2
    edge_pred = labels.copy()
    edge_pred[rng.choice(n, 368, replace=False, p=weight / weight.sum())] ^= 1
    center, edge = _logits(center_pred, np.full(n, 0.9)), _logits(edge_pred, confidence)
    edge_acc, center_acc = (edge_pred == labels).mean(), (center_pred == labels).mean()
    assert center_acc - 0.005 <= edge_acc < center_acc  # within tolerance as measured
    plain = calibrate(center, edge, labels.tolist(), tolerance=0.005, confidence=0)
    robust = calibrate(center, edge, labels.tolist(), tolerance=0.005, confidence=0.9)
    assert plain.escalation_rate == 0.0
    assert robust.escalation_rate is not None and robust.escalation_rate > 0.05
    assert robust.cascade_accuracy is not None and robust.cascade_accuracy >= center_acc - 0.005
    again = calibrate(center, edge, labels.tolist(), tolerance=0.005, confidence=0.9)
    assert again.threshold == robust.threshold  # seeded: the same split gives the same answer
