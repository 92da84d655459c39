"""What a wave gate takes from the nodes' reports (``registry.releases.evidence``), figure by
figure, as the rollout's figures and its audit record show them: how many liars a fleet
withstands, each side's quorum, the bounds of its true figure, each node's bounded and counted
rows and its weight. The tests that kill `make mutate`'s mutants the older tests let through."""

from __future__ import annotations

import math
from typing import Any

import pytest

from registry.releases import evidence
from registry.releases.evidence import MAX_AUDIT_ROWS, MAX_LISTED, MAX_REQUEST_ROWS, Side


@pytest.mark.parametrize(("fleet", "min_nodes", "liars"), [
    (1, 3, 0), (2, 3, 0), (3, 3, 1), (20, 3, 1),  # one liar from 3 edges on
    (3, 1, 0), (20, 1, 0), (3, 2, 1)])  # none where the policy asks for one node's word
def test_one_liar_is_tolerated_from_three_edges_unless_one_nodes_word_is_asked_for(
        fleet: int, min_nodes: int, liars: int) -> None:
    assert evidence.tolerated(fleet, min_nodes) == liars


@pytest.mark.parametrize(("side", "min_nodes", "liars", "needed"), [
    (17, 3, 1, 3),  # min_audit_nodes, fewer than a majority
    (3, 3, 1, 2), (4, 3, 0, 3), (5, 5, 0, 3), (6, 5, 0, 4),  # a majority of the side
    (1, 3, 0, 1), (1, 3, 1, 2), (2, 1, 1, 2)])  # never fewer than one honest node's figure
def test_a_sides_quorum_is_the_fewer_of_min_nodes_and_a_majority_but_one_more_than_the_liars(
        side: int, min_nodes: int, liars: int, needed: int) -> None:
    assert evidence.quorum(side, min_nodes, liars) == needed


def test_a_sides_true_figure_lies_within_bounds_whatever_one_liar_says() -> None:
    assert evidence.bounds([], 0) is None
    assert evidence.bounds([0.3], 1) is None  # the one node may be the liar
    assert evidence.bounds([0.3], 0) == (0.3, 0.3)
    assert evidence.bounds([0.3, 0.5], 1) == (0.3, 0.5)  # either may be the liar
    assert evidence.bounds([0.5, 0.3], 1) == (0.3, 0.5)
    assert evidence.bounds([0.3, 0.5], 0) == (0.4, 0.4)  # no liar: their median
    assert evidence.bounds([0.1, 0.5, 0.3], 1) == (0.3, 0.3)  # three: the median holds


@pytest.mark.parametrize(("value", "read"), [
    (7, 7.0), (2.5, 2.5), (-3, -3.0), (float("nan"), 0.0), (float("inf"), 0.0),
    (float("-inf"), 0.0), ("5", 0.0), (None, 0.0), ([1], 0.0)])
def test_a_reports_figure_counts_only_as_a_finite_number(value: Any, read: float) -> None:
    assert evidence.number(value) == read


def test_a_nodes_audit_keeps_its_claim_agreement_and_the_rows_that_count() -> None:
    audit = evidence.audit_of("edge-1", {"requests": 10, "audit_rows": 5000,
                                         "audit_agreement": 0.75})
    assert audit == evidence.AuditFigures("edge-1", 10 * MAX_REQUEST_ROWS, 5000, 0.75)
    assert evidence.audit_of("edge-1", {"requests": 10, "audit_rows": 12.9,
                                        "audit_agreement": 1}) == \
        evidence.AuditFigures("edge-1", 12, 12, 1.0)
    huge = evidence.audit_of("edge-1", {"requests": 10**20, "audit_rows": 10**30,
                                        "audit_agreement": 0.5})
    assert huge is not None and (huge.rows, huge.claimed) == (MAX_AUDIT_ROWS, 2**63 - 1)


@pytest.mark.parametrize(("report", "rows"), [
    ({"audit_rows": 1}, 1), ({"audit_rows": 0.9}, None), ({"audit_rows": 0}, None),
    ({"audit_rows": -5}, None), ({"audit_rows": "100"}, None), ({"audit_rows": None}, None),
    ({"requests": 0}, None), ({"requests": "1"}, None),
    ({"audit_agreement": 0}, 10), ({"audit_agreement": 1.0}, 10),
    ({"audit_agreement": -0.0001}, None), ({"audit_agreement": 1.0001}, None),
    ({"audit_agreement": None}, None), ({"audit_agreement": "0.9"}, None)])
def test_a_node_counts_in_the_audit_only_with_rows_and_an_agreement_in_zero_to_one(
        report: dict[str, Any], rows: int | None) -> None:
    audit = evidence.audit_of("e", {"requests": 1, "audit_rows": 10, "audit_agreement": 0.5}
                              | report)
    assert (audit.rows if audit is not None else None) == rows


def reported(**figures: Any) -> dict[str, Any]:
    return {"requests": 10, "audit_rows": 100, "audit_agreement": 0.5} | figures


def test_a_side_counts_true_drift_alarms_and_the_p99s_of_nodes_that_served() -> None:
    side = Side()
    side.add("a", reported(drift=True, p99_ms=12.5))
    side.add("b", reported(confidence_drift=True, p99_ms=0, audit_rows=0))
    side.add("c", reported(drift="true", confidence_drift=1, p99_ms=30, requests=0))
    side.add("d", reported(drift=False, p99_ms=float("nan")))
    side.add("e", reported(p99_ms=40))
    side.add("f", reported(p99_ms=0.5, requests=1))  # one request, answered fast
    assert side.nodes == 6 and side.drifted == 2
    assert side.p99s == [12.5, 40.0, 0.5]
    assert [a.node_id for a in side.audits] == ["a", "d", "e", "f"]
    assert side.figures(3, 100, 1)["drift_share"] == 0.3333  # 2 of 6


def test_a_nodes_weight_is_at_most_the_lower_median_nodes_rows() -> None:
    assert Side().weights() == {}
    side = Side()
    for node, rows in (("a", 300), ("b", 100), ("c", 10**5), ("d", 200)):
        side.add(node, {"requests": 10**6, "audit_rows": rows, "audit_agreement": 0.5})
    assert side.weights() == {"a": 200, "b": 100, "c": 200, "d": 200}


def three_nodes() -> Side:
    side = Side()
    side.add("b", {"requests": 10, "audit_rows": 1000, "audit_agreement": 0.91234567,
                   "drift": True, "p99_ms": 20.12345})
    side.add("a", {"requests": 10, "audit_rows": 5000, "audit_agreement": 0.81234567,
                   "confidence_drift": True, "p99_ms": 10.12345})
    side.add("c", {"requests": 1, "audit_rows": 100, "audit_agreement": 0.71234567,
                   "p99_ms": 30.12345})
    side.add("d", {"requests": 0, "p99_ms": 50})  # connected, served nothing
    return side


def test_a_sides_figures_list_each_nodes_claimed_bounded_and_counted_rows_and_weight() -> None:
    assert three_nodes().figures(3, 2100, 1) == {
        "nodes": 4, "audit_nodes": 3, "audit_rows": 2100, "agreement": 0.8123, "quorum": 3,
        "measured": True, "low": 0.8123, "high": 0.8123,
        "weights": [
            {"node": "a", "claimed": 5000, "rows": 2560, "counted": 1000, "agreement": 0.8123,
             "weight": 0.4762},
            {"node": "b", "claimed": 1000, "rows": 1000, "counted": 1000, "agreement": 0.9123,
             "weight": 0.4762},
            {"node": "c", "claimed": 100, "rows": 100, "counted": 100, "agreement": 0.7123,
             "weight": 0.0476}],
        "drifted": 2, "drift_share": 0.5, "p99_ms": 20.123, "p99_low": 20.123,
        "p99_high": 20.123}


def test_a_side_is_measured_only_at_its_quorum_and_min_rows() -> None:
    side = three_nodes()
    assert side.figures(3, 2100, 1)["measured"] is True
    assert side.figures(4, 2100, 1)["measured"] is False  # one node short of the quorum
    assert side.figures(3, 2101, 1)["measured"] is False  # one row short
    assert side.figures(2, 10, 0)["quorum"] == 2


def test_with_one_liar_two_nodes_figures_span_both_and_one_node_is_never_measured() -> None:
    side = Side()
    side.add("a", {"requests": 10, "audit_rows": 100, "audit_agreement": 0.71234567,
                   "p99_ms": 10.12345})
    single = side.figures(1, 100, 1)
    assert (single["measured"], single["low"], single["high"]) == (False, None, None)
    assert (single["p99_ms"], single["p99_low"], single["p99_high"]) == (10.123, None, None)
    assert side.figures(1, 100, 0)["measured"] is True  # no liar: its word is the figure
    side.add("b", {"requests": 10, "audit_rows": 300, "audit_agreement": 0.91234567,
                   "p99_ms": 30.12345})
    two = side.figures(2, 200, 1)
    assert (two["agreement"], two["low"], two["high"]) == (0.8123, 0.7123, 0.9123)
    assert (two["p99_ms"], two["p99_low"], two["p99_high"]) == (20.123, 10.123, 30.123)
    assert two["measured"] is True and two["audit_rows"] == 200
    assert [(w["node"], w["weight"]) for w in two["weights"]] == [("a", 0.5), ("b", 0.5)]


def test_a_side_nobody_audited_has_no_figures_and_is_not_measured() -> None:
    assert Side().figures(0, 0, 0) == {
        "nodes": 0, "audit_nodes": 0, "audit_rows": 0, "agreement": None, "quorum": 0,
        "measured": False, "low": None, "high": None, "weights": [], "drifted": 0,
        "drift_share": None, "p99_ms": None, "p99_low": None, "p99_high": None}
    side = Side()
    side.add("a", {"drift": True})
    assert side.figures(0, 0, 0)["drift_share"] == 1.0


def test_the_heaviest_nodes_are_listed_by_name_ties_by_name_the_rest_counted() -> None:
    side = Side()
    for i in range(MAX_LISTED + 1):
        side.add(f"n{i:02d}", {"requests": 10, "audit_rows": 100, "audit_agreement": 0.5})
    side.add("light", {"requests": 10, "audit_rows": 1, "audit_agreement": 0.5})
    figures = side.figures(3, 100, 1)
    assert [w["node"] for w in figures["weights"]] == [f"n{i:02d}" for i in range(MAX_LISTED)]
    assert figures["audit_nodes"] == MAX_LISTED + 2
    assert figures["audit_rows"] == (MAX_LISTED + 1) * 100 + 1
    assert math.isclose(sum(w["weight"] for w in figures["weights"]), 50 * 100 / 5101,
                        abs_tol=1e-3)
