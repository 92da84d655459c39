"""Prometheus's configuration in the containers (monitoring/compose/prometheus.yml for
docker-compose.yml, monitoring/swarm/prometheus.yml for deploy/swarm/stack.yml): what ``tiered
up`` writes, with the containers' paths and names: the same scrape jobs from the renderer's
file_sd files, the repository's rules, the Alertmanager service; plain HTTP to the nodes in
compose, HTTPS checked against the fleet CA in the swarm (its nodes serve their bundle's
certificate); each passes Debian's ``promtool``."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from tiered.monitoring.prometheus import MONITORING, Scrape, binary

TARGETS = Path("/var/lib/tiered/targets")  # the renderer's --out in both deployments
RULES = Path("/etc/tiered/monitoring/rules")  # where docker/monitoring.Dockerfile copies them
EXPECTED = {
    "compose": Scrape(TARGETS, "alertmanager:9093", "127.0.0.1:9090", interval_s=15,
                      rules=RULES),
    "swarm": Scrape(TARGETS, "alertmanager:9093", "127.0.0.1:9090",
                    https=frozenset({"edge", "center"}), ca=Path("/var/lib/tiered/ca.pem"),
                    interval_s=15, rules=RULES)}

IDS = ["in-compose", "in-a-swarm-stack"]  # not the bare "swarm": that id opts into make swarm-test


@pytest.mark.parametrize("deployment", sorted(EXPECTED), ids=IDS)
def test_each_container_configuration_is_what_tiered_up_writes_for_its_paths(
        deployment: str) -> None:
    written = yaml.safe_load((MONITORING / deployment / "prometheus.yml").read_text())
    assert written == EXPECTED[deployment].config()


def test_only_the_swarm_scrapes_its_nodes_over_tls() -> None:
    def schemes(deployment: str) -> dict[str, str]:
        config = yaml.safe_load((MONITORING / deployment / "prometheus.yml").read_text())
        return {j["job_name"]: j.get("scheme", "http") for j in config["scrape_configs"]}

    assert schemes("compose") == dict.fromkeys(
        ("edge", "center", "registry", "prometheus", "alertmanager"), "http")
    assert schemes("swarm") == {"edge": "https", "center": "https", "registry": "http",
                                "prometheus": "http", "alertmanager": "http"}


@pytest.mark.parametrize("deployment", sorted(EXPECTED), ids=IDS)
def test_promtool_accepts_each(deployment: str, tmp_path: Path) -> None:
    promtool = binary("promtool")
    if promtool is None:
        pytest.skip("Debian's prometheus package (promtool) is not installed")
    done = subprocess.run([promtool, "check", "config",
                           str(MONITORING / deployment / "prometheus.yml")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout
