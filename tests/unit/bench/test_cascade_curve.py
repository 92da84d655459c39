"""The cascade report's curve arithmetic (bench/cascade/curve.py), on rows with known outcomes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bench.cascade.curve import Curve, Point, Saved, goal_met, merge_points, points
from bench.cascade.measure import Offline, calibrated_on


def _logits(confidence: float, right: bool) -> list[float]:
    """Two-class logits whose softmax max is ``confidence``, for label 1 if ``right``."""
    z = math.log(confidence / (1 - confidence))
    return [0.0, z] if right else [z, 0.0]


# Rows by rising edge confidence: the edge is wrong on rows 0 and 2, the center on row 1.
LABELS = np.array([1, 1, 1, 1])
EDGE = np.array([_logits(c, ok) for c, ok in
                 ((0.55, False), (0.6, True), (0.8, False), (0.95, True))], dtype=np.float32)
CENTER = np.array([_logits(0.9, ok) for ok in (True, False, True, True)], dtype=np.float32)


@pytest.fixture
def curve() -> Curve:
    return Curve.of(CENTER, EDGE, LABELS)


def test_curve_runs_from_edge_only_to_center_only(curve: Curve) -> None:
    assert (curve.edge_accuracy, curve.center_accuracy) == (0.5, 0.75)
    assert curve.escalation.tolist() == [0.0, 0.25, 0.5, 0.75, 1.0]
    # escalating row 0 fixes it, row 1 breaks (the center is wrong there), row 2 fixes again
    assert curve.accuracy.tolist() == [0.5, 0.75, 0.5, 0.75, 0.75]


def test_at_escalation_takes_the_first_point_at_or_above_the_rate(curve: Curve) -> None:
    assert curve.at_escalation(0.0).escalation == 0.0
    assert curve.at_escalation(0.25).escalation == 0.25
    assert curve.at_escalation(0.3).escalation == 0.5
    assert curve.at_escalation(1.0).accuracy == curve.center_accuracy


def test_lowest_within_vs_stays_within(curve: Curve) -> None:
    """Row 1 makes the cascade dip below center-only after a lucky first point."""
    assert curve.lowest_within(0.0).escalation == 0.25
    assert curve.stays_within(0.0).escalation == 0.75
    assert curve.stays_within(0.25).escalation == 0.0  # edge-only is within 25 points


def test_the_calibrated_threshold_lands_on_the_curve(curve: Curve) -> None:
    """The edge's rule (confidence < threshold) at each curve threshold gives that point."""
    offline = Offline(CENTER, EDGE, 0.0, 0.0, 0.0)
    for i in range(len(curve.escalation)):
        point = curve.point(i)
        placed = calibrated_on(offline, LABELS, point.threshold)
        assert (placed.escalation, placed.accuracy) == pytest.approx(
            (point.escalation, point.accuracy))


def test_compute_saved() -> None:
    saved = Saved(escalation=0.2, center_ms_per_row=10.0, edge_ms_per_row=2.0)
    assert saved.center_calls_avoided == pytest.approx(0.8)
    assert saved.center_ms_avoided == pytest.approx(8.0)
    assert saved.cascade_ms == pytest.approx(4.0)  # the edge always, the center for 20%
    assert saved.net_saved == pytest.approx(0.6)
    # an edge as costly as the center saves nothing even when it never escalates
    assert Saved(0.0, 5.0, 5.0).net_saved == pytest.approx(0.0)


def test_goal_is_half_a_point_at_35_percent() -> None:
    center = 0.8315
    assert goal_met(Point(0.7, 0.35, 0.8265), center)  # exactly 0.5 points behind
    assert not goal_met(Point(0.7, 0.198, 0.826), center)  # 0.55 points behind
    assert not goal_met(Point(0.8, 0.36, 0.8315), center)  # escalates too much


def test_merge_points_joins_names_of_one_point_and_sorts_by_escalation() -> None:
    a, b = Point(0.6, 0.2, 0.82), Point(0.0, 0.0, 0.8)
    merged = merge_points([("20%", a), ("edge only", b), ("calibrated", a)])
    assert merged == [("edge only", b), ("20% = calibrated", a)]


def test_points_never_prints_minus_zero() -> None:
    assert points(-0.0) == "+0.00 pts"
    assert points(-1e-15) == "+0.00 pts"
    assert points(-0.55) == "-0.55 pts"
