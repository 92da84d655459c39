"""The edge tier's orchestration: cache -> batched INT8 model -> gate -> center -> merge."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client import Counter, Gauge, Histogram

from edge import gate
from edge.cache import Cached, ResponseCache
from edge.escalation import CenterClient, CenterUnavailable
from edge.runtime import OnnxRuntime
from edge.settings import EdgeSettings
from serving import classify, tracing, v2
from serving.batcher import Finish
from serving.discovery import SERVICES, Instance, OnChange, host_port
from serving.logs import request_id
from serving.manifest import Manifest
from serving.metrics import MV, Metrics
from serving.repository import Repository, Resident
from serving.signing import node_verifier
from serving.store import ModelStore

log = logging.getLogger(__name__)
CONFIDENCE = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0)


class EdgeService:
    name = "tiered-edge"
    platform = "onnxruntime_onnx"

    def __init__(self, settings: EdgeSettings, metrics: Metrics | None = None,
                 center: CenterClient | None = None) -> None:
        """``center``: the escalation client; by default one over ``settings.center_url``
        that follows the centers Consul lists."""
        self.settings = settings
        self.metrics = metrics or Metrics("edge")
        self.cache = ResponseCache(settings.cache_size, settings.cache_ttl_s)
        self.static_centers = [u for u in (settings.center_url or "").split(",") if u.strip()]
        self.center = center or CenterClient(
            self.static_centers, settings.center_timeout_s, settings.breaker_failures,
            settings.breaker_reset_s, ca=settings.center_ca)

        def load(manifest: Manifest, folder: Path) -> OnnxRuntime:
            return OnnxRuntime(folder / manifest.edge.file, settings.threads)

        store = ModelStore(settings.store, node_verifier(settings.release_key, "edge"))
        self.repository = Repository(store, "edge", load, settings, self.metrics,
                                     finisher=self._finisher)
        r = self.metrics.registry
        self.rows_by_tier = Counter("edge_rows", "Rows answered, by tier (edge, center, "
                                    "edge-degraded)", [*MV, "tier"], registry=r)
        self.cache_hits = Counter("edge_cache_hits", "Rows answered from the response cache",
                                  MV, registry=r)
        self.confidence = Histogram("edge_confidence", "Edge model confidence per row", MV,
                                    buckets=CONFIDENCE, registry=r)
        self.center_seconds = Histogram("edge_center_call_duration_seconds", "Escalation "
                                        "calls to the center", registry=r)
        self.circuit_open = Gauge("edge_center_circuit_open", "1 while a center's circuit is "
                                  "open", ["center"], registry=r)

    async def infer(self, resident: Resident, parsed: v2.Parsed) -> v2.InferResponse:
        m = resident.manifest
        rows = classify.rows_of(resident, parsed)
        threshold = gate.threshold_for(parsed.parameters, m.calibration.threshold,
                                       self.settings.threshold)
        if not self.cache.enabled:  # no keys to hash, nothing to look up
            ordered = await self._cascade(resident, parsed, rows, list(range(len(rows))),
                                          threshold)
            return self._respond(resident, parsed, rows, ordered, threshold, cached=0)
        keys = [self.cache.key(m.name, resident.version, threshold, r) for r in rows]
        hits, misses = self.cache.lookup(keys)
        fresh = await self._cascade(resident, parsed, rows, misses, threshold)
        for i, answer in zip(misses, fresh, strict=True):
            self.cache.put(keys[i], answer)
        answers = hits | dict(zip(misses, fresh, strict=True))
        ordered = [answers[i] for i in range(len(rows))]
        return self._respond(resident, parsed, rows, ordered, threshold, cached=len(hits))

    def _respond(self, resident: Resident, parsed: v2.Parsed, rows: list[np.ndarray],
                 answers: list[Cached], threshold: float, cached: int) -> v2.InferResponse:
        """Merge the rows' answers (in request order) into the response; count them."""
        m = resident.manifest
        labels = {"model": m.name, "version": str(resident.version)}
        tiers = [a.tier for a in answers]
        self.cache_hits.labels(**labels).inc(cached)
        self.metrics.quality.rows(m.name, resident.version, [len(r) for r in rows], tiers)
        for tier in set(tiers):
            self.rows_by_tier.labels(**labels, tier=tier).inc(tiers.count(tier))
        parameters: dict[str, Any] = {
            "edge_version": resident.version, "threshold": threshold,
            "escalated": tiers.count("center"), "degraded": tiers.count("edge-degraded"),
            "node_id": self.settings.node_id, "region": self.settings.region}
        center_versions = {a.center_version for a in answers if a.center_version}
        if center_versions:
            parameters["center_version"] = ",".join(sorted(center_versions))
        if tracing.active():
            confidence = [float(a.probabilities.max()) for a in answers]
            tracing.set_attributes(**{
                "tiered.tier": "+".join(sorted(set(tiers))), "tiered.threshold": threshold,
                "tiered.rows": len(answers), "tiered.escalated": tiers.count("center"),
                "tiered.degraded": tiers.count("edge-degraded"), "tiered.cached": cached,
                "tiered.confidence": min(confidence, default=1.0),
                "tiered.center_version": ",".join(sorted(center_versions))})
        probabilities = (np.stack([a.probabilities for a in answers]) if answers
                         else np.zeros((0, len(m.labels)), dtype=np.float32))
        return classify.response(resident, parsed, probabilities, tiers, parameters)

    async def _cascade(self, resident: Resident, parsed: v2.Parsed, rows: list[np.ndarray],
                       indices: list[int], threshold: float) -> list[Cached]:
        """Answers for ``rows[i]``, i in ``indices``, in that order: the edge model's, the
        unsure ones replaced by the center's (or marked degraded when no center answers)."""
        if not indices:
            return []
        edge = await resident.batcher.submit([rows[i] for i in indices])  # probabilities
        answers = [Cached(p, "edge") for p in edge]
        with tracing.span("gate", **{"tiered.threshold": threshold}) as decided:
            unsure = gate.unsure(edge, threshold).tolist()
            if decided is not None:
                decided.set_attributes({"tiered.rows": len(indices),
                                        "tiered.escalated": len(unsure),
                                        "tiered.confidence": float(edge.max(axis=1).min())})
        if unsure:
            escalated = await self._escalate(resident, parsed, rows, [indices[j] for j in unsure],
                                             [answers[j] for j in unsure])
            for j, answer in zip(unsure, escalated, strict=True):
                answers[j] = answer
        return answers

    def _finisher(self, manifest: Manifest) -> Finish:
        """Per model call, in the batcher's thread: logits -> probabilities, and the calls'
        confidence into the histogram and the quality report (once per call, not per request)."""
        model, version = manifest.name, manifest.version
        histogram = self.confidence.labels(model, str(version))
        quality = self.metrics.quality

        def finish(logits: np.ndarray) -> np.ndarray:
            probabilities = classify.softmax(logits)
            confidence = probabilities.max(axis=1).tolist()
            for value in confidence:
                histogram.observe(value)
            quality.confidence(model, version, confidence)
            return probabilities

        return finish

    async def _escalate(self, resident: Resident, parsed: v2.Parsed, rows: list[np.ndarray],
                        indices: list[int], edge: list[Cached]) -> list[Cached]:
        """The center's answers for ``rows[i]``, i in ``indices``; the edge's own, marked
        ``edge-degraded``, when no center answers."""
        m = resident.manifest
        texts = [parsed.texts[i] for i in indices] if parsed.texts is not None else None
        try:
            with self.center_seconds.time():
                answer = await self.center.classify(m.name, texts, [rows[i] for i in indices],
                                                    request_id.get(), len(m.labels))
        except CenterUnavailable as exc:
            log.warning("center unavailable, answering %d rows degraded: %s", len(indices), exc)
            return [Cached(e.probabilities, "edge-degraded") for e in edge]
        finally:
            for url, state in self.center.circuits().items():
                self.circuit_open.labels(url).set(1 if state == "open" else 0)
        return [Cached(p.copy(), "center", answer.version) for p in answer.probabilities]

    def watches(self) -> dict[str, OnChange]:
        return {SERVICES["center"]: self._centers}

    def _centers(self, instances: list[Instance]) -> None:
        """Escalate to the centers Consul says are passing (over gRPC to those that registered
        a gRPC port, with ``escalation`` grpc); the static list when none is."""
        tls = self.settings.center_ca is not None
        urls = []
        for i in instances:
            grpc_port = i.grpc_port if self.settings.escalation == "grpc" else None
            if grpc_port:
                urls.append(f"{'grpcs' if tls else 'grpc'}://{host_port(i.address, grpc_port)}")
            else:
                urls.append(f"{'https' if tls else 'http'}://{i.target}")
        self.center.set_urls(urls or self.static_centers)

    async def stop(self) -> None:
        await self.center.close()
