"""The parts of a center service, built for ``center.cli`` (the wiring) and for tests: kept
apart from the command because it loads no transport (a test process may hold tritonclient's
``inference`` package, which the gRPC transport's stubs would clash with)."""

from __future__ import annotations

from pathlib import Path

from center.runtime import TorchScriptRuntime, pick_device
from center.service import CenterService
from center.settings import CenterSettings
from serving.release.manifest import Manifest
from serving.release.store import ModelStore
from serving.release.trust import node_trust
from serving.runtime import classify
from serving.runtime.repository import Repository, VersionLoader
from serving.telemetry.metrics import Metrics


def build_service(settings: CenterSettings, metrics: Metrics | None = None) -> CenterService:
    """A center service over the store ``settings`` names."""
    metrics = metrics or Metrics("center")
    device = pick_device(settings.device)

    def load(manifest: Manifest, folder: Path) -> TorchScriptRuntime:
        return TorchScriptRuntime(folder / manifest.center.file, device, settings.precision,
                                  settings.threads, [i.name for i in manifest.inputs],
                                  manifest.logits)

    store = ModelStore(settings.store, node_trust(settings.store, settings.release_key,
                                                    "center"))
    repository = Repository(VersionLoader(store, "center", load, settings, metrics,
                                          finisher=lambda _: classify.softmax))
    service = CenterService(settings, metrics, repository)
    metrics.quality.add_source(service.report, idle=True)  # capacity, also idle
    return service
