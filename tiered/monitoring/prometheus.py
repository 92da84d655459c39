"""Prometheus and Alertmanager as children of a local fleet: Prometheus's configuration (one
scrape job per Tiered role, each fed by the target renderer's ``file_sd`` file; the rules of
``monitoring/rules``; the fleet's Alertmanager) and each command line. Both listen on loopback
only: the operator reaches them on the machine, or through the console's credential.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tiered.monitoring.targets import JOBS

MONITORING = Path(__file__).resolve().parents[2] / "monitoring"  # rules, receivers, dashboards
RULES = MONITORING / "rules"
ALERTMANAGER_CONFIG = MONITORING / "alertmanager.yml"  # the receivers a user edits
SCRAPE_S = 5  # a loopback fleet is cheap to scrape: alerts see a fault within seconds
PROMETHEUS_BIN = "prometheus"
ALERTMANAGER_BIN = "prometheus-alertmanager"  # Debian's name for alertmanager


def binary(name: str) -> str | None:
    """Debian's binary of ``name`` (PATH, then /usr/bin), None when not installed."""
    found = shutil.which(name) or (f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").is_file()
                                   else None)
    return found


@dataclass(frozen=True)
class Scrape:
    """What Prometheus needs to scrape one fleet."""

    targets: Path  # the renderer's folder of file_sd files
    alertmanager: str  # host:port
    listen: str  # Prometheus's own host:port
    https: frozenset[str] = frozenset()  # jobs whose nodes serve HTTPS
    ca: Path | None = None  # the fleet CA those are checked against
    interval_s: int = SCRAPE_S
    rules: Path = RULES

    def config(self) -> dict[str, Any]:
        jobs: list[dict[str, Any]] = []
        for job in JOBS:
            entry: dict[str, Any] = {
                "job_name": job,
                # the nodes' own labels (edge_rows_total's tier, registry_node_*'s node, tier
                # and region) win over the target's: the rules and dashboards read them
                "honor_labels": True,
                "file_sd_configs": [{"files": [str(self.targets / f"{job}.json")],
                                     "refresh_interval": f"{self.interval_s}s"}]}
            if job in self.https:
                entry["scheme"] = "https"
                entry["tls_config"] = {"ca_file": str(self.ca)}
            jobs.append(entry)
        jobs.append({"job_name": "prometheus",
                     "static_configs": [{"targets": [self.listen]}]})
        jobs.append({"job_name": "alertmanager",
                     "static_configs": [{"targets": [self.alertmanager]}]})
        return {
            "global": {"scrape_interval": f"{self.interval_s}s",
                       "evaluation_interval": f"{self.interval_s}s",
                       "scrape_timeout": f"{max(1, self.interval_s - 1)}s"},
            "rule_files": [str(self.rules / "*.yml")],
            "alerting": {"alertmanagers": [{"static_configs": [
                {"targets": [self.alertmanager]}]}]},
            "scrape_configs": jobs}

    def write(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("# written by tiered at each start; edit monitoring/ instead\n"
                        + yaml.safe_dump(self.config(), sort_keys=False))
        return path


def prometheus_argv(config: Path, data: Path, listen: str) -> list[str]:
    """Prometheus on ``listen`` with its TSDB in ``data`` (kept 30 days: `tiered report`)."""
    return [binary(PROMETHEUS_BIN) or PROMETHEUS_BIN, f"--config.file={config}",
            f"--storage.tsdb.path={data}", "--storage.tsdb.retention.time=30d",
            f"--web.listen-address={listen}", f"--web.external-url=http://{listen}/",
            "--log.level=warn"]


def alertmanager_argv(config: Path, data: Path, listen: str) -> list[str]:
    """Alertmanager on ``listen`` alone (no cluster port), its silences in ``data``."""
    return [binary(ALERTMANAGER_BIN) or ALERTMANAGER_BIN, f"--config.file={config}",
            f"--storage.path={data}", f"--web.listen-address={listen}",
            f"--web.external-url=http://{listen}/", "--cluster.listen-address=",
            "--log.level=warn"]


def targets_argv(out: Path, consul: str) -> list[str]:
    """The Consul-fed target renderer (its token: CONSUL_HTTP_TOKEN in its environment)."""
    return [sys.executable, "-m", "tiered.monitoring.targets", "--consul", consul,
            "--out", str(out)]


@dataclass(frozen=True)
class Monitor:
    """One fleet's monitoring on one host: where Prometheus and Alertmanager listen, where
    their files go (``<root>/prometheus``: configuration, ``targets/``, ``data/``;
    ``<root>/alertmanager``: silences) and each command line, in start order (Alertmanager,
    the renderer, Prometheus). ``tiered sites`` runs it on a host of the center site."""

    root: Path
    address: str  # both listen on it: loopback, or a private host address
    prometheus_port: int
    alertmanager_port: int
    interval_s: int = SCRAPE_S  # scrape and rule evaluation interval

    @property
    def home(self) -> Path:
        return self.root / "prometheus"

    @property
    def prometheus(self) -> str:
        return f"{self.address}:{self.prometheus_port}"

    @property
    def alertmanager(self) -> str:
        return f"{self.address}:{self.alertmanager_port}"

    def alertmanager_argv(self, config: Path) -> list[str]:
        return alertmanager_argv(config, self.root / "alertmanager", self.alertmanager)

    def targets_argv(self, consul: str) -> list[str]:
        return targets_argv(self.home / "targets", consul)

    def prometheus_argv(self, https: frozenset[str], ca: Path | None) -> list[str]:
        """Writes the configuration (``https``: jobs whose nodes serve HTTPS, checked against
        ``ca``), then Prometheus's command line."""
        scrape = Scrape(self.home / "targets", self.alertmanager, self.prometheus, https, ca,
                        self.interval_s)
        config = scrape.write(self.home / "prometheus.yml")
        return prometheus_argv(config, self.home / "data", self.prometheus)
