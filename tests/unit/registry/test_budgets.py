"""Escalation budgets: the centers' capacity split over the edges, and the audited policy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from registry.errors import RegistryError
from registry.fleet import budgets
from registry.fleet.budgets import CascadePolicy, LastReport, changed, split
from registry.releases import evidence
from registry.releases.catalog import Catalog
from registry.store import chain
from registry.store.db import connect
from serving.protocol.budget import Budget


def seen(node: str, tier: str, rows_per_s: float = 0.0, capacity: float = 0.0,
         at: float = 100.0) -> LastReport:
    return LastReport(node, tier, at, rows_per_s, capacity)


def test_capacity_is_summed_and_split_by_traffic() -> None:
    # (e1 has twice the median of the others' traffic: the most that counts as said)
    nodes = [seen("c1", "center", capacity=40), seen("c2", "center", capacity=20),
             seen("e1", "edge", 300), seen("e2", "edge", 100), seen("e3", "edge", 200)]
    out = split(CascadePolicy(), nodes, now=101, stale_s=30)
    assert sum(b.rows_per_s for b in out.values()) == pytest.approx(60)
    assert 2.7 < out["e1"].rows_per_s / out["e2"].rows_per_s < 3  # 3:1, an idle share aside
    assert out["e1"].controlled and out["e1"].capacity_rows_s == 60


def test_an_idle_edge_gets_a_little_budget_not_none() -> None:
    out = split(CascadePolicy(), [seen("c", "center", capacity=50), seen("busy", "edge", 200),
                           seen("idle", "edge", 0)], now=100, stale_s=30)
    assert 0 < out["idle"].rows_per_s < 0.1 * out["busy"].rows_per_s


def test_equal_split_static_mode_and_operator_capacity() -> None:
    nodes = [seen("c", "center", capacity=40), seen("e1", "edge", 300), seen("e2", "edge", 10)]
    equal = split(CascadePolicy(split="equal"), nodes, now=100, stale_s=30)
    assert equal["e1"].rows_per_s == equal["e2"].rows_per_s == 20
    static = split(CascadePolicy(mode="static"), nodes, now=100, stale_s=30)
    assert static == {"e1": Budget(False), "e2": Budget(False)}
    fixed = split(CascadePolicy(capacity_rows_s=10), nodes, now=100, stale_s=30)
    assert sum(b.rows_per_s for b in fixed.values()) == pytest.approx(10)


def test_stale_or_missing_capacity_means_no_budget() -> None:
    nodes = [seen("c", "center", capacity=40, at=0), seen("e", "edge", 100, at=99)]
    assert split(CascadePolicy(), nodes, now=100, stale_s=30) == {"e": Budget(False)}
    assert split(CascadePolicy(), [seen("e", "edge", 100)], now=100,
                 stale_s=30) == {"e": Budget(False)}


def test_hostile_report_figures_count_zero() -> None:
    s = LastReport.of("e", "edge", 1.0, {"rows": 1e300, "window_s": 1.0, "capacity_rows_s": -5})
    assert s.rows_per_s == 0 and s.capacity_rows_s == 0
    s = LastReport.of("c", "center", 1.0, {"rows": 50, "window_s": 0.0, "capacity_rows_s": "NaN"})
    assert s.rows_per_s == 0 and s.capacity_rows_s == 0


def test_only_real_moves_are_pushed_again() -> None:
    old = Budget(True, 20.0)
    assert not changed(old, Budget(True, 20.5))
    assert changed(old, Budget(True, 22.0))
    assert changed(old, Budget(False)) and changed(None, Budget(False))
    assert not changed(Budget(False), Budget(False))


def test_policy_changes_are_audited_once_and_bad_ones_refused(tmp_path: Path) -> None:
    catalog = Catalog(connect(tmp_path / "r.sqlite3"), "tester")
    with pytest.raises(RegistryError, match="no model"):
        budgets.set_policy(catalog.db, None, "tester", "ghost", CascadePolicy(mode="static"))
    catalog.db.execute("INSERT INTO models (name, created_at) VALUES ('m', 'now')")
    catalog.db.conn.commit()
    budgets.set_policy(catalog.db, None, "tester", "m", CascadePolicy(mode="static"))
    budgets.set_policy(catalog.db, None, "tester", "m", CascadePolicy(mode="static"))  # no change
    with pytest.raises(RegistryError, match="capacity"):
        budgets.set_policy(catalog.db, None, "tester", "m", CascadePolicy(capacity_rows_s=-1))
    records = [r for r in chain.records(catalog.db) if r.action == "cascade-policy"]
    assert len(records) == 1 and json.loads(records[0].payload)["to"]["mode"] == "static"
    assert budgets.policies(catalog.db) == {"m": CascadePolicy(mode="static")}


def report(rows: float, window: float = 10.0, requests: float | None = None,
           capacity: float = 0.0) -> dict[str, float]:
    return {"rows": rows, "window_s": window, "capacity_rows_s": capacity,
            "requests": rows if requests is None else requests}


def test_rows_are_bounded_by_requests_and_a_short_window_is_stretched() -> None:
    s = LastReport.of("e", "edge", 1.0, report(1e9, requests=2), interval_s=10)
    assert s.rows_per_s == pytest.approx(2 * evidence.MAX_REQUEST_ROWS / 10)
    s = LastReport.of("e", "edge", 1.0, report(50, window=0.1), interval_s=10)
    assert s.rows_per_s == pytest.approx(50)  # 50 rows over 0.1 s count as over 1 s
    s = LastReport.of("e", "edge", 1.0, report(50, window=0.1), interval_s=0.5)
    assert s.rows_per_s == pytest.approx(100)  # the report interval, when it is shorter


def test_figures_start_small_and_grow_at_most_twofold_per_interval() -> None:
    first = LastReport.of("c", "center", 0.0, report(0, capacity=1e9), interval_s=10)
    assert first.capacity_rows_s == budgets.START_ROWS_S
    spam = LastReport.of("c", "center", 0.01, report(0, capacity=1e9), first, interval_s=10)
    assert spam.capacity_rows_s == pytest.approx(budgets.START_ROWS_S, rel=1e-3)  # no gain
    later = LastReport.of("c", "center", 10.0, report(0, capacity=1e9), first, interval_s=10)
    assert later.capacity_rows_s == pytest.approx(2 * budgets.START_ROWS_S)
    drop = LastReport.of("c", "center", 10.1, report(0, capacity=5), later, interval_s=10)
    assert drop.capacity_rows_s == 5  # falling figures count at once
    honest = LastReport.of("c", "center", 20.0, report(0, capacity=40), drop, interval_s=10)
    assert honest.capacity_rows_s == 40


def test_the_operator_ceiling_bounds_capacity_and_no_edge_outweighs_the_others() -> None:
    nodes = [seen("c", "center", capacity=1e6), seen("e1", "edge", 10), seen("e2", "edge", 10),
             seen("liar", "edge", 1e9)]
    out = split(CascadePolicy(max_capacity_rows_s=100), nodes, now=100, stale_s=30)
    assert sum(b.rows_per_s for b in out.values()) == pytest.approx(100)
    assert out["liar"].share < budgets.MAX_SKEW / (budgets.MAX_SKEW + 2) + 0.01
    assert out["e1"].rows_per_s > 9  # was ~0 with the liar's figure taken as said


def test_the_skew_cap_uses_the_median_of_the_other_edges_as_before() -> None:
    """The O(N log N) median-of-the-others gives what the plain one gave, ties and all."""
    import random
    import statistics

    rng = random.Random(5)
    for n in (2, 3, 4, 7, 50):
        traffic = [float(rng.choice([0, 1, 5, 5, 40, 900])) for _ in range(n)]
        nodes = [seen("c", "center", capacity=500)] + [seen(f"e{i}", "edge", t)
                                                       for i, t in enumerate(traffic)]
        out = split(CascadePolicy(), nodes, now=100, stale_s=30)
        capped = []
        for i, t in enumerate(traffic):
            other = statistics.median(traffic[:i] + traffic[i + 1:])
            capped.append(min(t, budgets.MAX_SKEW * other) if other > 0 else t)
        mean = sum(capped) / n
        weights = [c + budgets.FLOOR * mean + 0.1 for c in capped]
        for i, w in enumerate(weights):
            assert out[f"e{i}"].rows_per_s == pytest.approx(500 * w / sum(weights))


def test_one_edges_claims_take_less_than_half_of_three_edges_budget() -> None:
    """A liar at its largest claims beside two honest edges of 10 rows/s, 100 rows/s to share:
    it took 77.7 and left each honest edge 11.2 at 8x the median; now 49.1 and 25.5."""
    liar = None
    for i in range(60):  # report after report, its figure grows twofold per interval
        liar = LastReport.of("liar", "edge", 10.0 * i, report(1e9, window=0.001), liar, 10.0)
    assert liar is not None and liar.rows_per_s == 1e9
    nodes = [seen("c", "center", capacity=100, at=590), liar,
             seen("e1", "edge", 10, at=590), seen("e2", "edge", 10, at=590)]
    out = split(CascadePolicy(), nodes, now=590, stale_s=30)
    assert out["liar"].share < 0.5
    assert out["e1"].rows_per_s == out["e2"].rows_per_s == pytest.approx(25.5, abs=0.1)
    assert out["liar"].rows_per_s == pytest.approx(49.1, abs=0.1)


def test_an_edge_counts_up_to_max_skew_times_the_median_of_the_others_and_no_more() -> None:
    def budgets_with(heavy: float) -> dict[str, Budget]:
        return split(CascadePolicy(), [seen("c", "center", capacity=100),
                                       seen("heavy", "edge", heavy), seen("e1", "edge", 10),
                                       seen("e2", "edge", 30)], now=100, stale_s=30)

    at = budgets_with(budgets.MAX_SKEW * 20)  # just inside: counted as said
    over = budgets_with(budgets.MAX_SKEW * 20 + 5)  # just outside: counted as 2 x 20
    assert at["heavy"].rows_per_s == pytest.approx(over["heavy"].rows_per_s)
    inside = budgets_with(budgets.MAX_SKEW * 20 - 5)
    assert inside["heavy"].rows_per_s < at["heavy"].rows_per_s  # below it, traffic counts
    assert at["e1"].rows_per_s == pytest.approx(over["e1"].rows_per_s)
