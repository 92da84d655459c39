"""The registry's Prometheus series: sync traffic, every node's last quality report, and the
fleet's aggregates of them (``registry.server.fleet_series``).

The per-node series (``registry_node_*``, one per report field and node) are rendered as text
once per report, not at each scrape, and served after prometheus_client's own: at 5,000
reporting nodes its labelled gauges held 67 MiB and a scrape formatted 90,000 samples again
(1 s of CPU on the registry's process, 3-7 s while it served the nodes: bench.fleet). A large
fleet turns them off (``REGISTRY_NODE_SERIES=false``) and keeps the aggregates, whose series
are bounded by the releases and regions."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, ThreadingWSGIServer
from prometheus_client.utils import floatToGoString

from registry.server.fleet_series import FleetSeries
from registry.server.fleet_text import label_set

NODE = ["node", "tier", "region", "model", "version"]
DROPPED = {"ack": ("unknown-model", "malformed", "seq-not-pushed"),
           "report": ("unknown-model", "malformed")}
"""Why a node's message was dropped, per kind: the only label values that series takes."""
QUALITY = {  # report field -> (series, help, scale)
    "escalation_rate": ("escalation_rate", "Share of rows escalated to the center", 1.0),
    "degraded_rate": ("degraded_rate", "Share of rows answered degraded", 1.0),
    "p50_ms": ("p50_seconds", "Median request latency", 1e-3),
    "p99_ms": ("p99_seconds", "99th percentile request latency", 1e-3),
    "mean_tokens": ("mean_tokens", "Mean input length in tokens", 1.0),
    "length_drift": ("length_drift", "PSI of input lengths vs the node's baseline", 1.0),
    "capacity_rows_s": ("capacity_rows_per_second", "Rows per second a center offers to "
                        "escalations (0: not measured yet)", 1.0),
    "threshold": ("cascade_threshold", "An edge's gate threshold", 1.0),
    "budget_rows_s": ("escalation_budget_rows_per_second", "An edge's escalation budget "
                      "(0: none, calibrated threshold)", 1.0),
    "shed_rate": ("shed_rate", "Share of rows answered edge-shed (over budget at the floor)",
                  1.0),
    "audit_agreement": ("audit_agreement", "Edge-center agreement on an edge's audit sample",
                        1.0),
    "audit_expected": ("audit_expected_agreement", "Agreement the calibration predicts for "
                       "the same rows", 1.0),
    "drift": ("drift", "1 while an edge's audit says its traffic drifted", 1.0),
    "confidence_psi": ("confidence_psi", "PSI of an edge's recent confidences against the "
                       "calibration split's", 1.0),
    "confidence_drift": ("confidence_drift", "1 while an edge's confidences have shifted",
                         1.0),
    "estimated_accuracy": ("estimated_accuracy", "Live cascade accuracy estimated from the "
                           "audit", 1.0),
    "input_shift": ("input_shift", "Largest standardised shift of an input statistic's mean "
                    "over the node's last 1,000 measured rows from the release's calibration "
                    "rows (0: no reference)", 1.0),
    "input_outliers": ("input_outliers", "Share of the node's last 1,000 measured rows with "
                       "an input statistic beyond 4 calibration stds", 1.0),
    "low_confidence_share": ("low_confidence_share", "Share of an edge's rows with confidence "
                             "below 0.3", 1.0),
    "fidelity": ("fidelity", "Top-1 agreement with the fp32 reference on the release probe, "
                 "measured on the node's own hardware (0: not measured)", 1.0),
}


