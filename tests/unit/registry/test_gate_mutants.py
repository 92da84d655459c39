"""A wave rollout's gate as its verdict reads (``registry.releases.gate.judge``): what the wave's
edges report about the new version against what the other edges report about the previous one.
A gate **fails** (the rollout halts, the wave goes back) on installs failed on two distinct
nodes and over ``max_failures`` of the wave, agreement down by more than ``max_agreement_drop``
significantly, a drift alarm on two wave nodes and over ``max_drift_share`` more of them than of
the others, or p99 over ``max_p99_ratio`` times the previous one; it **holds** (``not-measured``
or ``undecided``) when it cannot judge, and **passes** otherwise. Each bound is tested just
inside and just outside, with the exact reason an operator reads in ``registry rollout show``
and the audit log, and the figures recorded with it."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from registry.releases import gate
from registry.releases.gate import EdgeAtGate, Verdict
from registry.releases.waves import WavePolicy

NEW, OLD = 2, 1
POLICY = WavePolicy((0.25, 1.0), min_audit_rows=100)


def node(name: str, version: int, agreement: float = 0.9, rows: int = 300, p99: float = 20.0,
         drift: bool = False, state: str = "ACTIVE", reason: str = "", connected: bool = True,
         reports: bool = True) -> EdgeAtGate:
    """An edge running ``version`` (acknowledged ``state``) whose last report is about it."""
    said = {"version": version, "requests": 10**6, "audit_rows": rows,
            "audit_agreement": agreement, "p99_ms": p99, "drift": drift,
            "confidence_drift": False}
    return EdgeAtGate(name, connected, version, state, reason,
                      json.dumps(said) if reports else None)


def wave(n: int, **kwargs: Any) -> list[EdgeAtGate]:
    return [node(f"w{i}", NEW, **kwargs) for i in range(n)]


def others(n: int, **kwargs: Any) -> list[EdgeAtGate]:
    return [node(f"o{i}", OLD, **kwargs) for i in range(n)]


def failed_install(name: str) -> EdgeAtGate:
    return EdgeAtGate(name, True, NEW, "FAILED", f"version {NEW}: bad artifact", None)


def judge(inside: list[EdgeAtGate], outside: list[EdgeAtGate],
          policy: WavePolicy = POLICY, previous: int | None = OLD,
          baseline: dict[str, Any] | None = None) -> Verdict:
    return gate.judge(policy, NEW, previous, inside, outside, baseline)


def half(new: float, rows_new: int, old: float, rows_old: int) -> float:
    """The half-width of the 95% interval of a difference of two agreement shares."""
    return 1.959964 * math.sqrt(new * (1 - new) / rows_new + old * (1 - old) / rows_old)


# -- installs ----------------------------------------------------------------------------------

def test_installs_failed_on_two_nodes_over_max_failures_halt_with_the_count_in_the_reason(
        ) -> None:
    verdict = judge([*wave(8), failed_install("w8"), failed_install("w9")], others(10))
    assert verdict.failed == ["installs: 2 of 10 connected wave nodes failed, refused or did "
                              "not answer (20% > 10%)"]
    assert {k: verdict.figures[k] for k in ("nodes", "connected", "installed", "failed",
                                            "liars")} == {
        "nodes": 10, "connected": 10, "installed": 8, "failed": 2, "liars": 1}


def test_installs_failed_on_exactly_max_failures_of_the_wave_pass() -> None:
    verdict = judge([*wave(18), failed_install("w18"), failed_install("w19")], others(10))
    assert verdict.failed == [] and verdict.hold is None
    assert verdict.figures["failed"] == 2 and verdict.figures["installed"] == 18


def test_one_failed_install_in_a_wave_of_three_of_twenty_is_one_nodes_word_and_passes() -> None:
    """33% of the wave is over max_failures, but one (possibly stolen) node cannot halt it."""
    verdict = judge([*wave(2), failed_install("w2")], others(17))
    assert verdict.failed == [] and verdict.hold is None
    assert verdict.figures["liars"] == 1 and verdict.figures["failed"] == 1


def test_in_a_two_edge_fleet_the_one_wave_nodes_failed_install_halts() -> None:
    verdict = judge([failed_install("w0")], others(1))
    assert verdict.figures["liars"] == 0
    assert verdict.failed == ["installs: 1 of 1 connected wave nodes failed, refused or did "
                              "not answer (100% > 10%)"]


def test_disconnected_wave_nodes_are_not_counted_as_failed_installs() -> None:
    verdict = judge([*wave(3), node("w3", NEW, connected=False, state="", reports=False)],
                    others(6))
    assert (verdict.figures["nodes"], verdict.figures["connected"],
            verdict.figures["failed"]) == (4, 3, 0)
    assert verdict.failed == []
    gone = judge(wave(3, connected=False), others(6))  # the whole wave went silent
    assert (gone.figures["connected"], gone.figures["failed"]) == (0, 0)
    assert not any(f.startswith("installs") for f in gone.failed)
    assert gone.hold == gate.NOT_MEASURED


# -- agreement ---------------------------------------------------------------------------------

def test_a_significant_agreement_drop_halts_with_both_sides_figures_in_the_reason() -> None:
    verdict = judge(wave(3, agreement=0.5), others(3))
    h = half(0.5, 900, 0.9, 900)
    assert verdict.failed == [f"live audit agreement 0.500 (900 rows, 3 nodes) against 0.900 "
                              f"(900 rows, 3 nodes) for version 1: down 0.400 ± {h:.3f}, more "
                              f"than 0.02"]
    assert verdict.hold is None
    assert verdict.figures["agreement_drop"] == {"drop": 0.4, "interval": round(h, 4),
                                                 "best": 0.4}


def test_agreement_two_wave_nodes_disagree_on_is_undecided_with_both_cases() -> None:
    """Two audited wave nodes at 0.5 and 0.9: either may be the liar, so the drop is between
    0 and 0.4; the gate holds rather than halting or passing."""
    inside = [node("w0", NEW, agreement=0.5), node("w1", NEW, agreement=0.9),
              node("w2", NEW, rows=0)]
    verdict = judge(inside, others(3))
    assert verdict.failed == [] and verdict.hold == gate.UNDECIDED
    assert verdict.why == ("agreement undecided: live audit agreement 0.700 (600 rows, 2 nodes) "
                           "against 0.900 (900 rows, 3 nodes) for version 1; the drop is "
                           "between 0.000 and 0.400 depending on which one node is lying")
    assert verdict.figures["agreement_drop"] == {
        "drop": 0.4, "interval": round(half(0.5, 600, 0.9, 900), 4), "best": 0.0}
    assert (verdict.figures["new"]["low"], verdict.figures["new"]["high"]) == (0.5, 0.9)


def test_a_first_release_is_not_compared_and_passes_on_installs_alone() -> None:
    verdict = judge(wave(3, agreement=0.1), [], previous=None)
    assert verdict.failed == [] and verdict.hold is None
    assert verdict.figures["agreement_drop"] == "not compared (a first release)"


def test_a_side_short_of_its_quorum_holds_not_measured_saying_what_was_needed() -> None:
    """A wave of 3 needs 2 audited nodes, 17 others need 3 (min_audit_nodes): two is short."""
    outside = [node(f"o{i}", OLD, rows=300 if i < 2 else 0) for i in range(17)]
    verdict = judge(wave(3), outside)
    why = ("agreement not measured (900 and 600 audited rows from 3 and 2 nodes; 100 rows "
           "from 2 and 3 nodes needed)")
    assert (verdict.failed, verdict.hold, verdict.why) == ([], gate.NOT_MEASURED, why)
    assert verdict.figures["agreement_drop"] == why.removeprefix("agreement ")


def test_two_other_edges_need_both_audited_and_none_reporting_holds() -> None:
    """A side of two edges: its quorum is both (a majority of two), here none audited."""
    verdict = judge(wave(3), others(2, rows=0))
    assert verdict.hold == gate.NOT_MEASURED
    assert verdict.why == ("agreement not measured (900 and 0 audited rows from 3 and 0 nodes; "
                           "100 rows from 2 and 2 nodes needed)")


def test_agreement_down_exactly_max_agreement_drop_passes_and_just_over_it_halts() -> None:
    policy = WavePolicy((0.25, 1.0), min_audit_rows=100, max_agreement_drop=0.25)
    many = 10**6  # rows enough that any drop is significant
    at = judge(wave(3, agreement=0.5, rows=many), others(3, agreement=0.75, rows=many), policy)
    assert at.failed == [] and at.hold is None
    assert at.figures["agreement_drop"]["drop"] == 0.25
    over = judge(wave(3, agreement=0.5, rows=many), others(3, agreement=0.7501, rows=many),
                 policy)
    assert len(over.failed) == 1 and ": down 0.250 ± 0.001, more than 0.25" in over.failed[0]


def test_a_significant_drop_within_max_agreement_drop_passes() -> None:
    many = 10**6
    verdict = judge(wave(3, agreement=0.885, rows=many), others(3, rows=many))
    assert verdict.failed == [] and verdict.hold is None
    assert verdict.figures["agreement_drop"]["drop"] == 0.015


def test_a_drop_over_the_bound_but_within_the_noise_of_few_rows_passes() -> None:
    """0.9 -> 0.8 on 30 rows a side: ± 0.18, no evidence the release is worse."""
    policy = WavePolicy((0.25, 1.0), min_audit_rows=30)
    verdict = judge(wave(3, agreement=0.8, rows=10), others(3, rows=10), policy)
    assert verdict.failed == [] and verdict.hold is None
    assert verdict.figures["agreement_drop"] == {
        "drop": 0.1, "interval": round(half(0.8, 30, 0.9, 30), 4), "best": 0.1}


# -- the baseline: the previous version's figures from the rollout's start ---------------------

LEGACY_BASELINE = {"nodes": 20, "audit_nodes": 3, "audit_rows": 900, "agreement": 0.9,
                   "measured": True, "drifted": 0, "drift_share": 0.0, "p99_ms": 20.0,
                   "from": "start"}
"""A baseline recorded before the bounds were kept: its median alone, no quorum."""


def test_the_last_wave_is_judged_against_a_baseline_of_before_the_bounds_were_kept() -> None:
    verdict = judge(wave(3, agreement=0.5, p99=50.0), [], baseline=LEGACY_BASELINE)
    h = half(0.5, 900, 0.9, 900)
    assert verdict.failed == [
        f"live audit agreement 0.500 (900 rows, 3 nodes) against 0.900 (900 rows, 3 nodes) for "
        f"version 1 at the rollout's start: down 0.400 ± {h:.3f}, more than 0.02",
        "latency: median p99 50.0 ms against 20.0 ms (over 2x)"]
    assert verdict.figures["previous"] == LEGACY_BASELINE
    good = judge(wave(3), [], baseline=LEGACY_BASELINE)
    assert good.failed == [] and good.hold is None


def test_a_wave_not_measured_against_an_old_baseline_says_the_quorums_it_needs() -> None:
    verdict = judge(wave(3, rows=0), [], baseline=LEGACY_BASELINE)
    assert verdict.hold == gate.NOT_MEASURED
    assert verdict.why == ("agreement not measured (0 and 900 audited rows from 0 and 3 nodes "
                           "at the rollout's start; 100 rows from 2 and 3 nodes needed)")


# -- drift and latency -------------------------------------------------------------------------

def test_a_drift_alarm_on_two_wave_nodes_over_the_share_halts() -> None:
    inside = [node(f"w{i}", NEW, drift=i < 2) for i in range(5)]
    verdict = judge(inside, others(5))
    assert verdict.failed == ["drift: 2 of 5 wave nodes report a drift alarm (40%, against 0% "
                              "of the others)"]


def test_a_drift_alarm_on_one_wave_node_is_one_nodes_word_and_passes() -> None:
    inside = [node(f"w{i}", NEW, drift=i == 0) for i in range(3)]  # 33% of the wave
    verdict = judge(inside, others(5))
    assert verdict.failed == [] and verdict.figures["new"]["drifted"] == 1


def test_drift_is_judged_against_the_others_share_exactly_at_and_just_over_the_bound() -> None:
    inside = [node(f"w{i}", NEW, drift=i < 2) for i in range(4)]  # 50%
    at = judge(inside, [node(f"o{i}", OLD, drift=i == 0) for i in range(4)])  # 25%: 0.25 more
    assert at.failed == []
    over = judge(inside, [node(f"o{i}", OLD, drift=i == 0) for i in range(5)])  # 20%: 0.30
    assert over.failed == ["drift: 2 of 4 wave nodes report a drift alarm (50%, against 20% "
                           "of the others)"]


def test_p99_exactly_max_p99_ratio_times_the_previous_passes_and_just_over_halts() -> None:
    assert judge(wave(3, p99=40.0), others(3)).failed == []
    assert judge(wave(3, p99=40.1), others(3)).failed == [
        "latency: median p99 40.1 ms against 20.0 ms (over 2x)"]


def test_p99_is_compared_with_the_slowest_of_two_others_either_may_be_lying() -> None:
    """Two others at 20 and 40 ms (median 30): 70 ms in the wave is within 2x the higher."""
    outside = [node("o0", OLD, p99=20.0), node("o1", OLD, p99=40.0)]
    assert judge(wave(3, p99=70.0), outside).failed == []
    assert judge(wave(3, p99=81.0), outside).failed == [
        "latency: median p99 81.0 ms against 30.0 ms (over 2x)"]


# -- what each edge counts as ------------------------------------------------------------------

def test_which_wave_nodes_count_as_installed_and_as_failed_for_the_version() -> None:
    def edge(version: int | None, state: str, reason: str = "") -> EdgeAtGate:
        return EdgeAtGate("e", True, version, state, reason, None)

    assert edge(2, "ACTIVE").installed(2)
    assert not edge(1, "ACTIVE").installed(2)  # still on the previous version
    assert not edge(2, "FAILED", "version 2: bad artifact").installed(2)
    assert edge(2, "FAILED", "version 2").failed(2)
    assert edge(2, "FAILED", "version 2: bad artifact").failed(2)
    assert not edge(2, "FAILED", "version 21: bad artifact").failed(2)
    assert not edge(1, "FAILED", "version 1: bad artifact").failed(2)  # an older failure
    assert not edge(2, "REFUSED", "version 2").failed(2)
    assert not edge(2, "ACTIVE", "version 2").failed(2)


def test_a_wave_nodes_report_about_the_previous_version_is_not_counted_for_the_new() -> None:
    stale = [EdgeAtGate(f"w{i}", True, NEW, "ACTIVE", "", json.dumps(
        {"version": OLD, "requests": 10**6, "audit_rows": 300, "audit_agreement": 0.2}))
        for i in range(3)]
    verdict = judge(stale, others(3))
    assert verdict.figures["new"]["audit_nodes"] == 0
    assert verdict.hold == gate.NOT_MEASURED
    assert stale[0].reporting(OLD) is not None and stale[0].reporting(NEW) is None
    assert EdgeAtGate("x", True, NEW, "ACTIVE", "", "{not json").reporting(NEW) is None
    assert node("y", NEW, connected=False).reporting(NEW) is None


@pytest.mark.parametrize(("fleet", "liars", "least"), [
    (20, 1, 3), (4, 1, 3), (3, 1, 2), (2, 0, 1), (1, 0, 1), (20, 0, 1)])
def test_the_fewest_nodes_a_wave_before_the_last_admits(fleet: int, liars: int,
                                                          least: int) -> None:
    """Three where one liar is tolerated (its median holds), leaving one edge on the previous
    version in a fleet of three; one where no liar is."""
    assert gate.least_wave(fleet, liars) == least
