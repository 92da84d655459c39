"""The Grafana dashboard (``monitoring/dashboards/tiered.json``) as a user imports it: it asks
for the Prometheus data source, shows the seed's panels, every query is PromQL that promtool
parses, and every ``tiered:*`` series it (or an alert) reads is one the recording rules make.
(Whether each query answers on a running stack is the integration tests'.)"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from tests.unit.monitoring.promtool import MONITORING, RULES, alerts, run, tool

DASHBOARD = MONITORING / "dashboards" / "tiered.json"
DATASOURCE = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
RECORDED = re.compile(r"tiered:[a-z0-9_:]+")
SEED_PANELS = ("Latency p50 / p95 / p99 per tier", "Throughput per tier", "Edge share",
               "Center load avoided", "Escalation against budget", "Input drift",
               "Low-confidence share (below 0.3)", "Confidence histogram (edge rows)",
               "Rollout state", "Rollout wave", "CPU per tier", "Resident memory per tier")


def panels() -> list[dict[str, Any]]:
    return [p for p in json.loads(DASHBOARD.read_text())["panels"] if p["type"] != "row"]


def expressions() -> list[str]:
    return [target["expr"] for panel in panels() for target in panel["targets"]]


def check_as_rules(exprs: list[str], folder: Path) -> tuple[int, str]:
    """promtool's verdict on ``exprs``, each as a recording rule (promtool parses without a
    server)."""
    rules = [{"record": f"dashboard:query_{i}", "expr": e} for i, e in enumerate(exprs)]
    path = folder / "dashboard_queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    done = run(tool("promtool"), "check", "rules", path)
    return done.returncode, done.stdout + done.stderr


def test_it_is_an_exported_dashboard_asking_for_a_prometheus_data_source() -> None:
    board = json.loads(DASHBOARD.read_text())
    assert board["schemaVersion"] >= 36 and board["uid"] and board["title"] == "Tiered"
    assert [i["name"] for i in board["__inputs"]] == ["DS_PROMETHEUS"]
    wrong = [p["title"] for p in panels() if p["datasource"] != DATASOURCE
             or any(t["datasource"] != DATASOURCE for t in p["targets"]) or not p["targets"]]
    assert not wrong, f"panels without the ${{DS_PROMETHEUS}} data source or a query: {wrong}"


def test_it_shows_the_seed_s_panels_once_each_without_overlapping() -> None:
    titles = [p["title"] for p in panels()]
    assert [t for t in SEED_PANELS if t not in titles] == []
    assert len(titles) == len(set(titles))
    cells: set[tuple[int, int]] = set()
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        g = panel["gridPos"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"])
                for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"{panel['title']} overlaps another panel"
        assert g["x"] + g["w"] <= 24, f"{panel['title']} is wider than the dashboard"
        cells |= mine


def test_every_query_is_promql_promtool_parses(tmp_path: Path) -> None:
    code, output = check_as_rules(expressions(), tmp_path)
    assert code == 0, output


def test_the_query_check_refuses_a_query_that_does_not_parse(tmp_path: Path) -> None:
    code, output = check_as_rules(["sum by (job (rate(up[5m]))"], tmp_path)
    assert code != 0 and "parse error" in output


def test_every_recorded_series_a_panel_or_an_alert_reads_is_recorded() -> None:
    records = {rule["record"] for path in RULES for group in yaml.safe_load(path.read_text())[
        "groups"] for rule in group["rules"] if "record" in rule}
    read = {name for expr in expressions() for name in RECORDED.findall(expr)}
    read |= {name for rule in alerts() for name in RECORDED.findall(rule["expr"])}
    assert read and read <= records, f"never recorded: {sorted(read - records)}"
