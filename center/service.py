"""The center tier: the full-precision model behind the V2 escalation API."""

from __future__ import annotations

from typing import Any

from center.settings import CenterSettings
from serving.fleet.discovery import OnChange
from serving.protocol import v2
from serving.runtime import classify
from serving.runtime.repository import Repository, Resident
from serving.telemetry import tracing
from serving.telemetry.metrics import Metrics


class CenterService:
    name = "tiered-center"
    platform = "pytorch_libtorch"

    def __init__(self, settings: CenterSettings, metrics: Metrics,
                 repository: Repository) -> None:
        """Built by ``center.build.build_service``, which also reports ``report`` (capacity)."""
        self.settings, self.metrics, self.repository = settings, metrics, repository

    def capacity(self, model: str, version: int) -> float | None:
        """Rows per second this center offers to escalations of ``model``: the setting, else
        the measured throughput at the latency target x headroom (None until measured)."""
        if self.settings.capacity_rows_s is not None:
            return self.settings.capacity_rows_s
        measured = self.metrics.throughput.get((model, version))
        s = self.settings
        # a batch waits for the one computing: each may take half the latency target
        rate = (measured.rows_per_s(s.max_batch_size, s.latency_target_ms / 2000)
                if measured is not None else None)
        return None if rate is None else rate * s.capacity_headroom

    def report(self, model: str, version: int) -> dict[str, Any]:
        capacity = self.capacity(model, version)
        return {} if capacity is None else {"capacity_rows_s": capacity}

    def notes(self) -> list[str]:
        return []

    async def infer(self, resident: Resident, parsed: v2.Parsed) -> v2.InferResponse:
        rows = parsed.inputs.rows
        probabilities = await resident.batcher.submit(rows)  # softmax: per batch
        self.metrics.quality.rows(resident.manifest.name, resident.version,
                                  [resident.codec.cost(r) for r in rows],
                                  ["center"] * len(rows))
        if resident.drift is not None:
            self.metrics.quality.inputs(resident.manifest.name, resident.version,
                                        resident.drift.measure(rows))
        if tracing.active():
            tracing.set_attributes(**{"tiered.tier": "center", "tiered.rows": len(rows),
                                      "tiered.confidence": float(probabilities.max(axis=1).min(
                                          initial=1.0))})
        return classify.response(resident, parsed, probabilities, ["center"] * len(rows),
                                 {"center_version": resident.version})

    def watches(self) -> dict[str, OnChange]:
        return {}

    async def stop(self) -> None:
        return None
