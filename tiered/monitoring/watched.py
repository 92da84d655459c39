"""The operator's side of a running fleet, one concern apart from where its nodes run: Prometheus
with its Consul-fed targets, Alertmanager, and (on a one-machine stack) the read-only fleet
console. ``tiered up``'s ``Stack`` and ``tiered sites``' ``Sites`` start it the same way; each
says where it runs (``monitor``) and which Consul agent the renderer reads."""

from __future__ import annotations

import secrets
from abc import abstractmethod
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from serving.config.tokens import write_secret
from tiered.children import Child
from tiered.commands import console_argv
from tiered.monitoring.prometheus import ALERTMANAGER_CONFIG, Monitor
from tiered.processes import free_port
from tiered.running import RunningFleet

MONITORING = "monitoring"  # the role of Prometheus and Alertmanager (restarted when they exit)


@dataclass(kw_only=True)
class Watched(RunningFleet):
    alertmanager_config: Path = ALERTMANAGER_CONFIG  # the receivers (user-edited)

    @property
    @abstractmethod
    def monitor(self) -> Monitor:
        """Where Prometheus and Alertmanager listen and keep their files."""

    def monitor_consul(self) -> str:
        """The Consul agent the target renderer follows (the fleet's own by default)."""
        return self.consul

    def placed(self, name: str) -> None:
        """Record where child ``name`` of the monitoring runs (a fleet of hosts: its host)."""

    def start_monitoring(self) -> None:
        """Alertmanager, the target renderer (the ``prometheus`` role's read-only Consul token)
        and Prometheus; waits until both answer ready."""
        monitor = self.monitor
        for name in ("alertmanager", "targets", "prometheus"):
            self.placed(name)
        started = [self.spawn("alertmanager", monitor.alertmanager_argv(
            self.alertmanager_config), monitor.alertmanager_port, MONITORING)]
        self.spawn("targets", monitor.targets_argv(self.monitor_consul()), 0, "targets")
        https = frozenset(r for r in ("edge", "center") if self.tls_serving(r))
        started.append(self.spawn("prometheus", monitor.prometheus_argv(
            https, self.tls / "ca.pem"), monitor.prometheus_port, MONITORING))
        for child in started:
            self.children.wait(partial(ready, f"http://{monitor.address}:{child.port}/-/ready"),
                               30, f"{child.name} ready", child)

    @property
    def prometheus_url(self) -> str | None:
        return f"http://{self.monitor.prometheus}" if "prometheus" in self.children else None

    @property
    def alertmanager_url(self) -> str | None:
        return (f"http://{self.monitor.alertmanager}" if "alertmanager" in self.children
                else None)

    @property
    def console_credential(self) -> Path:
        """The operator's secret for the fleet console (0600; user ``operator``)."""
        return self.root / "console" / "operator.secret"

    def start_console(self) -> Child:
        """The read-only fleet console on loopback, reached through the entry at /console/,
        never anonymous: its secret is made here (once per root) for the summary."""
        if not self.console_credential.is_file():
            self.console_credential.parent.mkdir(parents=True, exist_ok=True)
            self.console_credential.parent.chmod(0o700)
            write_secret(self.console_credential, f"{secrets.token_urlsafe(24)}\n".encode())
        port = free_port()
        links = ["--prometheus", str(self.prometheus_url), "--alertmanager",
                 str(self.alertmanager_url), "--consul-ui", f"http://{self.consul}/ui"]
        child = self.spawn("console", console_argv(self.registry_home, port,
                                                   self.console_credential, *links),
                           port, "console")
        self.children.wait(partial(ready, f"http://127.0.0.1:{port}/console/healthz"), 30,
                           "the console ready", child)
        return child

    def state(self) -> dict[str, Any]:
        """``stack.json``: also where Prometheus and Alertmanager are (`tiered report`)."""
        return super().state() | {"prometheus": self.prometheus_url,
                                  "alertmanager": self.alertmanager_url}


def ready(url: str) -> bool:
    return httpx.get(url, timeout=1).status_code == 200
