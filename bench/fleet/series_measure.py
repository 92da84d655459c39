"""What ``bench.fleet.series`` measures for one fleet and one setting of the per-node series:
the registry's /metrics page (bytes, samples, seconds to make and fetch it) and what a real
Prometheus scraping it holds (series) and takes (scrape_duration_seconds)."""

from __future__ import annotations

import random
import shutil
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.fleet.measure import TOKEN, Options, Workers, plans, wait_all
from bench.fleet.prometheus import JOB, Prometheus
from bench.fleet.sim import _window
from bench.rollout.measure import MODEL
from harness.processes import start_registry
from registry.server.metrics import SyncMetrics, serve_http

INTERVAL_S = 10.0  # the registry's default report interval
SCRAPE_S = 5.0  # Prometheus's scrape interval here
SCRAPES = 3  # successful scrapes before it is read


@dataclass
class Row:
    how: str  # "in-process" or "registry serve"
    nodes: int
    node_series: bool
    page_bytes: int
    samples: int
    fleet_samples: int
    make_s: float  # in-process: exposition() (median of 5); registry: one GET
    report_us: float  # in-process: SyncMetrics.report per report, replacing (nan: not measured)
    prometheus_series: float  # count({job="registry"}) in Prometheus
    head_series: int  # its TSDB head: the above + up and scrape_* series
    scrape_s: float  # scrape_duration_seconds, the last scrape
    scrape_max_s: float  # ... the slowest of them
    failed: int  # scrapes that failed (up 0: a timeout) of those made
    scrapes: int


def page_counts(text: str) -> tuple[int, int]:
    """(samples, of them registry_fleet_*), as Prometheus's own parser reads the page."""
    samples = [s.name for f in text_string_to_metric_families(text) for s in f.samples]
    return len(samples), sum(1 for n in samples if n.startswith("registry_fleet_"))


def scraped(target: str, folder: Path) -> tuple[float, int, float, float, int, int]:
    with Prometheus(target, folder, SCRAPE_S) as prom:
        if not prom.scraped(SCRAPES, timeout_s=SCRAPE_S * (SCRAPES + 6) + 30):
            raise RuntimeError(f"prometheus did not scrape {target} {SCRAPES} times")
        return (prom.query(f'count({{job="{JOB}"}})') or 0.0, prom.head_series() or 0,
                prom.query(f'scrape_duration_seconds{{job="{JOB}"}}') or 0.0,
                prom.query(f'max_over_time(scrape_duration_seconds{{job="{JOB}"}}[10m])')
                or 0.0,
                int(prom.query(f'count_over_time(up{{job="{JOB}"}}[10m]) - '
                               f'sum_over_time(up{{job="{JOB}"}}[10m])') or 0),
                int(prom.query(f'count_over_time(up{{job="{JOB}"}}[10m])') or 0))


def fleet_reports(nodes: int, regions: int, canary: float) -> list[tuple[list[str],
                                                                        dict[str, Any]]]:
    """Every node's report for one interval: ``nodes`` - 2 edges over ``regions`` regions (a
    ``canary`` share of them on v2), two centers; an edge's as bench.fleet's simulated nodes
    send (a real quality window's), with the drift fields."""
    rng = random.Random(0)
    edge, center = _window(MODEL, 1, INTERVAL_S, None, 0), _window(MODEL, 1, INTERVAL_S,
                                                                   400.0, 0)
    out = []
    for i in range(nodes - 2):
        version = "2" if i < canary * (nodes - 2) else "1"
        rows = int(200 * rng.uniform(0.95, 1.05))
        out.append(([f"fleet-edge-{i}", "edge", f"region-{i % regions}", MODEL, version],
                    edge | {"requests": rows, "rows": rows, "escalation_rate": 0.125,
                            "input_rows": rows, "input_shift": rng.uniform(0, 2),
                            "input_outliers": 0.01, "low_confidence_share": 0.05,
                            "audit_rows": 20, "audit_agreement": 0.95,
                            "estimated_accuracy": 0.9, "p99_ms": rng.uniform(20, 40)}))
    for i in range(2):
        out.append(([f"fleet-center-{i}", "center", "region-0", MODEL, "1"], center))
    return out


def in_process(nodes: int, node_series: bool, folder: Path, regions: int = 4,
               canary: float = 0.1) -> Row:
    """SyncMetrics fed every node's report each interval by a thread (as the registry's event
    loop would be), served by its own /metrics server and scraped by Prometheus."""
    metrics = SyncMetrics(node_series=node_series, stale_after_s=3 * INTERVAL_S)
    reports = fleet_reports(nodes, regions, canary)
    for labels, report in reports:  # the first interval's reports, then the second's timed
        metrics.report(labels, report)
    began = time.perf_counter()
    for labels, report in reports:
        metrics.report(labels, report)
    report_us = (time.perf_counter() - began) / len(reports) * 1e6
    stop = threading.Event()

    def feed() -> None:
        while not stop.wait(INTERVAL_S):
            for labels, report in reports:
                metrics.report(labels, report)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    server = serve_http(metrics, "127.0.0.1", 0)
    try:
        times = []
        for _ in range(5):
            began = time.perf_counter()
            text = metrics.exposition()
            times.append(time.perf_counter() - began)
        samples, fleet = page_counts(text.decode())
        prom = scraped(f"127.0.0.1:{server.server_port}", folder)
    finally:
        stop.set()
        server.shutdown()
        server.server_close()
        feeder.join()
    return Row("in-process", nodes, node_series, len(text), samples, fleet,
               statistics.median(times), report_us, *prom)


def through_registry(nodes: int, node_series: bool, template: Path, work: Path) -> Row:
    """bench.fleet's simulated nodes, every edge reporting, on a real ``registry serve``."""
    root = work / f"registry-{nodes}-{'on' if node_series else 'off'}"
    home = root / "registry"
    shutil.copytree(template, home)
    options = Options(busy_every=1, rows_per_s=20.0, centers=2, capacity_rows_s=400.0,
                      wave=1, wave_pace_per_s=25.0, rest_s=0.0)
    registry = start_registry(home, root, TOKEN, env={
        "HOME": str(root), "REGISTRY_NODE_SERIES": str(node_series).lower()})
    workers = None
    try:
        workers = Workers(plans(nodes, options, registry.target, root / "stores", 1, 2), root)
        workers.ask(cmd="go")
        wait_all(workers, 1, nodes, 600.0, f"connect ({nodes})")
        time.sleep(INTERVAL_S + 3.0)  # every node's first report (at a random point in it)
        began = time.perf_counter()
        text = httpx.get(registry.metrics_url, timeout=60).text
        fetch_s = time.perf_counter() - began
        samples, fleet = page_counts(text)
        prom = scraped(f"127.0.0.1:{registry.metrics_port}", root / "prometheus")
    finally:
        if workers is not None:
            workers.stop()
        registry.stop()
    return Row("registry serve", nodes, node_series, len(text.encode()), samples, fleet,
               fetch_s, float("nan"), *prom)
