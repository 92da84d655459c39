"""Prometheus's targets and configuration as ``tiered up`` writes them: one file_sd file per
scrape job, each node under its own name, region and tier; a registry scraped on its metrics
port; a change rewrites only its job's file; the configuration passes Debian's ``promtool``."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from serving.fleet.discovery import Instance
from tiered.monitoring.prometheus import Scrape, prometheus_argv
from tiered.monitoring.targets import TargetFiles, targets


def edge(node: str, region: str, port: int = 8200) -> Instance:
    return Instance(node, "127.0.0.1", port, meta={"region": region, "tier": "edge"})


def test_each_edge_is_a_target_with_its_node_region_and_tier() -> None:
    found = targets("edge", [edge("edge-us-1", "us", 8301), edge("edge-eu-1", "eu", 8300)])
    assert found == [
        {"targets": ["127.0.0.1:8300"], "labels": {"node": "edge-eu-1", "region": "eu",
                                                   "tier": "edge", "service": "tiered-edge"}},
        {"targets": ["127.0.0.1:8301"], "labels": {"node": "edge-us-1", "region": "us",
                                                   "tier": "edge", "service": "tiered-edge"}}]


def test_a_registry_is_scraped_on_its_metrics_port_and_skipped_without_one() -> None:
    with_port = Instance("registry-a", "10.0.0.5", 50051, meta={"metrics_port": "9300"})
    without = Instance("registry-b", "10.0.0.6", 50051, meta={"metrics_port": ""})
    found = targets("registry-standby", [with_port, without])
    assert found == [{"targets": ["10.0.0.5:9300"], "labels": {
        "node": "registry-a", "region": "local", "tier": "registry",
        "service": "tiered-registry-standby"}}]


def test_an_ipv6_node_is_bracketed() -> None:
    (entry,) = targets("center", [Instance("center-1", "::1", 8100)])
    assert entry["targets"] == ["[::1]:8100"]


def test_a_change_rewrites_its_jobs_file_and_the_standby_joins_the_registry_job(
        tmp_path: Path) -> None:
    files = TargetFiles(tmp_path)
    files.write_empty()
    assert {p.name: json.loads(p.read_text()) for p in tmp_path.iterdir()} == {
        "edge.json": [], "center.json": [], "registry.json": []}
    files.follow("edge")([edge("edge-eu-1", "eu")])
    assert [e["labels"]["node"] for e in json.loads((tmp_path / "edge.json").read_text())] \
        == ["edge-eu-1"]
    files.follow("registry")([Instance("r1", "127.0.0.1", 1, meta={"metrics_port": "9301"})])
    files.follow("registry-standby")([Instance("r2", "127.0.0.1", 2,
                                               meta={"metrics_port": "9302"})])
    registry = json.loads((tmp_path / "registry.json").read_text())
    assert [(e["labels"]["node"], e["targets"]) for e in registry] == [
        ("r1", ["127.0.0.1:9301"]), ("r2", ["127.0.0.1:9302"])]
    before = (tmp_path / "center.json").stat().st_mtime_ns
    files.follow("edge")([])  # the edge gone: its job's file only
    assert json.loads((tmp_path / "edge.json").read_text()) == []
    assert (tmp_path / "center.json").stat().st_mtime_ns == before


def test_the_configuration_scrapes_https_jobs_with_the_fleet_ca_and_passes_promtool(
        tmp_path: Path) -> None:
    (tmp_path / "ca.pem").write_text("")
    scrape = Scrape(tmp_path / "targets", "127.0.0.1:9093", "127.0.0.1:9090",
                    https=frozenset({"edge", "center"}), ca=tmp_path / "ca.pem")
    config = scrape.config()
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert jobs["edge"]["scheme"] == "https" and jobs["center"]["scheme"] == "https"
    assert jobs["edge"]["tls_config"] == {"ca_file": str(tmp_path / "ca.pem")}
    assert "scheme" not in jobs["registry"]  # the registry's metrics are plain HTTP
    assert jobs["edge"]["file_sd_configs"][0]["files"] == [str(tmp_path / "targets/edge.json")]
    assert config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == [
        "127.0.0.1:9093"]
    path = scrape.write(tmp_path / "prometheus.yml")
    checked = subprocess.run(["promtool", "check", "config", "--syntax-only", str(path)],
                             capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_prometheus_keeps_30_days_for_the_report_and_listens_where_told(tmp_path: Path) -> None:
    argv = prometheus_argv(tmp_path / "p.yml", tmp_path / "data", "127.0.0.1:9999")
    assert "--storage.tsdb.retention.time=30d" in argv
    assert "--web.listen-address=127.0.0.1:9999" in argv
