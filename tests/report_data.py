"""Thirty days of a small fleet's series as OpenMetrics text with timestamps, for backfilling a
real Prometheus (``promtool tsdb create-blocks-from openmetrics``) that ``tiered report`` then
reads. Every figure the report shows is known from the construction:

- a sample every 5 minutes from ``end - 30d + 5m`` to ``end`` (8,640 per series);
- ``edge-eu-1`` down for 1 hour (12 scrapes) ending 7d 1h before ``end``, and restarted then:
  its counters start again from 0 (a counter reset); ``edge-us-1`` and ``center-1`` never down;
  the registry down for 30 minutes (6 scrapes) ending 6 days before ``end``;
- per edge and 5 minutes, release ``sentiment`` v1: 999 requests answered, 1 failed, rows by
  tier edge 1,600, center 300, edge-degraded 80, edge-shed 20; v2: 490 answered, 10 failed,
  rows edge 450, center 45, edge-degraded 5 (no shed series at all); latencies in known
  buckets (``V1``, ``V2``); the live audit sent 16 of v1's edge rows to the center;
- the center, per 5 minutes: v1 150 requests answered, v2 45 answered and 5 failed, all in
  (0.1, 0.25] s; rows inferred v1 600, v2 90.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

STEP = 300
SAMPLES = 8640  # 30 days
EDGE_OUTAGE = (7 * 86400 + 2 * 3600, 7 * 86400 + 3600)  # seconds before end: (from, to]
REGISTRY_OUTAGE = (6 * 86400 + 1800, 6 * 86400)
EDGES = ("edge-eu-1", "edge-us-1")
BOUNDS = ("0.025", "0.05", "0.1", "0.25", "0.5", "+Inf")


@dataclass(frozen=True)
class Release:
    """One release's traffic per edge and 5 minutes."""

    version: str
    success: int
    failure: int
    rows: dict[str, int]
    buckets: tuple[int, ...]  # cumulative, one per BOUNDS
    millis: int  # the durations' sum, in ms
    audited: int = 0  # edge rows also sent to the center


V1 = Release("1", 999, 1, {"edge": 1600, "center": 300, "edge-degraded": 80, "edge-shed": 20},
             (0, 900, 995, 1000, 1000, 1000), 900 * 40 + 95 * 75 + 5 * 200, audited=16)
V2 = Release("2", 490, 10, {"edge": 450, "center": 45, "edge-degraded": 5},
             (0, 300, 300, 450, 500, 500), 300 * 40 + 150 * 200 + 50 * 400)
CENTER = {"1": (150, 0, 600), "2": (45, 5, 90)}  # answered, failed, rows per 5 minutes

# one counter: (metric name, labels, increment per sample, divisor of the written value)
Counter = tuple[str, dict[str, str], int, int]


def text(**pairs: str) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in pairs.items()) + "}"


def is_down(ago: int, outage: tuple[int, int] | None) -> bool:
    return outage is not None and outage[1] <= ago < outage[0]


def times(end: int) -> list[tuple[int, int]]:
    """(timestamp, seconds before end) of every sample, oldest first."""
    return [(end - k * STEP, k * STEP) for k in range(SAMPLES - 1, -1, -1)]


def target(job: str, node: str, region: str, port: int) -> dict[str, str]:
    return {"job": job, "instance": f"127.0.0.1:{port}", "node": node, "region": region,
            "tier": job}


TARGETS = {"edge-eu-1": target("edge", "edge-eu-1", "eu", 8201),
           "edge-us-1": target("edge", "edge-us-1", "us", 8202),
           "center-1": target("center", "center-1", "core", 8100),
           "registry": target("registry", "registry", "core", 9100)}
OUTAGES = {"edge-eu-1": EDGE_OUTAGE, "registry": REGISTRY_OUTAGE}


def edge_counters(node: str) -> list[Counter]:
    found: list[Counter] = []
    for r in (V1, V2):
        mv = {**TARGETS[node], "model": "sentiment", "version": r.version}
        found += [("edge_request_success_total", mv, r.success, 1),
                  ("edge_request_failure_total", {**mv, "reason": "model"}, r.failure, 1),
                  ("edge_request_duration_seconds_count", mv, r.success + r.failure, 1),
                  ("edge_request_duration_seconds_sum", mv, r.millis, 1000)]
        found += [("edge_request_duration_seconds_bucket", {**mv, "le": b}, n, 1)
                  for b, n in zip(BOUNDS, r.buckets, strict=True)]
        found += [("edge_rows_total", {**mv, "tier": t}, n, 1) for t, n in r.rows.items()]
        if r.audited:
            found.append(("edge_audit_rows_total", mv, r.audited, 1))
    return found


def center_counters() -> list[Counter]:
    found: list[Counter] = []
    for version, (ok, failed, rows) in CENTER.items():
        mv = {**TARGETS["center-1"], "model": "sentiment", "version": version}
        found += [("center_request_success_total", mv, ok, 1),
                  ("center_request_failure_total", {**mv, "reason": "model"}, failed, 1),
                  ("center_inference_count_total", mv, rows, 1),
                  ("center_request_duration_seconds_count", mv, ok + failed, 1),
                  ("center_request_duration_seconds_sum", mv, (ok + failed) * 200, 1000)]
        found += [("center_request_duration_seconds_bucket", {**mv, "le": b},
                   0 if i < 3 else ok + failed, 1) for i, b in enumerate(BOUNDS)]
    return found


def counter_lines(node: str, counters: list[Counter], end: int) -> Iterator[str]:
    """Each counter of ``node``, one series after the other; a node that is down exports
    nothing and counts again from 0 when it is back (edge-eu-1's restart)."""
    for metric, labels, step, divisor in counters:
        total = 50_000 * divisor  # running long before the window
        name = metric + text(**labels)
        for t, ago in times(end):
            if is_down(ago, OUTAGES.get(node)):
                total = 0
                continue
            total += step
            yield f"{name} {total / divisor if divisor > 1 else total} {t}"


def lines(end: int) -> Iterator[str]:
    for node, labels in TARGETS.items():
        for t, ago in times(end):
            yield f"up{text(**labels)} {0 if is_down(ago, OUTAGES.get(node)) else 1} {t}"
    for node in EDGES:
        yield from counter_lines(node, edge_counters(node), end)
    yield from counter_lines("center-1", center_counters(), end)
    yield "# EOF"


def write(path: Path, end: int) -> Path:
    """The OpenMetrics file of the fleet's 30 days up to ``end`` (Unix seconds)."""
    with path.open("w") as out:
        for line in lines(end):
            out.write(line + "\n")
    return path
