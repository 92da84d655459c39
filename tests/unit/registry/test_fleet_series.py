"""The registry's fleet aggregates (``registry_fleet_*``) as an operator reads them on /metrics:
per model, version, tier and region, the counters add every report, the gauges are the
rows-weighted means over each node's last report within the staleness window, and the page
parses with Prometheus's own parser whether the per-node series are on or off."""

from __future__ import annotations

import math
from typing import Any

import pytest
from google.protobuf.json_format import MessageToDict
from prometheus_client.parser import text_string_to_metric_families

from registry.server.metrics import SyncMetrics
from registry.settings import RegistrySettings
from sync.node.reports import report_message

Samples = dict[str, dict[tuple[tuple[str, str], ...], float]]
EU = {"model": "m", "version": "1", "tier": "edge", "region": "eu"}
US = EU | {"region": "us"}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def page(metrics: SyncMetrics) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def at(found: Samples, name: str, **labels: str) -> float | None:
    return found.get(f"registry_fleet_{name}", {}).get(tuple(sorted(labels.items())))


def metrics_with_clock(node_series: bool = True) -> tuple[SyncMetrics, Clock]:
    metrics, clock = SyncMetrics(node_series=node_series, stale_after_s=30.0), Clock()
    metrics.fleet.clock = clock
    return metrics, clock


def edge(node: str, region: str = "eu", version: str = "1") -> list[str]:
    return [node, "edge", region, "m", version]


