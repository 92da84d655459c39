from __future__ import annotations

import numpy as np
import pytest

from serving.telemetry.quality import QualityWindow, psi


def test_psi_is_zero_for_the_same_shape_and_grows_with_a_shift() -> None:
    base = np.array([10, 40, 40, 10])
    assert psi(base * 3, base) == 0.0
    assert psi(np.array([40, 40, 10, 10]), base) > 0.2 > psi(np.array([12, 38, 41, 9]), base)


def test_a_window_reports_rates_percentiles_lengths_and_starts_over() -> None:
    q = QualityWindow()
    for ms in range(1, 101):
        q.request("m", 1, ms / 1000)
    q.rows("m", 1, [5, 12, 12, 300], ["edge", "center", "edge-degraded", "edge"])
    q.confidence("m", 1, [0.55, 0.97, 1.0])
    (report,) = q.drain()
    assert (report["model"], report["version"], report["requests"], report["rows"]) == \
        ("m", 1, 100, 4)
    assert (report["escalation_rate"], report["degraded_rate"]) == (0.25, 0.25)
    assert 50 <= report["p50_ms"] <= 51 and 99 <= report["p99_ms"] <= 100
    assert report["mean_tokens"] == (5 + 12 + 12 + 300) / 4
    tokens = {b["le"]: b["count"] for b in report["tokens"]}
    assert (tokens[8], tokens[16], tokens[float("inf")]) == (1, 2, 1)
    confidence = {b["le"]: b["count"] for b in report["confidence"]}
    assert (confidence[0.6], confidence[0.99], confidence[float("inf")]) == (1, 1, 1)
    assert report["length_drift"] == 0.0  # no baseline yet
    assert q.drain() == []  # nothing happened since


def test_length_drift_compares_with_what_the_node_saw_before() -> None:
    q = QualityWindow()
    q.rows("m", 1, [10] * 50 + [40] * 50, ["edge"] * 100)
    q.drain()
    q.rows("m", 1, [10] * 50 + [40] * 50, ["edge"] * 100)
    assert q.drain()[0]["length_drift"] < 0.01
    q.rows("m", 1, [200] * 100, ["edge"] * 100)
    assert q.drain()[0]["length_drift"] > 1.0


def test_throughput_fits_a_fixed_and_a_per_row_cost_and_forgets_old_batches() -> None:
    from serving.telemetry.quality import THROUGHPUT_S, Throughput

    now = [0.0]
    t = Throughput(clock=lambda: now[0])
    assert t.rows_per_s() is None
    for rows in (1, 1, 1, 1, 1):
        t.add(rows, 0.1)
    assert t.rows_per_s(32, 0.5) == pytest.approx(10.0)  # one size: all per-row cost
    for rows in (2, 4, 8):
        t.add(rows, 0.1 * rows)
    assert t.rows_per_s(32, 0.35) == pytest.approx(10.0, rel=0.01)  # 3 rows fit 0.35 s
    now[0] = THROUGHPUT_S + 10
    for _ in range(10):
        t.add(4, 0.1)  # a faster model now: only the last minute counts
    assert t.rows_per_s(4) == pytest.approx(40.0, rel=0.01)


def test_idle_versions_report_only_what_an_idle_source_says() -> None:
    window = QualityWindow()
    window.add_source(lambda model, version: {"threshold": 0.7})  # an edge's: traffic only
    assert window.drain([("m", 3)]) == []  # idle edge: its last traffic report stands
    window.add_source(lambda model, version: {"capacity_rows_s": 12.5}, idle=True)
    (report,) = window.drain([("m", 3)])
    assert report["model"] == "m" and report["rows"] == 0 and report["capacity_rows_s"] == 12.5
    assert "threshold" not in report and report["shed_rate"] == 0.0
    window.rows("m", 3, [5, 6], ["edge", "edge-shed"])
    (busy,) = window.drain([("m", 3)])
    assert busy["threshold"] == 0.7 and busy["shed_rate"] == 0.5
