"""Prometheus metrics named after the service, labelled by model and version (Triton's set)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector

from serving.telemetry.quality import QualityWindow, Throughput

LATENCY = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
BATCH = (1, 2, 4, 8, 16, 32, 64, 128, 256)
MV = ["model", "version"]


@dataclass(frozen=True)
class BatchStats:
    """One batch the batcher (``serving.runtime.batcher``) ran, as the metrics observe it."""

    rows: int
    requests: int
    queue_seconds: float  # of the oldest request
    compute_seconds: float
    calls: int = 1  # model calls the batch was split into (length groups)
    tokens: int = 0  # real tokens in the batch
    padded_tokens: int = 0  # token positions computed: each group's rows x its longest row


Observer = Callable[[BatchStats], None]


class Metrics:
    """One registry per process (fresh ones in tests); tiers add their own series to it."""

    def __init__(self, prefix: str, registry: CollectorRegistry | None = None) -> None:
        self.prefix = prefix
        self.registry = registry or CollectorRegistry()
        self.quality = QualityWindow()  # drained into the registry's quality reports
        self.throughput: dict[tuple[str, int], Throughput] = {}  # per model version
        self._answered: dict[tuple[str, int], tuple[Any, Any]] = {}
        r = self.registry
        # process_cpu_seconds_total, process_resident_memory_bytes, ...: the dashboard's
        # resources panels (a fresh registry has none of prometheus_client's default collectors)
        ProcessCollector(registry=r)
        self.request_success = Counter(f"{prefix}_request_success", "Inference requests "
                                       "answered", MV, registry=r)
        self.request_failure = Counter(f"{prefix}_request_failure", "Inference requests "
                                       "failed, by reason", [*MV, "reason"], registry=r)
        self.request_refused = Counter(f"{prefix}_request_refused", "Inference requests "
                                       "a guard refused (image bounds, parse queue full, parse "
                                       "deadline, client gone), by reason; each logs a "
                                       "warning", ["model", "reason"], registry=r)
        self.request_slow = Counter(f"{prefix}_request_slow", "Inference requests answered "
                                    "after more than slow_request_s; each logs a warning",
                                    ["model"], registry=r)
        self.probes = Counter(f"{prefix}_probe_requests", "Health checks and scrapes "
                              "(/v2/health/*, /metrics), counted here and logged at debug "
                              "level only", ["path", "status"], registry=r)
        self.request_duration = Histogram(f"{prefix}_request_duration_seconds",
                                          "End-to-end inference request time", MV,
                                          buckets=LATENCY, registry=r)
        self.inference_count = Counter(f"{prefix}_inference_count", "Rows inferred (batch "
                                       "elements)", MV, registry=r)
        self.execution_count = Counter(f"{prefix}_execution_count", "Model executions "
                                       "(batches); inference/execution = mean batch size", MV,
                                       registry=r)
        self.queue_duration = Histogram(f"{prefix}_queue_duration_seconds", "Time the oldest "
                                        "request of a batch waited", MV, buckets=LATENCY,
                                        registry=r)
        self.compute_duration = Histogram(f"{prefix}_compute_duration_seconds", "Model "
                                          "execution time per batch", MV, buckets=LATENCY,
                                          registry=r)
        self.fidelity = Gauge(f"{prefix}_model_fidelity", "Top-1 agreement with the fp32 "
                              "reference on the release probe, measured on this node at load "
                              "(also for versions it refused)", MV, registry=r)
        self.batch_size = Histogram(f"{prefix}_batch_size", "Rows per batch (one or more "
                                    "model executions, one per length group)", MV,
                                    buckets=BATCH, registry=r)
        self.tokens_useful = Counter(f"{prefix}_tokens_useful", "Real tokens in the rows "
                                     "inferred", MV, registry=r)
        self.tokens_computed = Counter(f"{prefix}_tokens_computed", "Token positions the "
                                       "model computed, padding included; useful/computed = "
                                       "what length-aware batching keeps of the work",
                                       MV, registry=r)

    def answered(self, model: str, version: int) -> tuple[Any, Any]:
        """The ``request_success`` and ``request_duration`` children of a model version, looked
        up once (two labels() calls per request were a measurable share of a cheap model's
        serving time)."""
        key = (model, version)
        found = self._answered.get(key)
        if found is None:
            labels = (model, str(version))
            found = self._answered[key] = (self.request_success.labels(*labels),
                                           self.request_duration.labels(*labels))
        return found

    def observer(self, model: str, version: int) -> Observer:
        labels = (model, str(version))
        inference, execution = (self.inference_count.labels(*labels),
                                self.execution_count.labels(*labels))
        useful, computed = self.tokens_useful.labels(*labels), self.tokens_computed.labels(*labels)
        queue, compute = (self.queue_duration.labels(*labels),
                          self.compute_duration.labels(*labels))
        size = self.batch_size.labels(*labels)
        throughput = self.throughput.setdefault((model, version), Throughput())

        def observe(stats: BatchStats) -> None:
            inference.inc(stats.rows)
            execution.inc(stats.calls)
            useful.inc(stats.tokens)
            computed.inc(stats.padded_tokens)
            queue.observe(stats.queue_seconds)
            compute.observe(stats.compute_seconds)
            size.observe(stats.rows)
            throughput.add(stats.rows, stats.compute_seconds)

        return observe
