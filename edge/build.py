"""The parts of an edge service, built for ``edge.cli`` (the wiring) and for tests: kept
apart from the command because it loads no transport (a test process may hold tritonclient's
``inference`` package, which the gRPC transport's stubs would clash with)."""

from __future__ import annotations

from pathlib import Path

import httpx

from edge.audit import Audit
from edge.cache import ResponseCache
from edge.centers import parse_list
from edge.escalation import Centers, Transports
from edge.metrics import EdgeMetrics
from edge.pipeline import EdgeService
from edge.runtime import OnnxRuntime
from edge.settings import EdgeSettings
from edge.threshold import ThresholdPolicy
from serving.release.manifest import Manifest
from serving.release.store import ModelStore
from serving.release.trust import node_trust
from serving.runtime.batcher import Finish
from serving.runtime.repository import Repository, VersionLoader
from serving.telemetry.metrics import Metrics


def build_centers(settings: EdgeSettings,
                  http: httpx.AsyncBaseTransport | None = None) -> Centers:
    """The escalation client over ``settings.center_url`` (until discovery lists centers);
    ``http``: the REST transport (tests pass a mock)."""
    return Centers(Transports(settings.center_timeout_s, settings.center_ca, http),
                   parse_list(settings.center_url), settings.breaker_failures,
                   settings.breaker_reset_s)


def build_service(settings: EdgeSettings, metrics: Metrics | None = None,
                  center: Centers | None = None) -> EdgeService:
    """An edge service and its parts; ``center``: by default ``build_centers(settings)``."""
    metrics = metrics or Metrics("edge")
    stats = EdgeMetrics(metrics)

    def load(manifest: Manifest, folder: Path) -> OnnxRuntime:
        return OnnxRuntime(folder / manifest.edge.file, settings.threads)

    center = center or build_centers(settings)
    audit = Audit(settings, center, stats)

    def finisher(manifest: Manifest) -> Finish:
        """The metrics' finisher; the audit's confidence window sees each call's rows too
        (every row the batcher computes reaches the gate)."""
        return stats.finisher(manifest, lambda c: audit.auditor(manifest).observe(c))

    store = ModelStore(settings.store, node_trust(settings.store, settings.release_key,
                                                    "edge"))
    repository = Repository(VersionLoader(store, "edge", load, settings, metrics,
                                          finisher=finisher))
    policy = ThresholdPolicy(settings, stats)
    repository.listen(policy)  # a new version's calibration reaches the controller
    metrics.quality.add_source(policy.report)
    metrics.quality.add_source(audit.report)
    metrics.quality.outflows.append(stats.reported)  # the last window's drift as gauges
    return EdgeService(settings, metrics=metrics, stats=stats, repository=repository,
                       cache=ResponseCache(settings.cache_size, settings.cache_ttl_s),
                       center=center, policy=policy, audit=audit)
