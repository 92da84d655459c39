"""The threshold policy: the request's threshold > the edge's setting > the budget controller >
the calibrated threshold; a new version's calibration arrives by the repository's listener."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from edge.metrics import EdgeMetrics
from edge.settings import EdgeSettings
from edge.threshold import ThresholdPolicy
from serving.errors import BadRequest
from serving.protocol.budget import Budget
from serving.release.manifest import Calibration, Manifest
from serving.telemetry.metrics import Metrics
from tests.unit.serving.test_store import manifest as store_manifest


def release(version: int, threshold: float) -> Manifest:
    return msgspec.structs.replace(store_manifest(version), calibration=Calibration(
        source="test", threshold=threshold))


def policy(**settings: Any) -> ThresholdPolicy:
    return ThresholdPolicy(EdgeSettings(**settings), EdgeMetrics(Metrics("edge")))


def test_precedence_request_then_setting_then_controller_then_calibrated() -> None:
    m = release(3, 0.8)
    auto = policy()
    assert auto.decide(m, {}).threshold == 0.8 and auto.decide(m, {}).controller is not None
    fixed = auto.decide(m, {"threshold": 0})  # held to the model's budget all the same
    assert fixed.threshold == 0.0 and fixed.controller is auto.controllers["sentiment"]
    assert fixed.cache_key == 0.0
    assert auto.decide(m, {"threshold": None}) == auto.decide(m, {})  # null: the edge's own
    assert policy(controller="off").decide(m, {"threshold": 1}).controller is None
    assert policy(threshold=0.6).decide(m, {}).threshold == 0.6
    assert policy(threshold=0.6).decide(m, {}).controller is None
    assert policy(threshold=0.6).decide(m, {"threshold": 1}).threshold == 1.0
    off = policy(controller="off").decide(m, {})
    assert off.threshold == 0.8 and off.controller is None
    for bad in (1.5, -0.1, "high", True):
        with pytest.raises(BadRequest):
            auto.decide(m, {"threshold": bad})


def test_the_controller_follows_activations_and_budgets() -> None:
    p = policy()
    p.activated(release(3, 0.8))
    assert p.decide(release(3, 0.8), {}).threshold == 0.8
    p.activated(release(4, 0.7))  # told, not polled: the next request sees v4's calibration
    decision = p.decide(release(4, 0.7), {})
    assert decision.threshold == 0.7 and decision.cache_key == 0.7
    p.set_budget("sentiment", Budget(True, rows_per_s=10.0))
    controlled = p.decide(release(4, 0.7), {})
    assert controlled.cache_key == -1.0  # a moving threshold: one key space
    asked = p.decide(release(4, 0.7), {"threshold": 1})
    assert asked.cache_key == 1.0 and asked.controller is controlled.controller
    assert p.report("sentiment", 4) == {"threshold": 0.7, "budget_rows_s": 10.0}
    assert policy(controller="off").report("sentiment", 4) == {}