def report(rows: int, escalation: float, **more: Any) -> dict[str, Any]:
    return {"requests": rows // 2, "rows": rows, "escalation_rate": escalation} | more


def test_two_edges_in_a_region_and_one_elsewhere_add_up_to_exact_weighted_means() -> None:
    metrics, _ = metrics_with_clock()
    metrics.report(edge("e1"), report(100, 0.25, degraded_rate=0.5, shed_rate=0.125,
                                      audit_rows=40, audit_agreement=0.75, input_rows=100,
                                      input_shift=1.0, p99_ms=30.0, drift=True,
                                      estimated_accuracy=0.5))
    metrics.report(edge("e2"), report(300, 0.5, audit_rows=120, audit_agreement=1.0,
                                      input_rows=200, input_shift=2.5, p99_ms=50.0,
                                      estimated_accuracy=0.0))  # 0: no estimate, left out
    metrics.report(edge("e3", "us"), report(8, 1.0, p99_ms=10.0, confidence_drift=True))
    found = page(metrics)
    assert at(found, "nodes", **EU) == 2 and at(found, "nodes", **US) == 1
    assert at(found, "escalation_rate", **EU) == (100 * 0.25 + 300 * 0.5) / 400 == 0.4375
    assert at(found, "degraded_rate", **EU) == 50 / 400
    assert at(found, "shed_rate", **EU) == 12.5 / 400
    assert at(found, "audit_agreement", **EU) == (40 * 0.75 + 120 * 1.0) / 160
    assert at(found, "input_shift", **EU) == (100 * 1.0 + 200 * 2.5) / 300
    assert at(found, "estimated_accuracy", **EU) == 0.5  # e1's alone
    assert at(found, "input_shift_max", **EU) == 2.5
    assert at(found, "p99_seconds", **EU) == 0.05
    assert at(found, "drifting_nodes", **EU) == 1 and at(found, "drifting_nodes", **US) == 1
    assert at(found, "escalation_rate", **US) == 1.0
    assert at(found, "audit_agreement", **US) is None  # no audit rows: absent, not 0
    assert at(found, "requests_total", **EU) == 50 + 150
    rows = {by: at(found, "rows_total", **EU, answered_by=by)
            for by in ("edge", "center", "edge-degraded", "edge-shed")}
    # e1: 25 center, 50 degraded, 12.5 -> 12 shed (rounded half to even), 13 edge; e2: 150/150
    assert rows == {"center": 175, "edge-degraded": 50, "edge-shed": 12, "edge": 163}
    assert sum(v or 0.0 for v in rows.values()) == 400


def test_a_second_report_replaces_the_first_in_the_gauges_and_adds_to_the_counters() -> None:
    metrics, _ = metrics_with_clock()
    metrics.report(edge("e1"), report(100, 0.25))
    metrics.report(edge("e2"), report(100, 0.75))
    metrics.report(edge("e1"), report(300, 0.5, p99_ms=5.0))
    found = page(metrics)
    assert at(found, "nodes", **EU) == 2
    assert at(found, "escalation_rate", **EU) == (300 * 0.5 + 100 * 0.75) / 400
    assert at(found, "requests_total", **EU) == 50 + 50 + 150
    assert at(found, "rows_total", **EU, answered_by="center") == 25 + 75 + 150


def test_the_largest_p99_is_found_again_when_its_node_reports_a_smaller_one() -> None:
    metrics, _ = metrics_with_clock()
    metrics.report(edge("e1"), report(10, 0.0, p99_ms=80.0))
    metrics.report(edge("e2"), report(10, 0.0, p99_ms=20.0))
    assert at(page(metrics), "p99_seconds", **EU) == 0.08
    metrics.report(edge("e1"), report(10, 0.0, p99_ms=10.0))
    assert at(page(metrics), "p99_seconds", **EU) == 0.02


def test_a_node_silent_longer_than_the_window_drops_out_of_the_gauges_only() -> None:
    metrics, clock = metrics_with_clock()
    metrics.report(edge("e1"), report(100, 0.25))
    clock.now += 10
    metrics.report(edge("e2"), report(100, 0.75))
    clock.now += 20  # e1's report is exactly 30 s old: still in
    assert at(page(metrics), "nodes", **EU) == 2
    clock.now += 0.5  # e1's is 30.5 s old
    found = page(metrics)
    assert at(found, "nodes", **EU) == 1
    assert at(found, "escalation_rate", **EU) == 0.75
    assert at(found, "requests_total", **EU) == 100  # counters keep what was reported
    clock.now += 10  # e2's too: the group's gauges go, its counters stay
    found = page(metrics)
    assert at(found, "nodes", **EU) is None and at(found, "escalation_rate", **EU) is None
    assert at(found, "rows_total", **EU, answered_by="center") == 25 + 75
    metrics.report(edge("e1"), report(100, 0.5))  # back
    assert at(page(metrics), "escalation_rate", **EU) == 0.5


def test_a_version_change_moves_the_node_to_the_new_versions_group() -> None:
    metrics, _ = metrics_with_clock()
    metrics.report(edge("e1"), report(100, 0.25))
    metrics.report(edge("e2"), report(100, 0.75))
    metrics.report(edge("e1", version="2"), report(100, 0.5))
    found = page(metrics)
    v2 = EU | {"version": "2"}
    assert at(found, "nodes", **EU) == 1 and at(found, "nodes", **v2) == 1
    assert at(found, "escalation_rate", **EU) == 0.75
    assert at(found, "escalation_rate", **v2) == 0.5
    assert at(found, "requests_total", **EU) == 100 and at(found, "requests_total", **v2) == 50


def test_confidence_buckets_are_cumulative_edge_rows_at_the_bounds_the_registry_knows() -> None:
    metrics, _ = metrics_with_clock()
    buckets = [{"le": 0.5, "count": 3}, {"le": 0.9, "count": 5}, {"le": math.inf, "count": 2},
               {"le": 0.123, "count": 1000}]  # a bound no release uses: not a label value
    metrics.report(edge("e1"), report(10, 0.0, confidence=buckets, low_confidence_share=0.25))
    metrics.report(edge("e2"), report(30, 0.0, low_confidence_share=0.5, confidence=[
        {"le": 0.3, "count": 6}, {"le": 0.5, "count": 4}, {"le": math.inf, "count": 20}]))
    metrics.report(["c1", "center", "eu", "m", "1"], report(7, 1.0, confidence=buckets))
    found = page(metrics)
    hist = {dict(k)["le"]: v for k, v in found["registry_fleet_confidence_bucket"].items()}
    # e2's 6 rows at 0.3 are new to the group; e1 had none it could say were at or below 0.3;
    # at 0.9 e2 counts the 10 at or below its 0.5
    assert hist == {"0.3": 6, "0.5": 3 + 10, "0.9": 8 + 10, "+Inf": 10 + 30}
    assert found["registry_fleet_confidence_count"] == {
        (("model", "m"), ("region", "eu"), ("version", "1")): 40}
    assert at(found, "low_confidence_share", **EU) == (10 * 0.25 + 30 * 0.5) / 40


def test_a_bound_first_reported_after_others_keeps_the_buckets_cumulative() -> None:
    """A node newer than the rest adds a bound: it starts where the bound below it is."""
    metrics, _ = metrics_with_clock()
    metrics.report(edge("e1"), report(10, 0.0, confidence=[
        {"le": 0.5, "count": 3}, {"le": math.inf, "count": 2}]))
    metrics.report(edge("e2"), report(10, 0.0, confidence=[
        {"le": 0.5, "count": 1}, {"le": 0.9, "count": 1}, {"le": math.inf, "count": 1}]))
    found = page(metrics)
    hist = {dict(k)["le"]: v for k, v in found["registry_fleet_confidence_bucket"].items()}
    assert hist == {"0.5": 4, "0.9": 3 + 2, "+Inf": 8}


def test_a_report_as_the_intake_decodes_it_from_the_wire_is_counted() -> None:
    """Proto JSON writes 64-bit counts as strings and +Inf as "Infinity"."""
    message = report_message({"model": "m", "version": 1, "requests": 5, "rows": 8,
                              "escalation_rate": 0.25, "confidence": [
                                  {"le": 0.5, "count": 2}, {"le": math.inf, "count": 6}]})
    data = MessageToDict(message, preserving_proto_field_name=True,
                         always_print_fields_with_no_presence=True)
    for key in ("version", "requests", "rows", "audit_rows"):
        data[key] = int(data[key])
    metrics, _ = metrics_with_clock()
    metrics.report(edge("e1"), data)
    found = page(metrics)
    assert at(found, "rows_total", **EU, answered_by="center") == 2
    hist = {dict(k)["le"]: v for k, v in found["registry_fleet_confidence_bucket"].items()}
    assert hist == {"0.5": 2, "+Inf": 8}


def test_label_values_are_escaped_and_cut_to_a_bounded_length() -> None:
    metrics, _ = metrics_with_clock()
    odd = ['e"1', "edge", 'eu"\n\\x', "m" * 100, "1"]
    metrics.report(odd, report(10, 0.5))
    found = page(metrics)
    labels = EU | {"region": 'eu"\n\\x', "model": "m" * 64}
    assert at(found, "escalation_rate", **labels) == 0.5
    assert at(found, "nodes", **labels) == 1


def test_every_fleet_family_parses_with_its_type() -> None:
    metrics, _ = metrics_with_clock()
    metrics.report(edge("e1"), report(10, 0.5, confidence=[{"le": 0.5, "count": 1}]))
    types = {f.name: f.type for f in text_string_to_metric_families(
        metrics.exposition().decode()) if f.name.startswith("registry_fleet_")}
    assert types["registry_fleet_nodes"] == "gauge"
    assert types["registry_fleet_requests"] == "counter"
    assert types["registry_fleet_rows"] == "counter"
    assert types["registry_fleet_confidence"] == "histogram"
    assert len(types) == 15


def test_with_node_series_off_only_the_aggregates_show_a_node() -> None:
    off, _ = metrics_with_clock(node_series=False)
    on, _ = metrics_with_clock(node_series=True)
    for metrics in (off, on):
        metrics.report(edge("e1"), report(10, 0.5))
    text_off, text_on = off.exposition().decode(), on.exposition().decode()
    assert "registry_node_" not in text_off
    assert "registry_fleet_escalation_rate{" in text_off
    assert 'registry_node_escalation_rate{node="e1"' in text_on
    assert "registry_fleet_escalation_rate{" in text_on


def test_registry_node_series_false_in_the_environment_turns_the_setting_off(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert RegistrySettings().node_series is True
    monkeypatch.setenv("REGISTRY_NODE_SERIES", "false")
    assert RegistrySettings().node_series is False


def test_numbers_a_report_cannot_mean_count_as_zero() -> None:
    metrics, _ = metrics_with_clock(node_series=False)  # (the intake lets no NaN through)
    metrics.report(edge("e1"), {"requests": math.nan, "rows": True, "escalation_rate": 0.5,
                                "p99_ms": -5.0, "input_shift": math.inf, "input_rows": 10**400})
    metrics.report(edge("e2"), {"requests": 3, "rows": 4, "escalation_rate": 2.0})  # capped
    found = page(metrics)
    assert at(found, "requests_total", **EU) == 3
    assert at(found, "rows_total", **EU, answered_by="center") == 4
    assert at(found, "rows_total", **EU, answered_by="edge") == 0
    assert at(found, "p99_seconds", **EU) == 0 and at(found, "input_shift", **EU) is None
    assert at(found, "nodes", **EU) == 2