class SyncMetrics:
    def __init__(self, registry: CollectorRegistry | None = None, node_series: bool = True,
                 stale_after_s: float = 30.0) -> None:
        """``node_series``: export the per-node series too; ``stale_after_s``: how long a
        node's last report counts in the fleet's gauges."""
        self.registry = r = registry or CollectorRegistry()
        ProcessCollector(registry=r)  # the process's CPU and memory (the resources panels)
        self.connected = Gauge("registry_sync_nodes_connected", "Nodes with an open Sync "
                               "stream", registry=r)
        self.connections = Counter("registry_sync_connections", "Sync streams opened (hellos "
                                   "accepted): rising faster than nodes join, nodes reconnect",
                                   registry=r)
        self.disconnections = Counter("registry_sync_disconnections", "Sync streams of "
                                      "connected nodes that ended", registry=r)
        self.pushes = Counter("registry_sync_releases_pushed", "Releases pushed to nodes",
                              registry=r)
        self.acks = Counter("registry_sync_acks", "Acknowledgements received", ["state"],
                            registry=r)
        self.bytes_sent = Counter("registry_sync_bytes_sent", "Artifact bytes sent by Fetch "
                                  "and Chunks (compressed chunks as sent)", registry=r)
        self.chunk_calls = Counter("registry_sync_chunk_calls", "Chunks calls (a node's request "
                                   "for the chunks of one artifact it lacks)", registry=r)
        self.chunks_sent = Counter("registry_sync_chunks_sent", "Chunks sent by Chunks calls",
                                   registry=r)
        self.fetches = Counter("registry_sync_fetches", "Fetch calls (resumed: offset > 0)",
                               ["resumed"], registry=r)
        self.denied = Counter("registry_auth_failures", "Calls refused for a missing or "
                              "wrong token", registry=r)
        self.witness_conflicts = Counter(
            "registry_audit_witness_conflicts", "Hellos showing an audit witness (this "
            "registry's signed word of its chain's head) that the chain no longer holds: "
            "records were removed or rewritten (`registry audit --verify` names them)",
            registry=r)
        self.nodes = NodeSeries() if node_series else None
        self.fleet = FleetSeries(stale_after_s)
        self.dropped = Counter("registry_sync_dropped", "Acks and quality reports dropped: "
                               "for a model (version) not pushed to that node nor held by it, "
                               "or malformed", ["kind", "reason"], registry=r)
        for kind, reasons in DROPPED.items():
            for reason in reasons:
                self.dropped.labels(kind, reason)
        self.rollout_state = Gauge("registry_rollout_state", "1 for the state the newest wave "
                                   "rollout of a model is in (registry publish --waves)",
                                   ["model", "state"], registry=r)
        self.rollout_wave = Gauge("registry_rollout_wave", "The wave the newest wave rollout "
                                  "of a model is at (1 = the first)", ["model"], registry=r)
        self.rollout_held = Gauge("registry_rollout_held", "1 while the newest wave rollout of "
                                  "a model is held because its gate could not judge (reason "
                                  "not-measured: too few audited nodes or rows; undecided: one "
                                  "node's word would decide): a person resumes it with a "
                                  "reason or aborts it", ["model", "reason"], registry=r)

    def rollouts(self, latest: list[tuple[str, str, int, str | None]],
                 states: tuple[str, ...], holds: tuple[str, ...] = ()) -> None:
        """Each model's newest wave rollout as (model, state, wave, why it is held or None):
        its state's series 1, the others' 0, so an alert on ``state="halted"`` or on
        ``registry_rollout_held`` fires and clears."""
        for model, state, wave, held in latest:
            for name in states:
                self.rollout_state.labels(model, name).set(1.0 if name == state else 0.0)
            self.rollout_wave.labels(model).set(wave)
            for reason in holds:
                self.rollout_held.labels(model, reason).set(1.0 if reason == held else 0.0)

    def report(self, labels: list[str], report: dict[str, Any]) -> None:
        """Export one node's report (``labels``: node, tier, region, model, version); the
        series of its previous version are dropped."""
        self.fleet.report(labels, report)
        if self.nodes is not None:
            self.nodes.report(labels, report)

    def exposition(self) -> bytes:
        """The /metrics page: the text format (0.0.4), the fleet's then the per-node series
        last."""
        nodes = self.nodes.render() if self.nodes is not None else ""
        return generate_latest(self.registry) + (self.fleet.render() + nodes).encode()

    def replication(self, roles: Any) -> None:
        """The replication series, read from ``roles`` (``registry.server.app.Roles``) and the
        database at each scrape."""
        self.registry.register(_Replication(roles))


