"""The live audit's figures value by value (``edge.audit``): which bin a confidence falls in,
the confidence window's edge, what the quality report, the gauges and the readiness notes
carry. The tests that kill `make mutate`'s mutants the older tests let through."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import msgspec
import numpy as np
import pytest

from edge.audit import CONFIDENCE_MIN_ROWS, CONFIDENCE_WINDOW, Auditor
from edge.pipeline import EdgeService
from serving.protocol import v2
from serving.release.manifest import AgreementBin, Calibration
from serving.runtime.repository import Resident
from serving.telemetry.quality import psi
from tests.codecs import received, text_codec
from tests.unit.edge.test_pipeline import (
    SURE,
    UNSURE,
    FixedBatcher,
    Handler,
    center_answering,
    edge,
    outputs,
    tagged,
)
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


def test_an_interval_with_no_agreement_at_all_still_reaches_wilsons_bound() -> None:
    """Wilson's half-width at p = 0 is (z^2 / 2n) / (1 + z^2 / n): 0/10 agreeing rows read
    "0% ± 13.9%", not "0% ± 0%"."""
    from edge.audit import Z95, wilson

    assert wilson(0, 10) == pytest.approx(Z95 ** 2 / 20 / (1 + Z95 ** 2 / 10), rel=1e-12)
    assert wilson(0, 10) == pytest.approx(0.13877, abs=1e-5)


def test_a_release_without_bins_reports_its_interval_and_no_accuracy_estimate(
        tmp_path: Path) -> None:
    from edge.audit import AuditState

    s = edge(tmp_path, center_answering([]), audit_share=1.0, audit_min_rows=20)
    a = s.audit.auditor(store_manifest(3))
    a.record(np.full(30, 0.95), np.zeros(30, int), np.r_[np.zeros(15, int), np.ones(15, int)])
    assert s.audit.report("sentiment", 3)["audit_interval"] == pytest.approx(0.16846, abs=1e-5)
    interval = a.state().interval
    assert interval == pytest.approx(0.16846, abs=1e-5)
    assert a.state() == AuditState(30, 0.5, interval, None, False, None, 0.0, None, False)


def confidences(auditor: Auditor, counts: list[int]) -> None:
    """Rows reaching the gate, ``counts[i]`` of them in bin i of ``BINS``."""
    auditor.observe(np.concatenate([np.full(c, le) for c, le in
                                    zip(counts, [0.5, 0.8, 0.95], strict=True)]))


def floor_auditor(psi_floor: float) -> Auditor:
    return Auditor(CALIBRATION, share=1.0, window=500, drift_z=3.0, min_rows=10,
                   psi_floor=psi_floor, seed=0)


def test_confidence_drift_needs_the_chi_square_test_of_two_degrees_of_freedom() -> None:
    """Three bins: two degrees of freedom, critical value 14.13 at p = 0.001 (11.16 for one,
    16.55 for three). 600 rows, 200 expected per bin: [240, 180, 180] is chi-square 12,
    [240, 160, 200] is 16; both shifts are material at a PSI floor of 0.01."""
    from edge.audit import chi2_critical

    assert chi2_critical(1) < 12 < chi2_critical(2) < 16 < chi2_critical(3)
    under = floor_auditor(0.01)
    confidences(under, [240, 180, 180])
    state = under.state()
    assert state.confidence_psi == pytest.approx(psi(np.array([240, 180, 180]), THIRDS))
    assert state.confidence_psi is not None and state.confidence_psi > 0.01
    assert not state.confidence_drift  # chance, not a shift
    over = floor_auditor(0.01)
    confidences(over, [240, 160, 200])
    assert over.state().confidence_drift


def test_confidence_drift_needs_a_material_shift_as_well_as_a_significant_one() -> None:
    """2,000 rows of [800, 600, 600]: chi-square 40 (significant) but PSI 0.019 (< 0.05)."""
    a = floor_auditor(0.05)
    confidences(a, [800, 600, 600])
    state = a.state()
    assert state.confidence_psi == pytest.approx(0.019179, abs=1e-6)
    assert not state.confidence_drift


def test_a_confidence_shift_exactly_at_the_psi_floor_is_material() -> None:
    counts = [240, 160, 200]
    at = floor_auditor(psi(np.array(counts, float), THIRDS))
    confidences(at, counts)
    assert at.state().confidence_drift
    above = floor_auditor(psi(np.array(counts, float), THIRDS) * 1.0001)
    confidences(above, counts)
    assert not above.state().confidence_drift


def test_a_calibration_of_two_bins_gets_a_confidence_verdict() -> None:
    two = Calibration("labelled", 0.7, center_accuracy=0.85, agreement=BINS[1:])
    a = auditor(two)
    a.observe(np.full(CONFIDENCE_MIN_ROWS, 0.95))
    state = a.state()
    assert state.confidence_psi == pytest.approx(psi(np.array([0, 500]), np.array([0.5, 0.5])))
    assert state.confidence_drift


def halves(rows: int) -> Auditor:
    """An auditor whose one bin predicts agreement 0.5: ``rows`` rows' variance is rows / 4."""
    calibration = Calibration("labelled", 0.7, center_accuracy=0.85,
                              agreement=[AgreementBin(1.0, 100, 0.5, 0.2)])
    return Auditor(calibration, share=1.0, window=500, drift_z=3.0, min_rows=10, seed=0)


