"""The live audit's figures value by value (``edge.audit``): which bin a confidence falls in,
the confidence window's edge, what the quality report, the gauges and the readiness notes
carry. The tests that kill `make mutate`'s mutants the older tests let through."""

from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np
import pytest

from edge.audit import CONFIDENCE_MIN_ROWS, CONFIDENCE_WINDOW, Auditor
from edge.pipeline import EdgeService
from serving.release.manifest import AgreementBin, Calibration
from serving.telemetry.quality import psi
from tests.unit.edge.test_pipeline import center_answering, edge
from tests.unit.serving.test_store import manifest as store_manifest

BINS = [AgreementBin(0.7, 100, 0.80, 0.3), AgreementBin(0.9, 100, 0.95, 0.2),
        AgreementBin(1.0, 100, 0.99, 0.1)]
CALIBRATION = Calibration("labelled", 0.7, center_accuracy=0.85, agreement=BINS)
THIRDS = np.array([1 / 3, 1 / 3, 1 / 3])


def auditor(calibration: Calibration = CALIBRATION) -> Auditor:
    return Auditor(calibration, share=1.0, window=500, drift_z=3.0, min_rows=10, seed=0)


def test_a_confidence_on_a_bins_edge_is_in_that_bin_and_above_the_last_in_the_last() -> None:
    a = auditor()
    a.observe(np.r_[np.full(200, 0.7), np.full(150, 0.9), np.full(150, 1.5)])
    assert a.state().confidence_psi == pytest.approx(psi(np.array([200, 150, 150]), THIRDS),
                                                     rel=1e-12)


def test_the_confidence_test_looks_at_exactly_the_last_2000_rows() -> None:
    a = auditor()
    a.observe(np.full(CONFIDENCE_WINDOW, 0.5))
    a.observe(np.full(500, 0.95))
    assert a.state().confidence_psi == pytest.approx(psi(np.array([1500, 0, 500]), THIRDS),
                                                     rel=1e-12)
    a.observe(np.full(1500, 0.8))
    assert a.state().confidence_psi == pytest.approx(psi(np.array([0, 1500, 500]), THIRDS),
                                                     rel=1e-12)


def test_a_verdict_needs_500_rows_just_inside_and_outside() -> None:
    a = auditor()
    a.observe(np.full(CONFIDENCE_MIN_ROWS - 1, 0.95))
    assert a.state().confidence_psi is None and not a.state().confidence_drift
    a.observe(np.array([0.95]))
    state = a.state()
    assert state.confidence_psi == pytest.approx(psi(np.array([0, 0, 500]), THIRDS))
    assert state.confidence_drift


def test_without_the_calibrations_bins_nothing_is_observed() -> None:
    bare = auditor(Calibration("default", 0.9))
    bare.observe(np.full(600, 0.95))
    bare.observe(np.array([]))
    assert bare.state().confidence_psi is None


def service(tmp_path: Path) -> tuple[EdgeService, Auditor]:
    s = edge(tmp_path, center_answering([]), audit_share=1.0, audit_min_rows=20)
    manifest = msgspec.structs.replace(store_manifest(3), calibration=CALIBRATION)
    return s, s.audit.auditor(manifest)


def gauge(s: EdgeService, name: str) -> float | None:
    return s.metrics.registry.get_sample_value(name, {"model": "sentiment", "version": "3"})


def test_the_report_carries_the_confidence_test_alone_before_any_row_is_audited(
        tmp_path: Path) -> None:
    s, a = service(tmp_path)
    assert s.audit.report("sentiment", 3) == {}
    assert s.audit.report("sentiment", 4) == {}  # another version: no auditor
    a.observe(np.full(600, 0.95))
    shift = psi(np.array([0, 0, 600]), THIRDS)
    assert s.audit.report("sentiment", 3) == {"confidence_psi": pytest.approx(shift),
                                              "confidence_drift": True}
    assert gauge(s, "edge_confidence_psi") == pytest.approx(shift)
    assert gauge(s, "edge_confidence_drift") == 1.0


def test_the_report_of_audited_rows_has_every_figure_and_the_notes_say_only_alarms(
        tmp_path: Path) -> None:
    s, a = service(tmp_path)
    a.kept_share = 0.5
    a.record(np.full(40, 0.95), np.zeros(40, int), np.zeros(40, int))  # all agree
    state = a.state()
    assert s.audit.report("sentiment", 3) == {
        "audit_rows": 40, "audit_agreement": 1.0, "audit_interval": state.interval,
        "drift": False, "audit_expected": pytest.approx(0.99),
        "estimated_accuracy": pytest.approx(0.85), "accuracy_interval": 0.0}
    assert state.interval > 0
    a.observe(np.r_[np.full(200, 0.5), np.full(200, 0.8), np.full(200, 0.95)])
    assert s.notes() == []  # measured, no alarm of either kind
    a.observe(np.full(1400, 0.95))
    (note,) = s.notes()
    assert note == (f"drift: sentiment v3 edge confidences moved from the calibration split's "
                    f"(PSI {psi(np.array([200, 200, 1600]), THIRDS):.2f} over the last rows)")


def test_a_release_without_bins_reports_agreement_but_no_expectation(tmp_path: Path) -> None:
    s = edge(tmp_path, center_answering([]), audit_share=1.0, audit_min_rows=20)
    a = s.audit.auditor(store_manifest(3))
    a.record(np.full(30, 0.95), np.zeros(30, int), np.r_[np.zeros(15, int), np.ones(15, int)])
    report = s.audit.report("sentiment", 3)
    assert report == {"audit_rows": 30, "audit_agreement": 0.5,
                      "audit_interval": a.state().interval, "drift": False}
    assert s.notes() == []


def test_an_empty_window_says_zero_of_everything_and_no_alarm() -> None:
    from edge.audit import AuditState

    assert auditor().state() == AuditState(0, 0.0, 0.0, None, False, None, 0.0, None, False)


def test_drift_needs_min_rows_just_inside_and_outside_and_the_interval_is_the_samples() -> None:
    from edge.audit import Z95, wilson

    a = Auditor(CALIBRATION, share=1.0, window=500, drift_z=3.0, min_rows=40, seed=0)
    a.kept_share = 0.5
    disagree = np.r_[np.ones(20, int), np.zeros(19, int)]  # 19 of 39 agree where 99% expected
    a.record(np.full(39, 0.95), np.zeros(39, int), disagree)
    state = a.state()
    assert (state.rows, state.drift, state.estimated_accuracy) == (39, False, None)
    assert state.agreement == pytest.approx(19 / 39)
    assert state.interval == pytest.approx(wilson(19, 39))
    a.record(np.array([0.95]), np.zeros(1, int), np.zeros(1, int))  # the 40th row agrees
    state = a.state()
    assert state.drift and state.expected == pytest.approx(0.99)
    cost = np.r_[np.full(20, 0.1), np.zeros(20)]  # gain 0.1 where they disagree
    assert state.estimated_accuracy == pytest.approx(0.85 - 0.5 * cost.mean())
    assert state.accuracy_interval == pytest.approx(Z95 * 0.5 * cost.std(ddof=1) / np.sqrt(40))


def test_the_kept_share_moves_by_each_requests_weight() -> None:
    a = auditor()
    a.traffic(0, 0)
    assert a.kept_share == 1.0
    a.traffic(2500, 0)  # half the weight of a full 5,000-row window
    assert a.kept_share == pytest.approx(0.5)
    a.traffic(10_000, 10_000)  # weighs at most 1
    assert a.kept_share == 1.0
