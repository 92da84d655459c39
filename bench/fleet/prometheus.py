"""A real Prometheus (Debian's ``/usr/bin/prometheus``) scraping one target, for
``bench.fleet.series``: a temporary config with one static scrape job, its TSDB in a temporary
folder, stopped by its PID."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from types import TracebackType

import httpx

from harness.processes import free_port

BINARY = "/usr/bin/prometheus"
JOB = "registry"


class Prometheus:
    """``with Prometheus(target, folder, interval_s) as p``: scraping ``target``
    (host:port) every ``interval_s``; ``p.query`` asks its HTTP API."""

    def __init__(self, target: str, folder: Path, interval_s: float = 5.0) -> None:
        self.port = free_port()
        folder.mkdir(parents=True, exist_ok=True)
        config = folder / "prometheus.yml"
        config.write_text(
            f"global:\n  scrape_interval: {interval_s:g}s\n  scrape_timeout: {interval_s:g}s\n"
            f"scrape_configs:\n  - job_name: {JOB}\n    static_configs:\n"
            f"      - targets: ['{target}']\n")
        self.log = (folder / "prometheus.log").open("wb")
        self.process = subprocess.Popen(
            [BINARY, f"--config.file={config}", f"--storage.tsdb.path={folder / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Prometheus:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()

    def query(self, expr: str) -> float | None:
        """The first sample of an instant query's answer (None: none, or not up yet)."""
        try:
            answer = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10)
            result = answer.json()["data"]["result"]
        except (httpx.HTTPError, KeyError, ValueError):
            return None
        return float(result[0]["value"][1]) if result else None

    def head_series(self) -> int | None:
        """Series in the TSDB's head (``/api/v1/status/tsdb``): the target's, plus the five
        Prometheus adds per target (up, scrape_*)."""
        try:
            data = httpx.get(f"{self.url}/api/v1/status/tsdb", timeout=10).json()
            return int(data["data"]["headStats"]["numSeries"])
        except (httpx.HTTPError, KeyError, ValueError):
            return None

    def scraped(self, scrapes: int, timeout_s: float) -> bool:
        """Wait until the target was scraped successfully ``scrapes`` times."""
        deadline = time.monotonic() + timeout_s
        expr = f'count_over_time(up{{job="{JOB}"}}[10m]) and up{{job="{JOB}"}} == 1'
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"prometheus exited {self.process.returncode}")
            done = self.query(expr)
            if done is not None and done >= scrapes:
                return True
            time.sleep(1.0)
        return False