def test_drift_is_a_shortfall_of_more_than_drift_z_deviations_just_inside_and_outside() -> None:
    """36 rows expected to agree half the time: 18 expected, standard deviation 3. 9 agreeing is
    exactly 3 deviations short (not yet drift); 8 is 3.3 short."""
    at = halves(36)
    at.record(np.full(36, 0.95), np.zeros(36, int), np.r_[np.zeros(9, int), np.ones(27, int)])
    assert not at.state().drift
    beyond = halves(36)
    beyond.record(np.full(36, 0.95), np.zeros(36, int), np.r_[np.zeros(8, int), np.ones(28, int)])
    assert beyond.state().drift


def test_a_bin_the_calibration_calls_certain_gives_a_state_not_a_division_by_zero() -> None:
    """A hand-written manifest may say a bin always agrees (calibrate never does: Laplace's
    rule): the agreement's variance is 0, and the state is still answered."""
    certain = Calibration("labelled", 0.7, center_accuracy=0.85,
                          agreement=[AgreementBin(1.0, 100, 1.0, 0.2)])
    a = Auditor(certain, share=1.0, window=500, drift_z=3.0, min_rows=10, seed=0)
    a.record(np.full(20, 0.95), np.zeros(20, int), np.r_[np.zeros(10, int), np.ones(10, int)])
    state = a.state()
    assert (state.rows, state.agreement, state.expected) == (20, 0.5, 1.0)


def test_the_accuracy_interval_of_one_audited_row_is_zero_and_of_two_the_samples() -> None:
    from edge.audit import Z95

    one = Auditor(CALIBRATION, share=1.0, window=500, drift_z=3.0, min_rows=1, seed=0)
    one.record(np.array([0.95]), np.zeros(1, int), np.ones(1, int))  # disagrees, gain 0.1
    state = one.state()
    assert state.estimated_accuracy == pytest.approx(0.85 - 0.1)
    assert state.accuracy_interval == 0.0
    two = Auditor(CALIBRATION, share=1.0, window=500, drift_z=3.0, min_rows=1, seed=0)
    two.record(np.full(2, 0.95), np.zeros(2, int), np.array([1, 0]))
    state = two.state()
    assert state.estimated_accuracy == pytest.approx(0.85 - 0.05)
    assert state.accuracy_interval == pytest.approx(Z95 * np.std([0.1, 0.0], ddof=1) / np.sqrt(2))


def test_the_window_keeps_the_last_audited_rows_and_the_count_all_of_them() -> None:
    a = Auditor(CALIBRATION, share=1.0, window=3, drift_z=3.0, min_rows=1, seed=0)
    assert a.audited == 0
    a.record(np.full(5, 0.95), np.zeros(5, int), np.array([1, 1, 0, 0, 1]))
    state = a.state()
    assert (state.rows, a.audited) == (3, 5)
    assert state.agreement == pytest.approx(2 / 3)  # rows 2, 3, 4


def test_a_record_whose_answers_and_confidences_differ_in_length_is_refused() -> None:
    with pytest.raises(ValueError, match="zip"):
        auditor().record(np.full(3, 0.95), np.zeros(2, int), np.zeros(2, int))


def test_a_seeded_auditor_picks_the_same_rows_and_share_one_picks_every_row() -> None:
    def picks(seed: int) -> list[list[int]]:
        a = Auditor(CALIBRATION, share=0.3, window=500, drift_z=3.0, min_rows=10, seed=seed)
        return [a.pick(10) for _ in range(20)]

    assert picks(5) == picks(5) and picks(5) != picks(6)
    assert auditor().pick(4) == [0, 1, 2, 3] and auditor().pick(0) == []


