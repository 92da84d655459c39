"""The registry's /metrics page: prometheus_client's series, then every node's last report
rendered once per report (``registry.server.metrics.NodeSeries``), parsed back by Prometheus's own
parser."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from registry.server.metrics import QUALITY, SyncMetrics, serve_http

EDGE = ["edge-1", "edge", "eu", "m", "1"]


def families(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def key(labels: list[str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(zip(["node", "tier", "region", "model", "version"], labels, strict=True)))


def test_node_series_parse_and_follow_the_last_report() -> None:
    metrics = SyncMetrics()
    metrics.connected.set(3)
    metrics.report(EDGE, {"escalation_rate": 0.25, "p99_ms": 40.0, "requests": 7})
    metrics.report(["c-1", "center", "eu", "m", "1"], {"capacity_rows_s": 120.0,
                                                       "requests": 0})
    metrics.report(EDGE, {"escalation_rate": 0.5, "p99_ms": 20.0, "requests": 5})
    found = families(metrics.exposition().decode())
    assert found["registry_sync_nodes_connected"][()] == 3
    assert found["registry_node_escalation_rate"][key(EDGE)] == 0.5  # the last report
    assert found["registry_node_p99_seconds"][key(EDGE)] == 0.02  # scaled to seconds
    assert found["registry_node_requests_total"][key(EDGE)] == 12  # summed
    center = key(["c-1", "center", "eu", "m", "1"])
    assert found["registry_node_capacity_rows_per_second"][center] == 120
    assert set(found) >= {f"registry_node_{name}" for name, _, _ in QUALITY.values()}


def test_a_new_version_replaces_the_gauges_of_the_old_one() -> None:
    metrics = SyncMetrics()
    metrics.report(EDGE, {"fidelity": 0.99, "requests": 1})
    newer = [*EDGE[:4], "2"]
    metrics.report(newer, {"fidelity": 0.97, "requests": 1})
    found = families(metrics.exposition().decode())
    assert found["registry_node_fidelity"] == {key(newer): 0.97}
    assert set(found["registry_node_requests_total"]) == {key(EDGE), key(newer)}


def test_a_label_value_that_needs_escaping_stays_one_sample() -> None:
    metrics = SyncMetrics()
    odd = ['e"1\\', "edge", "eu\nx", "m", "1"]
    metrics.report(odd, {"escalation_rate": 1.0})
    found = families(metrics.exposition().decode())
    assert found["registry_node_escalation_rate"][key(odd)] == 1.0


def test_the_page_is_served_over_http() -> None:
    metrics = SyncMetrics()
    metrics.report(EDGE, {"escalation_rate": 0.125})
    server = serve_http(metrics, "127.0.0.1", 0)
    try:
        response = httpx.get(f"http://127.0.0.1:{server.server_port}/metrics", timeout=5)
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/plain")
        assert families(response.text)["registry_node_escalation_rate"][key(EDGE)] == 0.125
        assert httpx.get(f"http://127.0.0.1:{server.server_port}/x", timeout=5).status_code \
            == 404
    finally:
        server.shutdown()
        server.server_close()


def test_a_rollout_state_is_one_series_at_1_the_others_0_so_an_alert_clears() -> None:
    from registry.server.metrics import SyncMetrics

    metrics = SyncMetrics()
    states = ("running", "halted", "done")
    metrics.rollouts([("m", "halted", 2, None)], states)
    page = metrics.exposition().decode()
    assert 'registry_rollout_state{model="m",state="halted"} 1.0' in page
    assert 'registry_rollout_state{model="m",state="running"} 0.0' in page
    assert 'registry_rollout_wave{model="m"} 2.0' in page
    metrics.rollouts([("m", "running", 2, None)], states)
    page = metrics.exposition().decode()
    assert 'registry_rollout_state{model="m",state="halted"} 0.0' in page


def test_a_held_rollout_is_one_series_per_bounded_reason_that_clears() -> None:
    from registry.releases.gate import HOLDS
    from registry.server.metrics import SyncMetrics

    metrics = SyncMetrics()
    metrics.rollouts([("m", "held", 1, "not-measured"), ("n", "running", 2, None)],
                     ("running", "held"), HOLDS)
    page = metrics.exposition().decode()
    assert 'registry_rollout_held{model="m",reason="not-measured"} 1.0' in page
    assert 'registry_rollout_held{model="m",reason="undecided"} 0.0' in page
    assert 'registry_rollout_held{model="n",reason="not-measured"} 0.0' in page
    assert 'registry_rollout_state{model="m",state="held"} 1.0' in page
    metrics.rollouts([("m", "running", 2, None)], ("running", "held"), HOLDS)
    page = metrics.exposition().decode()
    assert 'registry_rollout_held{model="m",reason="not-measured"} 0.0' in page
