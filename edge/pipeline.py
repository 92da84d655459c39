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
from serving import classify, v2
from serving.discovery import SERVICES, Instance, OnChange
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

    def __init__(self, settings: EdgeSettings, metrics: Metrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics or Metrics("edge")
        self.cache = ResponseCache(settings.cache_size, settings.cache_ttl_s)
        self.static_centers = [u for u in (settings.center_url or "").split(",") if u.strip()]
        self.center = CenterClient(self.static_centers, settings.center_timeout_s,
                                   settings.breaker_failures, settings.breaker_reset_s,
                                   ca=settings.center_ca)

        def load(manifest: Manifest, folder: Path) -> OnnxRuntime:
            return OnnxRuntime(folder / manifest.edge.file, settings.threads)

        store = ModelStore(settings.store, node_verifier(settings.release_key, "edge"))
        self.repository = Repository(store, "edge", load, settings,
                                     self.metrics)
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
        probabilities = np.zeros((len(rows), len(m.labels)), dtype=np.float32)
        tiers = [""] * len(rows)
        center_versions: set[str] = set()
        keys = [self.cache.key(m.name, resident.version, threshold, r) for r in rows]
        misses = []
        for i, key in enumerate(keys):
            hit = self.cache.get(key)
            if hit is None:
                misses.append(i)
                continue
            probabilities[i], tiers[i] = hit.probabilities, hit.tier
            if hit.center_version:
                center_versions.add(hit.center_version)
        labels = {"model": m.name, "version": str(resident.version)}
        self.cache_hits.labels(**labels).inc(len(rows) - len(misses))
        if misses:
            answered_by = await self._answer(resident, parsed, rows, misses, threshold,
                                             probabilities, tiers)
            if answered_by:
                center_versions.add(answered_by)
            for i in misses:
                version = answered_by if tiers[i] == "center" else None
                self.cache.put(keys[i], Cached(probabilities[i].copy(), tiers[i], version))
        self.metrics.quality.rows(m.name, resident.version, [len(r) for r in rows], tiers)
        for tier in set(tiers):
            self.rows_by_tier.labels(**labels, tier=tier).inc(tiers.count(tier))
        parameters: dict[str, Any] = {
            "edge_version": resident.version, "threshold": threshold,
            "escalated": tiers.count("center"), "degraded": tiers.count("edge-degraded"),
            "node_id": self.settings.node_id, "region": self.settings.region}
        if center_versions:
            parameters["center_version"] = ",".join(sorted(center_versions))
        return classify.response(resident, parsed, probabilities, tiers, parameters)

    async def _answer(self, resident: Resident, parsed: v2.Parsed, rows: list[np.ndarray],
                      misses: list[int], threshold: float, probabilities: np.ndarray,
                      tiers: list[str]) -> str | None:
        """Edge answers for the uncached rows; the unsure ones replaced by the center's.

        Returns the version of the center model that answered, if one did."""
        edge = classify.softmax(await resident.batcher.submit([rows[i] for i in misses]))
        confidence = self.confidence.labels(resident.manifest.name, str(resident.version))
        for j, i in enumerate(misses):
            probabilities[i], tiers[i] = edge[j], "edge"
            confidence.observe(float(edge[j].max()))
        self.metrics.quality.confidence(resident.manifest.name, resident.version,
                                        edge.max(axis=1).tolist())
        unsure = [misses[j] for j in gate.unsure(edge, threshold)]
        if not unsure:
            return None
        texts = [parsed.texts[i] for i in unsure] if parsed.texts is not None else None
        try:
            with self.center_seconds.time():
                answer = await self.center.classify(
                    resident.manifest.name, texts, [rows[i] for i in unsure], request_id.get(),
                    len(resident.manifest.labels))
        except CenterUnavailable as exc:
            log.warning("center unavailable, answering %d rows degraded: %s", len(unsure), exc)
            for i in unsure:
                tiers[i] = "edge-degraded"
            return None
        else:
            for j, i in enumerate(unsure):
                probabilities[i], tiers[i] = answer.probabilities[j], "center"
            return answer.version
        finally:
            for url, state in self.center.circuits().items():
                self.circuit_open.labels(url).set(1 if state == "open" else 0)

    def watches(self) -> dict[str, OnChange]:
        return {SERVICES["center"]: self._centers}

    def _centers(self, instances: list[Instance]) -> None:
        """Escalate to the centers Consul says are passing; the static list when none is."""
        scheme = "https" if self.settings.center_ca is not None else "http"
        self.center.set_urls([f"{scheme}://{i.target}" for i in instances]
                             or self.static_centers)

    async def stop(self) -> None:
        await self.center.close()
