"""The live audit: agreement with the center held to the calibration's prediction, row by row."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edge.audit import Auditor, chi2_critical, wilson
from serving.release.manifest import AgreementBin, Calibration
from serving.telemetry.quality import psi

BINS = [AgreementBin(0.7, 100, 0.80, 0.3), AgreementBin(0.9, 100, 0.95, 0.2),
        AgreementBin(1.0, 100, 0.99, 0.1)]
CALIBRATION = Calibration("labelled", 0.7, center_accuracy=0.85, agreement=BINS)


def auditor(**kw: float) -> Auditor:
    settings = {"share": 1.0, "window": 500, "drift_z": 3.0, "min_rows": 100} | kw
    return Auditor(CALIBRATION, seed=0, **settings)  # type: ignore[arg-type]


def feed(a: Auditor, rng: np.random.Generator, rows: int, agreement_scale: float = 1.0) -> None:
    """Audited rows whose agreement is the calibration's, scaled."""
    confidence = rng.uniform(0.6, 1.0, rows)
    expected = np.array([0.80, 0.95, 0.99])[np.searchsorted([0.7, 0.9, 1.0], confidence)]
    agree = rng.random(rows) < expected * agreement_scale
    edge = np.zeros(rows, int)
    a.record(confidence, edge, np.where(agree, 0, 1))


def test_wilson_interval() -> None:
    assert wilson(0, 0) == 0
    assert wilson(90, 100) == pytest.approx(0.0594, abs=0.001)  # Wilson score, 95%


def test_matched_traffic_raises_no_alarm_and_agrees_within_the_interval() -> None:
    rng = np.random.default_rng(1)
    alarms = 0
    for _ in range(200):  # 200 independent windows of 500 audited rows
        a = auditor()
        feed(a, rng, 500)
        state = a.state()
        alarms += state.drift
        assert state.expected is not None
    assert alarms <= 2  # z = 3: about 0.1% of windows by chance


def test_drift_is_raised_when_agreement_falls() -> None:
    rng = np.random.default_rng(2)
    a = auditor()
    feed(a, rng, 400)
    assert not a.state().drift
    feed(a, rng, 300, agreement_scale=0.8)  # a fifth of the agreements gone
    state = a.state()
    assert state.drift and state.agreement < state.expected - state.interval  # type: ignore[operator]


def test_no_verdict_before_min_rows_and_none_without_a_baseline() -> None:
    rng = np.random.default_rng(3)
    a = auditor()
    feed(a, rng, 50, agreement_scale=0.5)
    assert not a.state().drift and a.state().estimated_accuracy is None
    bare = Auditor(Calibration("default", 0.9), share=1.0, window=500, drift_z=3.0,
                   min_rows=10, seed=0)
    feed(bare, rng, 200, agreement_scale=0.5)
    state = bare.state()
    assert not bare.baseline and state.rows == 200 and state.expected is None
    assert not state.drift and state.estimated_accuracy is None


def test_estimated_accuracy_is_center_minus_the_cost_of_kept_disagreements() -> None:
    a = auditor(min_rows=1)
    a.traffic(1000, 800)  # the edge answers 80%
    a.kept_share = 0.8
    # 100 rows in the first bin (gain 0.3), 10 of them disagree
    a.record(np.full(100, 0.65), np.zeros(100, int), np.r_[np.ones(10, int), np.zeros(90, int)])
    state = a.state()
    assert state.agreement == pytest.approx(0.9)
    assert state.estimated_accuracy == pytest.approx(0.85 - 0.8 * 0.1 * 0.3)
    assert 0 < state.accuracy_interval < 0.05


def test_pick_samples_about_its_share() -> None:
    a = auditor(share=0.01)
    picked = sum(len(a.pick(100)) for _ in range(1000))
    assert 700 <= picked <= 1300
    assert auditor(share=0.0).pick(100) == []


def test_chi2_critical_is_close_to_the_table() -> None:
    assert chi2_critical(9) == pytest.approx(27.877, rel=0.02)
    assert chi2_critical(2) == pytest.approx(13.816, rel=0.05)


def test_confidences_like_the_calibration_split_raise_no_alarm_and_shifted_ones_do() -> None:
    rng = np.random.default_rng(5)
    # the calibration's bins hold equal shares: (.., 0.7], (0.7, 0.9], (0.9, 1.0]
    def like_calibration(n: int) -> np.ndarray:
        return np.choose(rng.integers(0, 3, n), [rng.uniform(0.5, 0.7, n),
                                                 rng.uniform(0.7, 0.9, n),
                                                 rng.uniform(0.9, 1.0, n)])
    alarms = 0
    for _ in range(100):
        a = auditor()
        a.observe(like_calibration(2000))
        state = a.state()
        assert state.confidence_psi is not None and state.confidence_psi < 0.01
        alarms += state.confidence_drift
    assert alarms <= 1
    a = auditor()
    a.observe(like_calibration(400))
    assert a.state().confidence_psi is None  # too few rows for a verdict
    a.observe(rng.uniform(0.5, 0.7, 1600))  # inputs the edge is unsure about
    state = a.state()
    assert state.confidence_drift and state.confidence_psi > 0.3  # type: ignore[operator]
    assert not state.drift  # nothing audited: agreement says nothing


