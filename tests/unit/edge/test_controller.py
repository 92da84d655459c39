"""The cascade controller under simulated traffic: a fake clock, confidences drawn like an edge
model's, and the budget the registry would push."""

from __future__ import annotations

import numpy as np
import pytest

from edge.controller import Controller, floor_threshold, quantile_threshold
from serving.protocol.budget import Budget
from serving.release.manifest import Calibration, CurvePoint

CURVE = [CurvePoint(0.0, 0.0, 0.80), CurvePoint(0.55, 0.05, 0.805),
         CurvePoint(0.62, 0.10, 0.812), CurvePoint(0.70, 0.20, 0.818),
         CurvePoint(0.80, 0.35, 0.82), CurvePoint(1.0, 1.0, 0.82)]
CALIBRATION = Calibration("labelled", 0.70, escalation_rate=0.2, center_accuracy=0.82,
                          cascade_accuracy=0.818, curve=CURVE)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def controller(clock: Clock, tolerance: float = 0.01, **kw: float) -> Controller:
    settings = {"window": 2000, "horizon_s": 5.0, "target": 0.9, "burst_s": 1.0} | kw
    return Controller(CALIBRATION, floor_tolerance=tolerance, clock=clock,
                      **settings)  # type: ignore[arg-type]


def run(c: Controller, clock: Clock, seconds: float, rows_per_s: float,
        rng: np.random.Generator, per_request: int = 1) -> dict[str, float]:
    """Traffic through the gate as the edge's pipeline drives it: observe, threshold, admit."""
    escalated = shed = rows = 0
    step = per_request / rows_per_s
    end = clock.now + seconds
    while clock.now < end:
        confidence = 0.5 + 0.5 * rng.beta(2.0, 1.2, per_request)  # most rows fairly sure
        c.observe(confidence)
        threshold = c.threshold()
        went, dropped = c.admit(confidence, np.flatnonzero(confidence < threshold).tolist(),
                                min(threshold, c.floor))
        escalated += len(went)
        shed += len(dropped)
        rows += per_request
        clock.now += step
    return {"escalated_per_s": escalated / seconds, "shed": shed / rows,
            "escalation_rate": escalated / rows, "threshold": c.threshold()}


def test_floor_is_the_lowest_threshold_that_stays_within_tolerance() -> None:
    assert floor_threshold(CALIBRATION, 0.02) == 0.0  # every point within 2 points
    assert floor_threshold(CALIBRATION, 0.01) == 0.62  # 0.55 gives 0.805 < 0.81
    assert floor_threshold(CALIBRATION, 0.005) == 0.70
    assert floor_threshold(CALIBRATION, 0.0) == 0.70  # never above the calibrated one
    no_curve = Calibration("default", 0.9)
    assert floor_threshold(no_curve, 0.05) == 0.9


def test_quantile_threshold_escalates_the_asked_share() -> None:
    values = np.linspace(0.5, 1.0, 1001)
    t = quantile_threshold(values, 0.2)
    assert (values < t).mean() == pytest.approx(0.2, abs=0.002)
    assert quantile_threshold(values, 1.0) == 1.0 and quantile_threshold(values, 0.0) == 0.0


def test_without_a_budget_the_calibrated_threshold_holds_and_nothing_is_shed() -> None:
    clock, rng = Clock(), np.random.default_rng(0)
    c = controller(clock)
    out = run(c, clock, 5, 200, rng)
    assert out["threshold"] == 0.70 and out["shed"] == 0


def test_converges_to_its_budget_and_stays_under_it() -> None:
    clock, rng = Clock(), np.random.default_rng(1)
    c = controller(clock)
    c.set_budget(Budget(True, rows_per_s=30.0, capacity_rows_s=60.0, share=0.5))
    run(c, clock, 5, 200, rng)  # settle
    out = run(c, clock, 20, 200, rng)
    # aims at 90% of the budget: 27 rows/s of 200 = 13.5%
    assert 24 <= out["escalated_per_s"] <= 30
    assert out["escalation_rate"] == pytest.approx(0.135, abs=0.02)
    assert out["shed"] < 0.01  # the threshold, not shedding, keeps it under budget
    assert c.floor < out["threshold"] < 1


def test_when_traffic_triples_escalations_stay_within_budget() -> None:
    clock, rng = Clock(), np.random.default_rng(2)
    c = controller(clock)
    c.set_budget(Budget(True, rows_per_s=30.0))
    run(c, clock, 10, 100, rng)
    before = c.threshold()
    out = run(c, clock, 15, 300, rng, per_request=4)
    assert out["escalated_per_s"] <= 30.5  # the bucket caps it even while the rate estimate moves
    assert out["threshold"] < before


def test_the_floor_bounds_the_threshold_and_the_surplus_is_shed() -> None:
    clock, rng = Clock(), np.random.default_rng(3)
    c = controller(clock, tolerance=0.01)  # floor 0.62
    c.set_budget(Budget(True, rows_per_s=2.0))
    out = run(c, clock, 20, 200, rng)
    assert out["threshold"] == c.floor == 0.62
    assert out["escalated_per_s"] <= 2.1  # never above the budget
    assert out["shed"] > 0.02  # rows under the floor that found no budget


def test_spare_capacity_goes_up_to_center_only() -> None:
    clock, rng = Clock(), np.random.default_rng(4)
    c = controller(clock)
    c.set_budget(Budget(True, rows_per_s=500.0))
    run(c, clock, 1, 100, rng)  # its first rows: the calibrated threshold
    out = run(c, clock, 10, 100, rng)
    assert out["threshold"] == 1.0 and out["escalation_rate"] == pytest.approx(1.0, abs=0.01)
    assert out["shed"] == 0


def test_first_rows_get_the_calibrated_threshold_and_a_new_release_moves_the_floor() -> None:
    clock = Clock()
    c = controller(clock, tolerance=0.01)
    c.set_budget(Budget(True, rows_per_s=0.001))
    assert c.threshold() == 0.70  # nothing seen yet: not center-only, not the floor
    clock.now += 1
    c.observe(np.full(100, 0.6))
    assert c.threshold() == 0.62
    c.release(Calibration("default", 0.85), 0.005)
    assert c.threshold() == 0.85 and c.calibrated == 0.85
