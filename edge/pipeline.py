"""The edge tier's orchestration: cache -> batched INT8 model -> gate -> center -> merge."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client import Counter, Gauge, Histogram

from edge import gate
from edge.audit import Auditor, AuditState
from edge.cache import Cached, ResponseCache
from edge.controller import Controller
from edge.escalation import CenterClient, CenterUnavailable
from edge.runtime import OnnxRuntime
from edge.settings import EdgeSettings
from serving.fleet.discovery import SERVICES, Instance, OnChange, host_port
from serving.protocol import v2
from serving.protocol.budget import Budget
from serving.release.manifest import Manifest
from serving.release.signing import node_verifier
from serving.release.store import ModelStore
from serving.runtime import classify
from serving.runtime.batcher import Finish
from serving.runtime.repository import Repository, Resident
from serving.telemetry import tracing
from serving.telemetry.logs import request_id
from serving.telemetry.metrics import MV, Metrics

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
        self.controllers: dict[str, Controller] = {}
        self.auditors: dict[tuple[str, int], Auditor] = {}
        self.budgets: dict[str, Budget] = {}  # the registry's latest, per model
        self._audits: set[asyncio.Task[None]] = set()
        self._tier_counters: dict[tuple[str, int, str], Any] = {}
        self.metrics.quality.add_source(self._report)

    async def infer(self, resident: Resident, parsed: v2.Parsed) -> v2.InferResponse:
        m = resident.manifest
        rows = classify.rows_of(resident, parsed)
        controller = self.controller(resident)
        if controller is None or "threshold" in parsed.parameters:  # fixed: no budget, no shed
            threshold = gate.threshold_for(parsed.parameters, m.calibration.threshold,
                                           self.settings.threshold)
            controller = None
        else:
            threshold = controller.threshold()
            if threshold != controller.shown:
                controller.shown = threshold
                self.threshold_now.labels(m.name).set(threshold)
        if not self.cache.enabled:  # no keys to hash, nothing to look up
            ordered = await self._cascade(resident, parsed, rows, list(range(len(rows))),
                                          threshold, controller)
            return self._respond(resident, parsed, rows, ordered, threshold, cached=0)
        # a moving threshold would empty the cache: controlled answers share one key space
        keyed = threshold if controller is None or not controller.controlled else -1.0
        keys = [self.cache.key(m.name, resident.version, keyed, r) for r in rows]
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
            self.cache_hits.labels(m.name, str(resident.version)).inc(cached)
        self.metrics.quality.rows(m.name, resident.version, [len(r) for r in rows], tiers)
        for tier in set(tiers):
            self._tier_rows(m.name, resident.version, tier).inc(tiers.count(tier))
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

    def _tier_rows(self, model: str, version: int, tier: str) -> Any:
        """The ``edge_rows`` child for these labels, looked up once (a labels() call per
        request was a measurable share of the hot path)."""
        key = (model, version, tier)
        found = self._tier_counters.get(key)
        if found is None:
            found = self._tier_counters[key] = self.rows_by_tier.labels(model, str(version),
                                                                        tier)
        return found

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
            escalated = await self._escalate(resident, parsed, rows, [indices[j] for j in unsure],
                                             [answers[j] for j in unsure])
            for j, answer in zip(unsure, escalated, strict=True):
                answers[j] = answer
        self._sample(resident, parsed, rows, indices, answers, confidence, controller)
        return answers

    # --- the controller and the audit (docs/cascade.md) ---------------------------------------

    def controller(self, resident: Resident) -> Controller | None:
        """This model's controller (None when the ``controller`` setting is off or the
        ``threshold`` setting fixes the threshold); follows the served version's calibration."""
        s = self.settings
        if s.controller == "off" or s.threshold is not None:
            return None
        m = resident.manifest
        found = self.controllers.get(m.name)
        if found is None:
            found = self.controllers[m.name] = Controller(
                m.calibration, floor_tolerance=s.floor_tolerance, window=s.controller_window,
                horizon_s=s.controller_horizon_s, target=s.budget_target, burst_s=s.burst_s)
            found.set_budget(self.budgets.get(m.name, Budget(False)))
            found.version = resident.version
        elif found.version != resident.version:
            found.release(m.calibration, s.floor_tolerance)
            found.version = resident.version
        return found

    def set_budget(self, model: str, budget: Budget) -> None:
        """The registry's budget for ``model`` (from the sync stream)."""
        self.budgets[model] = budget
        self.budget_now.labels(model).set(budget.rows_per_s if budget.controlled else 0.0)
        found = self.controllers.get(model)
        if found is not None:
            found.set_budget(budget)

    def auditor(self, manifest: Manifest) -> Auditor:
        key = (manifest.name, manifest.version)
        found = self.auditors.get(key)
        if found is None:
            s = self.settings
            for old in [k for k in self.auditors if k[0] == manifest.name]:
                del self.auditors[old]  # one version at a time: a new calibration, a new audit
            found = self.auditors[key] = Auditor(
                manifest.calibration, share=s.audit_share, window=s.audit_window,
                drift_z=s.drift_z, min_rows=s.audit_min_rows, psi_floor=s.drift_psi)
        return found

    def _sample(self, resident: Resident, parsed: v2.Parsed, rows: list[np.ndarray],
                indices: list[int], answers: list[Cached], confidence: np.ndarray,
                controller: Controller | None) -> None:
        """Send a random share of the rows the edge answered itself to the center too, in the
        background: the client's answer never waits for it, and it is skipped (not queued) when
        audits are already in flight or the budget has no room."""
        auditor = self.auditor(resident.manifest)
        auditor.observe(confidence)
        kept = [j for j, a in enumerate(answers) if a.tier == "edge"]
        auditor.traffic(len(answers), sum(a.tier != "center" for a in answers))
        picked = [kept[k] for k in auditor.pick(len(kept))]
        if not picked or len(self._audits) >= self.settings.audit_in_flight:
            return
        if controller is not None and not controller.take(len(picked)):
            return
        m = resident.manifest
        chosen = [indices[j] for j in picked]
        texts = [parsed.texts[i] for i in chosen] if parsed.texts is not None else None
        task = asyncio.get_running_loop().create_task(self._audit(
            auditor, m, texts, [rows[i] for i in chosen], confidence[picked],
            np.asarray([answers[j].probabilities.argmax() for j in picked])))
        self._audits.add(task)
        task.add_done_callback(self._audits.discard)

    async def _audit(self, auditor: Auditor, m: Manifest, texts: list[str] | None,
                     rows: list[np.ndarray], confidence: np.ndarray, edge: np.ndarray) -> None:
        try:
            answer = await self.center.classify(m.name, texts, rows, None, len(m.labels))
        except CenterUnavailable:  # no center: nothing to compare, the row is not counted
            return
        auditor.record(confidence, edge, answer.probabilities.argmax(axis=1))
        labels = (m.name, str(m.version))
        self.audit_rows.labels(*labels).inc(len(rows))
        state = auditor.state()
        self.audit_agreement.labels(*labels).set(state.agreement)
        if state.expected is not None:
            self.audit_expected.labels(*labels).set(state.expected)
        self.audit_drift.labels(*labels).set(1 if state.drift else 0)
        if state.estimated_accuracy is not None:
            self.estimated_accuracy.labels(*labels).set(state.estimated_accuracy)
        self._export_confidence(labels, state)

    def _export_confidence(self, labels: tuple[str, str], state: AuditState) -> None:
        if state.confidence_psi is not None:
            self.confidence_psi.labels(*labels).set(state.confidence_psi)
            self.confidence_drift.labels(*labels).set(1 if state.confidence_drift else 0)

    def _report(self, model: str, version: int) -> dict[str, Any]:
        """The controller's and the audit's part of a quality report."""
        out: dict[str, Any] = {}
        found = self.controllers.get(model)
        budget = self.budgets.get(model)
        if found is not None:  # the controller runs here: its threshold and what it holds to
            out["threshold"] = found.threshold()
            if budget is not None and budget.controlled:
                out["budget_rows_s"] = budget.rows_per_s
        auditor = self.auditors.get((model, version))
        if auditor is None:
            return out
        state = auditor.state()
        if state.confidence_psi is not None:
            out |= {"confidence_psi": state.confidence_psi,
                    "confidence_drift": state.confidence_drift}
            self._export_confidence((model, str(version)), state)
        if auditor.audited:
            out |= {"audit_rows": state.rows, "audit_agreement": state.agreement,
                    "audit_interval": state.interval, "drift": state.drift}
            if state.expected is not None:
                out["audit_expected"] = state.expected
            if state.estimated_accuracy is not None:
                out |= {"estimated_accuracy": state.estimated_accuracy,
                        "accuracy_interval": state.accuracy_interval}
        return out

    def notes(self) -> list[str]:
        """What the readiness answer (and so the Consul check's output) should say."""
        notes = []
        for (model, version), auditor in sorted(self.auditors.items()):
            state = auditor.state()
            if state.drift and state.expected is not None:
                notes.append(f"drift: {model} v{version} agrees with the center on "
                             f"{state.agreement:.1%} ± {state.interval:.1%} of audited rows, "
                             f"calibration predicts {state.expected:.1%}")
            if state.confidence_drift and state.confidence_psi is not None:
                notes.append(f"drift: {model} v{version} edge confidences moved from the "
                             f"calibration split's (PSI {state.confidence_psi:.2f} over the "
                             f"last rows)")
        return notes

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
        for task in list(self._audits):
            task.cancel()
        await asyncio.gather(*self._audits, return_exceptions=True)
        await self.center.close()
