"""Which threshold the gate uses for a request, decided in one place.

Precedence: the request's ``parameters.threshold`` > the edge's ``threshold`` setting > the
model's budget controller (``edge.controller``) > the release's calibrated threshold. The
edge's setting is a fixed threshold: no budget holds it and nothing is shed. A request's
threshold picks which rows that request wants escalated, never how many: while the edge runs
a controller, the budget's bucket holds those rows as it holds the rows below the controller's
floor, the rest come back ``edge-shed`` (anyone reaching ``/v2/`` may send it, so it must not
spend more of the centers than the registry gave this edge). The controller's own rows above
its floor are never shed (``Decision.promised``). The controller itself answers the calibrated
threshold while the registry has given no budget.

The repository tells the policy when a version becomes the default (``activated``): its
calibration then sets the controller's default and floor, so requests never compare versions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edge.controller import Controller
from edge.metrics import EdgeMetrics
from edge.settings import EdgeSettings
from serving.errors import BadRequest
from serving.protocol.budget import Budget
from serving.release.manifest import Manifest


@dataclass(frozen=True)
class Decision:
    threshold: float
    controller: Controller | None  # None: no budget holds the escalations, nothing is shed
    requested: bool = False  # the request's own threshold (held to the budget all the same)

    @property
    def cache_key(self) -> float:
        """The threshold the response cache keys answers by: the controller's answers share one
        key space (a moving threshold would empty the cache); a request's own threshold keys
        its answers apart from them."""
        moving = (not self.requested and self.controller is not None
                  and self.controller.controlled)
        return -1.0 if moving else self.threshold

    @property
    def promised(self) -> float:
        """Rows below it that find no budget are shed: a request's own threshold (it asked for
        them), else the controller's floor (the accuracy it will not trade away). Rows between
        it and ``threshold`` only spend spare capacity: without budget they are the edge's."""
        if self.requested or self.controller is None:
            return self.threshold
        return min(self.threshold, self.controller.floor)


def requested(value: Any) -> float:
    """A request's ``parameters.threshold``: 0 = never escalate, 1 = always."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise BadRequest("parameters.threshold must be a number between 0 and 1")
    return float(value)


class ThresholdPolicy:
    """The thresholds of this edge's models, one controller per model (unless the
    ``controller`` setting is off or the ``threshold`` setting fixes it). Fed the registry's
    budgets (``set_budget``) and the repository's activations."""

    def __init__(self, settings: EdgeSettings, metrics: EdgeMetrics) -> None:
        self.settings, self.metrics = settings, metrics
        self.controllers: dict[str, Controller] = {}
        self.budgets: dict[str, Budget] = {}  # the registry's latest, per model
        self._shown: dict[str, float] = {}  # the threshold last exported to /metrics

    @property
    def controlled(self) -> bool:
        """Whether models get a controller at all."""
        return self.settings.controller != "off" and self.settings.threshold is None

    def decide(self, manifest: Manifest, parameters: dict[str, Any]) -> Decision:
        """The threshold for a request to ``manifest``'s model with these parameters."""
        value = parameters.get("threshold")
        if value is not None:  # (null: the edge's own, budget and all)
            own = requested(value)
            held = self._controller(manifest) if self.controlled else None
            return Decision(own, held, requested=True)
        if self.controlled:
            controller = self._controller(manifest)
            threshold = controller.threshold()
            if self._shown.get(manifest.name) != threshold:
                self._shown[manifest.name] = threshold
                self.metrics.threshold_now.labels(manifest.name).set(threshold)
            return Decision(threshold, controller)
        setting = self.settings.threshold
        return Decision(manifest.calibration.threshold if setting is None else setting, None)

    def _controller(self, manifest: Manifest) -> Controller:
        return self.controllers.get(manifest.name) or self._start(manifest)

    def _start(self, manifest: Manifest) -> Controller:
        s = self.settings
        found = self.controllers[manifest.name] = Controller(
            manifest.calibration, floor_tolerance=s.floor_tolerance, window=s.controller_window,
            horizon_s=s.controller_horizon_s, target=s.budget_target, burst_s=s.burst_s)
        found.set_budget(self.budgets.get(manifest.name, Budget(False)))
        return found

    def activated(self, manifest: Manifest) -> None:
        """A new default version (the repository's listener): its calibration sets the
        controller's default threshold and floor."""
        if not self.controlled:
            return
        found = self.controllers.get(manifest.name)
        if found is None:
            self._start(manifest)
        else:
            found.release(manifest.calibration, self.settings.floor_tolerance)

    def dropped(self, manifest: Manifest) -> None:
        """A version no longer resident: nothing to do (the controller follows the default)."""

    def set_budget(self, model: str, budget: Budget) -> None:
        """The registry's budget for ``model`` (from the sync stream)."""
        self.budgets[model] = budget
        self.metrics.budget_now.labels(model).set(
            budget.rows_per_s if budget.controlled else 0.0)
        found = self.controllers.get(model)
        if found is not None:
            found.set_budget(budget)

    def report(self, model: str, version: int) -> dict[str, Any]:
        """The controller's part of a quality report: its threshold and what it holds to."""
        found = self.controllers.get(model)
        if found is None:
            return {}
        out: dict[str, Any] = {"threshold": found.threshold()}
        budget = self.budgets.get(model)
        if budget is not None and budget.controlled:
            out["budget_rows_s"] = budget.rows_per_s
        return out
