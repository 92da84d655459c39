"""The alert chain for tests: a webhook receiver standing in for the operator's pager, and (for
fleets that are not a ``tiered up`` stack) a real Prometheus with the repository's rules and a
real Alertmanager with the shipped receiver config, its webhook URLs pointed at the receiver.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import yaml

from harness.processes import free_port
from tiered.monitoring import prometheus
from tiered.monitoring.targets import JOBS


@dataclass
class Received:
    at: float  # time.monotonic() when the webhook got it
    alert: dict[str, Any]  # one of Alertmanager's webhook payload's ``alerts``


@dataclass
class Webhook:
    """An HTTP receiver for Alertmanager's webhook payloads (version 4), each alert kept with
    the moment it arrived."""

    received: list[Received] = field(default_factory=list)
    port: int = 0
    _server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/alerts"

    def start(self) -> Webhook:
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                now = time.monotonic()
                hook.received.extend(Received(now, a) for a in body.get("alerts", []))
                self.send_response(200)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def firing(self, name: str, **labels: str) -> list[Received]:
        return [r for r in self.received if r.alert.get("status") == "firing"
                and r.alert["labels"].get("alertname") == name
                and all(r.alert["labels"].get(k) == v for k, v in labels.items())]

    def wait(self, name: str, since: float, timeout: float, **labels: str) -> Received:
        """The first firing ``name`` alert that arrived after ``since`` (monotonic)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [r for r in self.firing(name, **labels) if r.at >= since]
            if found:
                return found[0]
            time.sleep(0.5)
        names = sorted({r.alert["labels"].get("alertname", "?") for r in self.received})
        raise AssertionError(f"no firing {name} {labels or ''} within {timeout:.0f} s; "
                             f"received: {names}")


def receiver_config(webhook: Webhook, out: Path,
                    source: Path = prometheus.ALERTMANAGER_CONFIG) -> Path:
    """The shipped receiver config (its routing and timing untouched), every webhook URL
    pointed at ``webhook``; e-mail and chat receivers stay as they are (commented out)."""
    config = yaml.safe_load(source.read_text())
    for receiver in config.get("receivers", []):
        for hook in receiver.get("webhook_configs", []):
            hook["url"] = webhook.url
    out.write_text(yaml.safe_dump(config))
    return out


@dataclass
class Monitoring:
    """Prometheus (the repository's rules; targets in file_sd files the test writes) and
    Alertmanager (the shipped config, pointed at ``webhook``), on free loopback ports."""

    root: Path
    webhook: Webhook
    interval_s: int = prometheus.SCRAPE_S
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    prometheus_port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.prometheus_port}"

    def targets(self, job: str, entries: list[dict[str, Any]]) -> None:
        """Replace ``job``'s file_sd entries (``{"targets": [...], "labels": {...}}``)."""
        path = self.root / "targets" / f"{job}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(entries))
        tmp.replace(path)

    def start(self) -> Monitoring:
        (self.root / "targets").mkdir(parents=True, exist_ok=True)
        for job in JOBS:
            self.targets(job, [])
        am_port, self.prometheus_port = free_port(), free_port()
        config = receiver_config(self.webhook, self.root / "alertmanager.yml")
        am = f"127.0.0.1:{am_port}"
        self._spawn(prometheus.alertmanager_argv(config, self.root / "am", am), "alertmanager")
        scrape = prometheus.Scrape(self.root / "targets", am, f"127.0.0.1:{self.prometheus_port}",
                                   interval_s=self.interval_s)
        self._spawn(prometheus.prometheus_argv(scrape.write(self.root / "prometheus.yml"),
                                               self.root / "data",
                                               f"127.0.0.1:{self.prometheus_port}"), "prometheus")
        for url in (f"http://{am}/-/ready", f"{self.url}/-/ready"):
            _wait(lambda u=url: httpx.get(u, timeout=1).status_code == 200, 30, url)
        return self

    def _spawn(self, argv: list[str], name: str) -> None:
        with (self.root / f"{name}.log").open("wb") as log:  # the child holds its own copy
            self.processes.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT))

    def query(self, expr: str) -> list[dict[str, Any]]:
        return query(self.url, expr)

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.terminate()
        for process in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(10)
            if process.poll() is None:
                process.kill()
                process.wait()


def query(url: str, expr: str) -> list[dict[str, Any]]:
    """An instant query against the Prometheus at ``url``; AssertionError when it fails."""
    answer = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10).json()
    if answer.get("status") != "success":
        raise AssertionError(f"{expr}: {answer}")
    return list(answer["data"]["result"])


def _wait(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if condition():
                return
        time.sleep(0.2)
    raise AssertionError(f"{what} not ready within {timeout} s")


@contextlib.contextmanager
def watching(root: Path) -> Iterator[Monitoring]:
    """A webhook and the chain around it, stopped on exit."""
    webhook = Webhook().start()
    chain = Monitoring(root, webhook)
    try:
        yield chain.start()
    finally:
        chain.stop()
        webhook.stop()