CALIBRATED = msgspec.structs.replace(store_manifest(3), calibration=Calibration(
    "labelled", 0.9, center_accuracy=0.85, agreement=BINS))


def center_agreeing_on(agree: set[int], paths: list[str]) -> Handler:
    """A center answering ``pos`` (the edge's answer for a SURE row) with 0.8 for the rows whose
    tag is in ``agree``, ``neg`` with 0.8 for the others; records each call's path and tags."""

    def handle(request: httpx.Request) -> httpx.Response:
        ids = received(request.content, request.headers.get(v2.HEADER_LENGTH))["inputs"][0]
        tags = [int(ids["data"][k * ids["shape"][1] + 1]) - 100 for k in range(ids["shape"][0])]
        paths.append(f"{request.url.path} {tags}")
        data = [p for tag in tags for p in ((0.2, 0.8) if tag in agree else (0.8, 0.2))]
        return httpx.Response(200, json={"model_name": "sentiment", "model_version": "9",
                                         "outputs": [{"name": "probabilities", "datatype": "FP32",
                                                      "shape": [len(tags), 2], "data": data}]})

    return handle


def test_each_audit_answer_moves_the_models_gauges(tmp_path: Path) -> None:
    """Every row the edge keeps is audited (share 1): 4 rows all agreeing, then 4 none do. The
    edge's rows are confident (0.998: the last bin, agreement 0.99, gain 0.1)."""
    paths: list[str] = []
    s = edge(tmp_path, center_agreeing_on({0, 1, 2, 3}, paths), audit_share=1.0,
             audit_min_rows=4)
    r = Resident(CALIBRATED, runtime=None, batcher=FixedBatcher(),  # type: ignore[arg-type]
                 codec=text_codec())
    confidences(s.audit.auditor(CALIBRATED), [200, 200, 200])  # like the calibration split

    async def scenario() -> list[dict[str, float | None]]:
        seen = []
        for tags in ([0, 1, 2, 3], [4, 5, 6, 7]):
            answer = await s.infer(r, tagged(*[(SURE, t) for t in tags]))
            assert outputs(answer)["tier"] == ["edge"] * 4
            await asyncio.sleep(0.2)  # the audit's call, answered at once
            seen.append({name: gauge(s, name) for name in (
                "edge_audit_rows_total", "edge_audit_agreement",
                "edge_audit_expected_agreement", "edge_audit_drift", "edge_estimated_accuracy",
                "edge_confidence_psi", "edge_confidence_drift")})
        await s.stop()
        return seen

    first, second = asyncio.run(scenario())
    assert paths == ["/v2/models/sentiment/infer [0, 1, 2, 3]",
                     "/v2/models/sentiment/infer [4, 5, 6, 7]"]
    assert first == {"edge_audit_rows_total": 4.0, "edge_audit_agreement": 1.0,
                     "edge_audit_expected_agreement": pytest.approx(0.99),
                     "edge_audit_drift": 0.0, "edge_estimated_accuracy": pytest.approx(0.85),
                     "edge_confidence_psi": 0.0, "edge_confidence_drift": 0.0}
    # 4 of 8 agree where 7.92 are expected: drift; accuracy 0.85 - 1.0 x mean cost 0.05
    assert second == {**first, "edge_audit_rows_total": 8.0, "edge_audit_agreement": 0.5,
                      "edge_audit_drift": 1.0, "edge_estimated_accuracy": pytest.approx(0.8)}


def test_the_kept_share_counts_every_row_but_the_centers(tmp_path: Path) -> None:
    s = edge(tmp_path, center_answering([]), audit_share=1.0)
    r = Resident(CALIBRATED, runtime=None, batcher=FixedBatcher(),  # type: ignore[arg-type]
                 codec=text_codec())

    async def scenario() -> None:
        await s.infer(r, tagged((SURE, 0), (UNSURE, 1), (SURE, 2), (SURE, 3), (SURE, 4)))
        await asyncio.sleep(0.2)
        await s.stop()

    asyncio.run(scenario())
    a = s.audit.auditors[("sentiment", 3)]
    assert a.kept_share == pytest.approx(1 + 5 / 5000 * (4 / 5 - 1))  # 4 of 5 at the edge
    assert a.audited == 4  # the rows the gate kept, not the escalated one


