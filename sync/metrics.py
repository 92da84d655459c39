"""The registry's Prometheus series: sync traffic and every node's last quality report."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

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
    "fidelity": ("fidelity", "Top-1 agreement with the fp32 reference on the release probe, "
                 "measured on the node's own hardware (0: not measured)", 1.0),
}


class SyncMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = r = registry or CollectorRegistry()
        self.connected = Gauge("registry_sync_nodes_connected", "Nodes with an open Sync "
                               "stream", registry=r)
        self.pushes = Counter("registry_sync_releases_pushed", "Releases pushed to nodes",
                              registry=r)
        self.acks = Counter("registry_sync_acks", "Acknowledgements received", ["state"],
                            registry=r)
        self.bytes_sent = Counter("registry_sync_bytes_sent", "Artifact bytes sent by Fetch",
                                  registry=r)
        self.fetches = Counter("registry_sync_fetches", "Fetch calls (resumed: offset > 0)",
                               ["resumed"], registry=r)
        self.denied = Counter("registry_auth_failures", "Calls refused for a missing or "
                              "wrong token", registry=r)
        self.quality = {key: Gauge(f"registry_node_{name}", text, NODE, registry=r)
                        for key, (name, text, _) in QUALITY.items()}
        self.requests = Counter("registry_node_requests", "Requests nodes reported", NODE,
                                registry=r)
        self.dropped = Counter("registry_sync_dropped", "Acks and quality reports dropped: "
                               "for a model (version) not pushed to that node nor held by it, "
                               "or malformed", ["kind", "reason"], registry=r)
        for kind, reasons in DROPPED.items():
            for reason in reasons:
                self.dropped.labels(kind, reason)
        self._labels: dict[tuple[str, str], list[str]] = {}

    def report(self, labels: list[str], report: dict[str, Any]) -> None:
        """Export one node's report; the series of its previous version are dropped."""
        key = (labels[0], labels[3])
        previous = self._labels.get(key)
        if previous is not None and previous != labels:
            for gauge in self.quality.values():
                gauge.remove(*previous)
        self._labels[key] = labels
        for field, (_, _, scale) in QUALITY.items():
            value = report.get(field, 0.0)
            self.quality[field].labels(*labels).set(
                float(value) * scale if isinstance(value, int | float) else 0.0)
        self.requests.labels(*labels).inc(int(report.get("requests", 0)))

    def replication(self, roles: Any) -> None:
        """The replication series, read from ``roles`` (``registry.serve.Roles``) and the
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
