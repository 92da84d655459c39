"""The edge tier's orchestration: cache -> batched INT8 model -> gate -> center -> merge."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from edge import gate
from edge.audit import Audit
from edge.cache import Answers, ResponseCache
from edge.centers import CenterURL
from edge.escalation import Centers, CenterUnavailable
from edge.metrics import EdgeMetrics
from edge.settings import EdgeSettings
from edge.threshold import Decision, ThresholdPolicy
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
        threshold = decision.threshold
        if not self.cache.enabled:  # no keys to hash, nothing to look up
            answers = await self._cascade(resident, parsed, rows, list(range(len(rows))),
                                          decision)
            return self._respond(resident, parsed, rows, answers, threshold, cached=0)
        keys = [self.cache.key(m.name, resident.version, decision.cache_key, r) for r in rows]
        hits, misses = self.cache.lookup(keys)
        fresh = await self._cascade(resident, parsed, rows, misses, decision)
        for k, i in enumerate(misses):
            self.cache.put(keys[i], fresh.row(k))
        return self._respond(resident, parsed, rows, Answers.merged(hits, misses, fresh),
                             threshold, cached=len(hits))

    def _respond(self, resident: Resident, parsed: v2.Parsed, rows: list[np.ndarray],
                 answers: Answers, threshold: float, cached: int) -> v2.InferResponse:
        """The rows' answers (in request order) as the response; count them."""
        m = resident.manifest
        tiers = answers.tiers
        if cached:
            self.stats.cache_hits.labels(m.name, str(resident.version)).inc(cached)
        cost = resident.codec.cost
        self.metrics.quality.rows(m.name, resident.version, [cost(r) for r in rows], tiers)
        counts = {tier: tiers.count(tier) for tier in set(tiers)}
        for tier, count in counts.items():
            self.stats.tier_rows(m.name, resident.version, tier).inc(count)
        parameters: dict[str, Any] = {
            "edge_version": resident.version, "threshold": threshold,
            "escalated": counts.get("center", 0), "degraded": counts.get("edge-degraded", 0),
            "shed": counts.get("edge-shed", 0), "node_id": self.settings.node_id,
            "region": self.settings.region}
        center_versions = {v for v in answers.versions if v}
        if center_versions:
            parameters["center_version"] = ",".join(sorted(center_versions))
        if tracing.active():
            tracing.set_attributes(**{
                "tiered.tier": "+".join(sorted(counts)), "tiered.threshold": threshold,
                "tiered.rows": len(tiers), "tiered.escalated": counts.get("center", 0),
                "tiered.degraded": counts.get("edge-degraded", 0), "tiered.cached": cached,
                "tiered.confidence": float(answers.probabilities.max(axis=1).min())
                if len(tiers) else 1.0,
                "tiered.center_version": ",".join(sorted(center_versions))})
        return classify.response(resident, parsed, answers.probabilities, tiers, parameters)

    async def _cascade(self, resident: Resident, parsed: v2.Parsed, rows: list[np.ndarray],
                       indices: list[int], decision: Decision) -> Answers:
        """Answers for ``rows[i]``, i in ``indices``, in that order: the edge model's, the
        unsure ones replaced by the center's (or marked degraded when no center answers, shed
        when the controller's budget has no room for a row below ``decision.promised``)."""
        threshold, controller = decision.threshold, decision.controller
        if not indices:
            return Answers.empty(len(resident.manifest.labels))
        ran = [rows[i] for i in indices]
        edge = await resident.batcher.submit(ran)  # probabilities
        if resident.drift is not None:  # the rows the edge model ran, not the cached ones
            self.metrics.quality.inputs(resident.manifest.name, resident.version,
                                        resident.drift.measure(ran))
        answers = Answers(edge, ["edge"] * len(indices), [None] * len(indices))
        confidence = edge.max(axis=1)
        if controller is not None:
            controller.observe(confidence)
        with tracing.span("gate", **{"tiered.threshold": threshold}) as decided:
            unsure = gate.unsure(confidence, threshold)
            if controller is not None and unsure:  # the least confident rows go first
                unsure, shed = controller.admit(confidence, unsure, decision.promised)
                for j in shed:
                    answers.tiers[j] = "edge-shed"
            if decided is not None:
                decided.set_attributes({"tiered.rows": len(indices),
                                        "tiered.escalated": len(unsure),
                                        "tiered.confidence": float(confidence.min())})
        if unsure:
            answers.probabilities = edge.copy()  # the batcher's rows stay the edge's own
            await self._escalate(resident, parsed, indices, unsure, answers)
        self.audit.sample(resident, parsed, indices, answers, confidence, controller)
        return answers

    def notes(self) -> list[str]:
        """What the readiness answer (and so the Consul check's output) should say."""
        return self.audit.notes()

    async def _escalate(self, resident: Resident, parsed: v2.Parsed, indices: list[int],
                        unsure: list[int], answers: Answers) -> None:
        """The center's answers in ``answers`` for its rows ``unsure`` (the request's rows
        ``indices[j]``); the edge's own, marked ``edge-degraded``, when no center answers."""
        m = resident.manifest
        forms = parsed.inputs.forward([indices[j] for j in unsure])  # smallest faithful form
        self.stats.escalated_bytes.labels(m.name).inc(sum(len(t.raw or b"") for t in forms))
        try:
            with self.stats.center_seconds.time():
                answer = await self.center.classify(m.name, forms, len(unsure),
                                                    request_id.get(), len(m.labels))
        except CenterUnavailable as exc:
            log.warning("center unavailable, answering %d rows degraded: %s", len(unsure), exc)
            for j in unsure:
                answers.tiers[j] = "edge-degraded"
            return
        finally:
            for url, state in self.center.circuits().items():
                self.stats.circuit_open.labels(url).set(1 if state == "open" else 0)
        answers.probabilities[unsure] = answer.probabilities
        for j in unsure:
            answers.tiers[j], answers.versions[j] = "center", answer.version

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