def test_the_edges_audit_settings_reach_each_models_auditor_and_a_new_version_replaces_its_own(
        tmp_path: Path) -> None:
    s = edge(tmp_path, center_answering([]), audit_share=0.25, audit_window=10,
             audit_min_rows=7, drift_z=2.5, drift_psi=0.07)
    a = s.audit.auditor(CALIBRATED)
    assert (a.share, a.drift_z, a.min_rows, a.psi_floor) == (0.25, 2.5, 7, 0.07)
    a.record(np.full(12, 0.95), np.zeros(12, int), np.zeros(12, int))
    assert s.audit.report("sentiment", 3)["audit_rows"] == 10  # the window
    assert s.audit.auditor(CALIBRATED) is a
    other = msgspec.structs.replace(CALIBRATED, name="other")
    kept = s.audit.auditor(other)
    newer = s.audit.auditor(msgspec.structs.replace(CALIBRATED, version=4))
    assert newer is not a and s.audit.report("sentiment", 3) == {}
    assert sorted(s.audit.auditors) == [("other", 3), ("sentiment", 4)]
    assert s.audit.auditor(other) is kept


def test_stopping_the_edge_waits_for_the_audit_calls_in_flight_to_end(tmp_path: Path) -> None:
    ended: list[str] = []

    async def stuck(request: httpx.Request) -> httpx.Response:
        try:
            await asyncio.Event().wait()
        finally:
            ended.append(request.url.path)
        raise AssertionError("unreachable")

    s = edge(tmp_path, stuck, audit_share=1.0, center_timeout_s=30)  # type: ignore[arg-type]
    r = Resident(CALIBRATED, runtime=None, batcher=FixedBatcher(),  # type: ignore[arg-type]
                 codec=text_codec())

    async def scenario() -> list[str]:
        await s.infer(r, tagged((SURE, 0)))
        await asyncio.sleep(0.2)  # the audit's call reached the center
        await s.audit.stop()
        return list(ended)

    assert asyncio.run(scenario()) == ["/v2/models/sentiment/infer"]


class EvenPositive(FixedBatcher):
    """The edge model answering ``pos`` for rows of an even tag and ``neg`` for odd ones, each
    with 0.953 (confident: kept at the edge)."""

    async def submit(self, rows: list[np.ndarray]) -> np.ndarray:
        self.batches.append([int(r[1]) - 100 for r in rows])
        return self.finish(np.asarray([[0.0, 3.0] if int(r[1]) % 2 == 0 else [3.0, 0.0]
                                       for r in rows], dtype=np.float32))


def test_the_audit_compares_each_rows_own_edge_answer_with_the_centers(tmp_path: Path) -> None:
    """The edge says pos, neg, pos, neg; the center pos for row 0, neg for the others: they
    agree on rows 0, 1 and 3."""
    paths: list[str] = []
    s = edge(tmp_path, center_agreeing_on({0}, paths), audit_share=1.0)
    r = Resident(CALIBRATED, runtime=None, batcher=EvenPositive(),  # type: ignore[arg-type]
                 codec=text_codec())

    async def scenario() -> list[str]:
        answer = await s.infer(r, tagged(*[(SURE, t) for t in range(4)]))
        await asyncio.sleep(0.2)
        await s.stop()
        return outputs(answer)["label"]

    assert asyncio.run(scenario()) == ["pos", "neg", "pos", "neg"]
    assert paths == ["/v2/models/sentiment/infer [0, 1, 2, 3]"]
    assert gauge(s, "edge_audit_agreement") == 0.75


def test_the_report_carries_the_confidence_test_and_the_audit_together(tmp_path: Path) -> None:
    s, a = service(tmp_path)
    confidences(a, [200, 200, 200])
    a.record(np.full(40, 0.95), np.zeros(40, int), np.zeros(40, int))
    report = s.audit.report("sentiment", 3)
    assert report["confidence_psi"] == 0.0 and report["confidence_drift"] is False
    assert (report["audit_rows"], report["audit_agreement"], report["drift"]) == (40, 1.0, False)
    assert report["estimated_accuracy"] == pytest.approx(0.85)


def test_a_finished_audit_makes_room_for_the_next_one(tmp_path: Path) -> None:
    """One audit at a time: each request's audit is answered before the next request, so every
    request's rows are audited."""
    paths: list[str] = []
    s = edge(tmp_path, center_agreeing_on(set(), paths), audit_share=1.0, audit_in_flight=1)
    r = Resident(CALIBRATED, runtime=None, batcher=FixedBatcher(),  # type: ignore[arg-type]
                 codec=text_codec())

    async def scenario() -> None:
        for tag in range(3):
            await s.infer(r, tagged((SURE, tag)))
            await asyncio.sleep(0.1)
        await s.stop()

    asyncio.run(scenario())
    assert paths == [f"/v2/models/sentiment/infer [{tag}]" for tag in range(3)]
