"""The edge's own Prometheus series, on the process registry next to the ones every tier has
(``serving.telemetry.metrics``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from prometheus_client import Counter, Gauge, Histogram

from serving.release.manifest import Manifest
from serving.runtime import classify
from serving.runtime.batcher import Finish
from serving.telemetry.metrics import MV, Metrics

CONFIDENCE = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0)


class EdgeMetrics:
    """The cascade's, the controller's and the audit's series."""

    def __init__(self, metrics: Metrics) -> None:
        self.quality = metrics.quality
        r = metrics.registry
        self.rows_by_tier = Counter("edge_rows", "Rows answered, by tier (edge, center, "
                                    "edge-degraded)", [*MV, "tier"], registry=r)
        self.cache_hits = Counter("edge_cache_hits", "Rows answered from the response cache",
                                  MV, registry=r)
        self.confidence = Histogram("edge_confidence", "Edge model confidence per row", MV,
                                    buckets=CONFIDENCE, registry=r)
        self.center_seconds = Histogram("edge_center_call_duration_seconds", "Escalation "
                                        "calls to the center", registry=r)
        self.escalated_bytes = Counter("edge_escalated_input_bytes_total", "Input bytes the "
                                       "edge sent to centers for escalated rows (their "
                                       "smallest faithful form)", ["model"], registry=r)
        self.circuit_open = Gauge("edge_center_circuit_open", "1 while a center's circuit is "
                                  "open", ["center"], registry=r)
        self.threshold_now = Gauge("edge_cascade_threshold", "The gate's threshold now (the "
                                   "controller's, or the calibrated one)", ["model"], registry=r)
        self.budget_now = Gauge("edge_cascade_budget_rows_per_second", "Escalated rows per "
                                "second the registry's budget allows (0: no budget)", ["model"],
                                registry=r)
        self.audit_rows = Counter("edge_audit_rows", "Rows the edge answered itself that were "
                                  "also sent to the center (the live audit)", MV, registry=r)
        self.audit_agreement = Gauge("edge_audit_agreement", "Edge-center agreement on the "
                                     "audit window", MV, registry=r)
        self.audit_expected = Gauge("edge_audit_expected_agreement", "Agreement the "
                                    "calibration split predicts for the same rows", MV,
                                    registry=r)
        self.audit_drift = Gauge("edge_audit_drift", "1 while live agreement is below the "
                                 "calibration's by more than drift_z standard deviations", MV,
                                 registry=r)
        self.estimated_accuracy = Gauge("edge_estimated_accuracy", "Live cascade accuracy "
                                        "estimated from the audit (no labels)", MV, registry=r)
        self.confidence_psi = Gauge("edge_confidence_psi", "PSI of the last 2,000 rows' edge "
                                    "confidences against the calibration split's", MV,
                                    registry=r)
        self.confidence_drift = Gauge("edge_confidence_drift", "1 while the edge's "
                                      "confidences have shifted from the calibration split's",
                                      MV, registry=r)
        self.input_shift = Gauge("edge_input_shift", "Largest standardised shift of an input "
                                 "statistic's mean from the release's calibration rows, over "
                                 "the last 1,000 rows the model ran (0: no reference, no "
                                 "rows)", MV, registry=r)
        self.input_outliers = Gauge("edge_input_outliers", "Share of the last 1,000 rows the "
                                    "model ran with an input statistic beyond 4 calibration "
                                    "stds", MV, registry=r)
        self.low_confidence = Gauge("edge_low_confidence_share", "Share of the last report "
                                    "window's rows with edge confidence below 0.3", MV,
                                    registry=r)
        self._tier_counters: dict[tuple[str, int, str], Any] = {}

    def tier_rows(self, model: str, version: int, tier: str) -> Any:
        """The ``edge_rows`` child for these labels, looked up once (a labels() call per
        request was a measurable share of the hot path)."""
        key = (model, version, tier)
        found = self._tier_counters.get(key)
        if found is None:
            found = self._tier_counters[key] = self.rows_by_tier.labels(model, str(version),
                                                                        tier)
        return found

    def reported(self, report: dict[str, Any]) -> None:
        """A drained quality report's input drift and low-confidence share as gauges (the
        quality window's ``outflows``)."""
        labels = (report["model"], str(report["version"]))
        self.input_shift.labels(*labels).set(report["input_shift"])
        self.input_outliers.labels(*labels).set(report["input_outliers"])
        self.low_confidence.labels(*labels).set(report["low_confidence_share"])

    def finisher(self, manifest: Manifest,
                 observe: Callable[[np.ndarray], None] | None = None) -> Finish:
        """Per model call, in the batcher's thread: logits -> probabilities, and the call's
        confidences into the histogram, the quality report and ``observe`` (once per call, not
        per request). The repository's ``finisher``."""
        model, version = manifest.name, manifest.version
        histogram = self.confidence.labels(model, str(version))
        quality = self.quality

        def finish(logits: np.ndarray) -> np.ndarray:
            probabilities = classify.softmax(logits)
            top = probabilities.max(axis=1)
            confidence = top.tolist()
            for value in confidence:
                histogram.observe(value)
            quality.confidence(model, version, confidence)
            if observe is not None:
                observe(top)
            return probabilities

        return finish