class _Replication:
    def __init__(self, roles: Any) -> None:
        self.roles = roles

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Any:
        import sqlite3

        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        roles = self.roles
        primary = roles.server.service.refusing is None
        yield GaugeMetricFamily("registry_replication_primary", "1 while this registry accepts "
                                "writes and serves nodes (primary or standalone), 0 as a "
                                "standby", value=1.0 if primary else 0.0)
        follower = roles.follower if roles.following is not None else None
        lag = (max(follower.primary_position - follower.position, 0)
               if follower is not None else 0)
        yield GaugeMetricFamily("registry_replication_lag_changes", "A standby: changes the "
                                "primary has that it does not (0 on a primary)", value=lag)
        yield GaugeMetricFamily("registry_replication_standbys_following", "A primary: standby "
                                "streams open now", value=roles.server.replication.streams)
        yield CounterMetricFamily("registry_replication_snapshots", "A standby: snapshots it "
                                  "replaced its database with",
                                  value=follower.snapshots if follower else 0)
        try:
            with sqlite3.connect(f"file:{roles.settings.database}?mode=ro", uri=True,
                                 timeout=1) as conn:
                row = conn.execute("SELECT async_commits, term, (SELECT max(id) FROM changes) "
                                   "FROM replication_state WHERE id = 1").fetchone()
        except sqlite3.Error:
            return
        yield CounterMetricFamily("registry_replication_async_commits", "Changes acknowledged "
                                  "by the primary alone: no standby held them within "
                                  "REGISTRY_SYNC_TIMEOUT_S", value=row[0])
        yield GaugeMetricFamily("registry_replication_term", "The term this registry last "
                                "knew (raised at each promotion)", value=row[1])
        yield GaugeMetricFamily("registry_replication_position", "The newest change this "
                                "registry holds", value=row[2] or 0)


def _labels(labels: Iterable[str]) -> str:
    return label_set(NODE, labels)


class NodeSeries:
    """Every node's last quality report (``registry_node_*`` gauges, one per ``QUALITY``
    field) and the requests each node reported per version (``registry_node_requests_total``),
    as text lines made when the report arrives; ``render`` only joins them, each family's
    lines together as the text format wants."""

    def __init__(self) -> None:
        self._gauges: dict[tuple[str, str], list[str]] = {}  # (node, model) -> a line a field
        self._requests: dict[tuple[str, ...], float] = {}  # labels -> requests so far
        self._lock = threading.Lock()  # reports come on the event loop, scrapes on a thread

    def report(self, labels: list[str], report: dict[str, Any]) -> None:
        """One node's report of one model version: it replaces the node's last for the
        model (its previous version's gauges go)."""
        shown = _labels(labels)
        lines = []
        for field, (name, _, scale) in QUALITY.items():
            value = report.get(field, 0.0)
            number = float(value) * scale if isinstance(value, int | float) else 0.0
            lines.append(f"registry_node_{name}{shown} {floatToGoString(number)}\n")
        key = tuple(labels)
        with self._lock:
            self._gauges[(labels[0], labels[3])] = lines
            self._requests[key] = self._requests.get(key, 0.0) + int(report.get("requests", 0))

    def render(self) -> str:
        with self._lock:
            gauges = list(self._gauges.values())
            requests = list(self._requests.items())
        out = []
        for i, (name, text, _) in enumerate(QUALITY.values()):
            out.append(f"# HELP registry_node_{name} {text}\n# TYPE registry_node_{name} gauge\n")
            out.extend(lines[i] for lines in gauges)
        out.append("# HELP registry_node_requests_total Requests nodes reported\n"
                   "# TYPE registry_node_requests_total counter\n")
        out.extend(f"registry_node_requests_total{_labels(labels)} {floatToGoString(total)}\n"
                   for labels, total in requests)
        return "".join(out)


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def serve_http(metrics: SyncMetrics, host: str, port: int) -> WSGIServer:
    """/metrics (``SyncMetrics.exposition``) on ``host:port``, a thread per request; stop it
    with ``shutdown()``."""
    def app(environ: dict[str, Any], start: Callable[..., Any]) -> list[bytes]:
        if environ.get("PATH_INFO") not in ("/", "/metrics"):
            start("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found\n"]
        body = metrics.exposition()
        start("200 OK", [("Content-Type", CONTENT_TYPE_PLAIN_0_0_4),
                         ("Content-Length", str(len(body)))])
        return [body]

    class Server(ThreadingWSGIServer):
        address_family = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                            flags=socket.AI_PASSIVE)[0][0]

    server = make_server(host, port, app, Server, handler_class=_Quiet)
    threading.Thread(target=server.serve_forever, name="registry-metrics", daemon=True).start()
    return server
