"""The report's figures over a window, each one PromQL query (``increase`` handles counter
resets): availability per tier (scrapes up; requests answered), p50/p99/mean latency, requests
and rows, and per release the rows by the tier that answered them."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from tiered.report.query import Prometheus
from tiered.report.window import UP, Window

TIERS = ("edge", "center", "registry")
SERVING = ("edge", "center")  # the tiers that answer requests: their series' prefix
ROWS = {"edge": "sum{by}(increase(edge_rows_total[{w}]))",  # every row an edge answered
        "center": "sum{by}(increase(center_inference_count_total[{w}]))"}
Key = tuple[str, ...]


@dataclass(frozen=True)
class Requests:
    requests: float  # answered + failed
    failed: float
    availability: float | None  # share answered
    p50_ms: float | None
    p99_ms: float | None
    mean_ms: float | None


@dataclass(frozen=True)
class Rows:
    """Rows by the tier that answered them (``edge_rows_total``'s ``tier``)."""

    total: float
    edge: float  # answered at the edge: each one a row the center did not compute
    escalated: float  # answered by the center
    degraded: float  # the center unreachable: the edge's answer, marked
    shed: float  # over the escalation budget: the edge's answer, marked
    audited: float  # answered at the edge and also sent to the center (the live audit)
    edge_share: float | None  # edge / total
    center_avoided: float  # rows the center never computed: edge - audited

    @classmethod
    def of(cls, by_tier: dict[str, float], audited: float = 0.0) -> Rows:
        total = sum(by_tier.values())
        edge = by_tier.get("edge", 0.0)
        return cls(total, edge, by_tier.get("center", 0.0), by_tier.get("edge-degraded", 0.0),
                   by_tier.get("edge-shed", 0.0), audited, edge / total if total else None,
                   max(edge - audited, 0.0))


@dataclass(frozen=True)
class Tier:
    name: str
    nodes: int  # scraped in the window
    availability: float | None  # share of scrapes up
    requests: Requests | None  # None: the tier answers no inference requests (registry)
    rows: float | None


@dataclass(frozen=True)
class Release:
    model: str
    version: str
    requests: Requests  # at the edges
    rows: Rows


@dataclass(frozen=True)
class NodeUptime:
    tier: str
    node: str
    availability: float
    down_seconds: float  # estimated: down scrapes x the node's mean scrape interval


@dataclass(frozen=True)
class Report:
    prometheus: str
    window: Window
    tiers: list[Tier]
    releases: list[Release]
    rows: Rows  # every edge's rows
    nodes: list[NodeUptime] = field(default_factory=list)  # the least available, below 100%


def by(prom: Prometheus, query: str, labels: Key, at: float,
       group: Key | None = None) -> dict[Key, float]:
    """``query`` per value of ``labels``: its ``{by}`` is the grouping (``labels``, or
    ``group`` where a histogram also needs ``le``)."""
    grouped = query.replace("{by}", f" by ({', '.join(labels if group is None else group)}) ")
    return {tuple(m.get(k, "") for k in labels): v for m, v in prom.instant(grouped, at)}


def requests(prom: Prometheus, prefix: str, w: Window, labels: Key) -> dict[Key, Requests]:
    """Requests answered and failed, latency quantiles and mean, per value of ``labels``."""
    r, at = w.range, w.end
    ok = by(prom, f"sum{{by}}(increase({prefix}_request_success_total[{r}]))", labels, at)
    failed = by(prom, f"sum{{by}}(increase({prefix}_request_failure_total[{r}]))", labels, at)
    quantiles = {q: by(prom, f"histogram_quantile({q}, sum{{by}}(increase("
                             f"{prefix}_request_duration_seconds_bucket[{r}])))", labels, at,
                       ("le", *labels)) for q in (0.5, 0.99)}
    mean = by(prom, f"sum{{by}}(increase({prefix}_request_duration_seconds_sum[{r}])) / "
                    f"sum{{by}}(increase({prefix}_request_duration_seconds_count[{r}]))",
              labels, at)
    found = {}
    for key in ok.keys() | failed.keys():
        total = ok.get(key, 0.0) + failed.get(key, 0.0)
        found[key] = Requests(total, failed.get(key, 0.0),
                              ok.get(key, 0.0) / total if total else None,
                              ms(quantiles[0.5].get(key)), ms(quantiles[0.99].get(key)),
                              ms(mean.get(key)))
    return found


def ms(seconds: float | None) -> float | None:
    return seconds * 1000 if seconds is not None and seconds == seconds else None


def scrapes(prom: Prometheus, w: Window) -> dict[Key, tuple[float, float]]:
    """Per (tier, node): scrapes up and scrapes in all."""
    labels = ("job", "node")
    up = by(prom, f"sum{{by}}(sum_over_time({UP}[{w.range}]))", labels, w.end)
    count = by(prom, f"sum{{by}}(count_over_time({UP}[{w.range}]))", labels, w.end)
    return {key: (up.get(key, 0.0), n) for key, n in count.items()}


def gather(prom: Prometheus, w: Window, worst: int = 10) -> Report:
    nodes = scrapes(prom, w)
    per_tier: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for (job, _), counts in nodes.items():
        per_tier[job].append(counts)
    served = {t: requests(prom, t, w, ()).get(()) for t in SERVING}
    rows = {t: by(prom, q.replace("{w}", w.range), (), w.end).get(()) for t, q in ROWS.items()}
    tiers = [Tier(t, len(per_tier[t]),
                  sum(u for u, _ in per_tier[t]) / sum(n for _, n in per_tier[t])
                  if per_tier[t] else None, served.get(t), rows.get(t)) for t in TIERS]
    mv = ("model", "version")
    by_release: dict[Key, dict[str, float]] = defaultdict(dict)
    for (model, version, tier), n in by(prom, f"sum{{by}}(increase(edge_rows_total"
                                              f"[{w.range}]))", (*mv, "tier"), w.end).items():
        by_release[(model, version)][tier] = n
    audited = by(prom, f"sum{{by}}(increase(edge_audit_rows_total[{w.range}]))", mv, w.end)
    edge_requests = requests(prom, "edge", w, mv)
    empty = Requests(0.0, 0.0, None, None, None, None)
    releases = [Release(m, v, edge_requests.get((m, v), empty),
                        Rows.of(by_release[(m, v)], audited.get((m, v), 0.0)))
                for m, v in sorted(by_release.keys() | edge_requests.keys(), key=release_order)]
    everything: dict[str, float] = defaultdict(float)
    for tiers_rows in by_release.values():
        for tier, n in tiers_rows.items():
            everything[tier] += n
    return Report(prom.url, w, tiers, releases, Rows.of(everything, sum(audited.values())),
                  least_available(nodes, w, worst))


def release_order(key: Key) -> tuple[str, int, str]:
    model, version = key
    return model, int(version) if version.isdigit() else -1, version


def least_available(nodes: dict[Key, tuple[float, float]], w: Window,
                    worst: int) -> list[NodeUptime]:
    """The ``worst`` nodes with a scrape down, least available first."""
    down = [NodeUptime(job, node, up / n, (n - up) * w.covered / n)
            for (job, node), (up, n) in nodes.items() if n and up < n]
    return sorted(down, key=lambda d: (d.availability, d.tier, d.node))[:worst]
