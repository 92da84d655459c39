"""The edge tier's orchestration: cache -> batched INT8 model -> gate -> center -> merge."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from edge import gate
from edge.audit import Audit
from edge.cache import Cached, ResponseCache
from edge.centers import CenterURL
from edge.controller import Controller
from edge.escalation import Centers, CenterUnavailable
from edge.metrics import EdgeMetrics
from edge.settings import EdgeSettings
from edge.threshold import ThresholdPolicy
from serving.fleet.discovery import SERVICES, Instance, OnChange
from serving.protocol import v2
from serving.runtime import classify
from serving.runtime.repository import Repository, Resident
from serving.telemetry import tracing
from serving.telemetry.logs import request_id
from serving.telemetry.metrics import Metrics

log = logging.getLogger(__name__)


class EdgeService:
    """Answers a request through the cascade. Its parts hold the rest: the threshold
    (``policy``), the audit, the centers, the edge's series (``stats``); ``edge.build`` makes
    them for the wiring (``edge.cli``)."""

    name = "tiered-edge"
    platform = "onnxruntime_onnx"

    def __init__(self, settings: EdgeSettings, *, metrics: Metrics, stats: EdgeMetrics,
                 repository: Repository, cache: ResponseCache, center: Centers,
                 policy: ThresholdPolicy, audit: Audit) -> None:
        self.settings, self.metrics, self.stats = settings, metrics, stats
        self.repository, self.cache, self.center = repository, cache, center
        self.policy, self.audit = policy, audit

    async def infer(self, resident: Resident, parsed: v2.Parsed) -> v2.InferResponse:
        m = resident.manifest
        rows = parsed.inputs.rows
        decision = self.policy.decide(m, parsed.parameters)
        threshold, controller = decision.threshold, decision.controller
        if not self.cache.enabled:  # no keys to hash, nothing to look up
            ordered = await self._cascade(resident, parsed, rows, list(range(len(rows))),
                                          threshold, controller)
            return self._respond(resident, parsed, rows, ordered, threshold, cached=0)
        keys = [self.cache.key(m.name, resident.version, decision.cache_key, r) for r in rows]
        hits, misses = self.cache.lookup(keys)
        fresh = await self._cascade(resident, parsed, rows, misses, threshold, controller)
        for i, answer in zip(misses, fresh, strict=True):
            self.cache.put(keys[i], answer)
        answers = hits | dict(zip(misses, fresh, strict=True))
        ordered = [answers[i] for i in range(len(rows))]
        return self._respond(resident, parsed, rows, ordered, threshold, cached=len(hits))

    def _respond(self, resident: Resident, parsed: v2.Parsed, rows: list[np.ndarray],
                 answers: list[Cached], threshold: float, cached: int) -> v2.InferResponse:
        """Merge the rows' answers (in request order) into the response; count them."""
        m = resident.manifest
        tiers = [a.tier for a in answers]
        if cached:
            self.stats.cache_hits.labels(m.name, str(resident.version)).inc(cached)
        self.metrics.quality.rows(m.name, resident.version,
                                  [resident.codec.cost(r) for r in rows], tiers)
        for tier in set(tiers):
            self.stats.tier_rows(m.name, resident.version, tier).inc(tiers.count(tier))
        parameters: dict[str, Any] = {
            "edge_version": resident.version, "threshold": threshold,
            "escalated": tiers.count("center"), "degraded": tiers.count("edge-degraded"),
            "shed": tiers.count("edge-shed"), "node_id": self.settings.node_id,
            "region": self.settings.region}
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
                       indices: list[int], threshold: float,
                       controller: Controller | None = None) -> list[Cached]:
        """Answers for ``rows[i]``, i in ``indices``, in that order: the edge model's, the
        unsure ones replaced by the center's (or marked degraded when no center answers, shed
        when the controller's budget is spent)."""
        if not indices:
            return []
        edge = await resident.batcher.submit([rows[i] for i in indices])  # probabilities
        answers = [Cached(p, "edge") for p in edge]
        confidence = edge.max(axis=1)
        if controller is not None:
            controller.observe(confidence)
        with tracing.span("gate", **{"tiered.threshold": threshold}) as decided:
            unsure = gate.unsure(edge, threshold).tolist()
            if controller is not None and unsure:
                granted = controller.admit(len(unsure))
                if granted < len(unsure):  # over budget: the least confident rows go first
                    unsure.sort(key=confidence.__getitem__)
                    for j in unsure[granted:]:
                        answers[j] = Cached(edge[j], "edge-shed")
                    unsure = sorted(unsure[:granted])
            if decided is not None:
                decided.set_attributes({"tiered.rows": len(indices),
                                        "tiered.escalated": len(unsure),
                                        "tiered.confidence": float(confidence.min())})
        if unsure:
            escalated = await self._escalate(resident, parsed, [indices[j] for j in unsure],
                                             [answers[j] for j in unsure])
            for j, answer in zip(unsure, escalated, strict=True):
                answers[j] = answer
        self.audit.sample(resident, parsed, indices, answers, confidence, controller)
        return answers

    def notes(self) -> list[str]:
        """What the readiness answer (and so the Consul check's output) should say."""
        return self.audit.notes()

    async def _escalate(self, resident: Resident, parsed: v2.Parsed,
                        indices: list[int], edge: list[Cached]) -> list[Cached]:
        """The center's answers for the request's rows ``indices``; the edge's own, marked
        ``edge-degraded``, when no center answers."""
        m = resident.manifest
        forms = parsed.inputs.forward(indices)  # the rows' smallest faithful form
        self.stats.escalated_bytes.labels(m.name).inc(sum(len(t.raw or b"") for t in forms))
        try:
            with self.stats.center_seconds.time():
                answer = await self.center.classify(m.name, forms, len(indices),
                                                    request_id.get(), len(m.labels))
        except CenterUnavailable as exc:
            log.warning("center unavailable, answering %d rows degraded: %s", len(indices), exc)
            return [Cached(e.probabilities, "edge-degraded") for e in edge]
        finally:
            for url, state in self.center.circuits().items():
                self.stats.circuit_open.labels(url).set(1 if state == "open" else 0)
        return [Cached(p.copy(), "center", answer.version) for p in answer.probabilities]

    def watches(self) -> dict[str, OnChange]:
        return {SERVICES["center"]: self._centers}

    def _centers(self, instances: list[Instance]) -> None:
        """Escalate to the centers Consul says are passing (over gRPC to those that registered
        a gRPC port, with ``escalation`` grpc); the configured ones when none is."""
        tls = self.settings.center_ca is not None
        found = []
        for instance in instances:
            try:
                found.append(CenterURL.discovered(instance, self.settings.escalation, tls,
                                                  self.settings.center_tls_name == "node"))
            except ValueError as exc:  # over TLS, a center whose id no certificate can name
                log.warning("center %s skipped: %s", instance.service_id, exc)
        self.center.follow(found)

    async def stop(self) -> None:
        await self.audit.stop()
        await self.center.close()