@pytest.mark.parametrize(("share", "rows"), [(0.01, 1), (0.01, 7), (0.3, 1), (0.3, 7), (0.5, 1),
                                             (0.5, 2)])
def test_each_row_is_picked_with_probability_share_however_requests_cut_the_rows(
        share: float, rows: int) -> None:
    """The gaps between picks carry over from request to request: one-row requests are
    sampled at the share like long ones (a gap off by one shows most at high shares)."""
    a = auditor(share=share)
    requests = 60_000 // rows
    picked = [a.pick(rows) for _ in range(requests)]
    assert all(p == sorted(set(p)) and all(0 <= k < rows for k in p) for p in picked)
    n = requests * rows
    sd = math.sqrt(n * share * (1 - share))
    assert abs(sum(map(len, picked)) - n * share) < 4 * sd  # seeded: the same on every run
    if rows == 2:  # independently of each other: each of the 4 outcomes a quarter of requests
        for outcome in ([], [0], [1], [0, 1]):
            seen = sum(p == outcome for p in picked)
            assert abs(seen - requests / 4) < 4 * math.sqrt(requests * 3 / 16), outcome


def test_the_kept_share_moves_by_each_requests_weight_up_to_5000_rows() -> None:
    a = auditor()
    assert a.kept_share == 1.0
    a.traffic(1000, 800)  # weight 0.2
    assert a.kept_share == pytest.approx(1.0 - 0.2 * 0.2)
    a.traffic(0, 0)
    assert a.kept_share == pytest.approx(0.96)
    a.traffic(4999, 0)  # just inside the bound: most of the way
    assert a.kept_share == pytest.approx(0.96 * (1 - 4999 / 5000))
    a.traffic(5000, 5000)  # the bound: a request this large sets it
    assert a.kept_share == 1.0
    a.traffic(10_000, 2_500)  # past it: still set, never overshot
    assert a.kept_share == pytest.approx(0.25)


def test_a_verdict_comes_at_min_rows_exactly_and_not_one_row_before() -> None:
    a = auditor(min_rows=40)
    disagreeing = (np.full(39, 0.95), np.zeros(39, int), np.ones(39, int))  # expected 99%
    a.record(*disagreeing)
    state = a.state()
    assert state.rows == 39 and not state.drift and state.estimated_accuracy is None
    a.record(np.full(1, 0.95), np.zeros(1, int), np.ones(1, int))
    state = a.state()
    assert state.rows == 40 and state.drift
    assert state.estimated_accuracy == pytest.approx(0.85 - 1.0 * 0.1)  # every row costs 0.1


def test_a_confidence_on_a_bin_edge_belongs_to_the_bin_it_closes() -> None:
    a = auditor(min_rows=1)
    a.record(np.array([0.7, 0.9, 1.0]), np.zeros(3, int), np.zeros(3, int))
    assert a.state().expected == pytest.approx((0.80 + 0.95 + 0.99) / 3)
    just_above = auditor(min_rows=1)
    just_above.record(np.array([0.7001, 0.9001]), np.zeros(2, int), np.zeros(2, int))
    assert just_above.state().expected == pytest.approx((0.95 + 0.99) / 2)


def test_the_accuracy_interval_is_the_sample_standard_error_of_the_disagreements_cost() -> None:
    a = auditor(min_rows=1)
    a.traffic(5000, 4000)  # the edge answers 80%
    a.record(np.full(100, 0.65), np.zeros(100, int), np.r_[np.ones(10, int), np.zeros(90, int)])
    cost = np.r_[np.full(10, 0.3), np.zeros(90)]  # the first bin's gain where they disagree
    state = a.state()
    assert state.estimated_accuracy == pytest.approx(0.85 - 0.8 * cost.mean())
    assert state.accuracy_interval == pytest.approx(
        1.959964 * 0.8 * cost.std(ddof=1) / math.sqrt(100), rel=1e-9)


def test_the_confidence_test_sees_the_last_2000_rows_from_500_rows_on() -> None:
    rng = np.random.default_rng(7)
    recent = rng.uniform(0.5, 1.0, 2000)
    seen = auditor()
    seen.observe(rng.uniform(0.5, 0.7, 2000))  # older rows, all in the first bin
    seen.observe(recent)
    # exactly the recent rows' bins (edges 0.7, 0.9, 1.0), against the equal shares
    counts = np.bincount(np.searchsorted([0.7, 0.9, 1.0], recent), minlength=3)
    assert counts.sum() == 2000
    assert seen.state().confidence_psi == pytest.approx(psi(counts.astype(float),
                                                            np.full(3, 1 / 3)), rel=1e-12)
    few = auditor()
    few.observe(recent[:499])
    assert few.state().confidence_psi is None  # one row short of a verdict
    few.observe(recent[499:500])
    assert few.state().confidence_psi is not None
