"""The cascade's accuracy-vs-escalation curve and its goal: pure arithmetic on logits and
labels (no servers), shared by the measurement and the report."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

GOAL_TOLERANCE = 0.005  # accuracy (fraction) the cascade may lose against center-only
GOAL_ESCALATION = 0.35  # most share of requests the cascade may send to the center


# --- the curve (pure) ------------------------------------------------------------------------

@dataclass(frozen=True)
class Point:
    """One operating point: escalate rows whose edge confidence is below ``threshold``."""

    threshold: float
    escalation: float
    accuracy: float

    def gap_points(self, center_accuracy: float) -> float:
        """Accuracy points behind center-only (positive: the cascade is worse)."""
        return 100 * (center_accuracy - self.accuracy)


@dataclass(frozen=True)
class Curve:
    """Every distinct operating point of the cascade on one labelled split, by escalation."""

    thresholds: np.ndarray
    escalation: np.ndarray
    accuracy: np.ndarray
    center_accuracy: float
    edge_accuracy: float
    rows: int

    @classmethod
    def of(cls, center_logits: np.ndarray, edge_logits: np.ndarray,
           labels: np.ndarray) -> Curve:
        from registry.publish.calibrate import cascade_curve

        thresholds, rates, accuracy = cascade_curve(center_logits, edge_logits, labels)
        return cls(thresholds, rates, accuracy,
                   float((center_logits.argmax(1) == labels).mean()),
                   float((edge_logits.argmax(1) == labels).mean()), len(labels))

    def point(self, i: int) -> Point:
        return Point(float(self.thresholds[i]), float(self.escalation[i]),
                     float(self.accuracy[i]))

    def at_escalation(self, rate: float) -> Point:
        """The first operating point that escalates at least ``rate`` of the rows."""
        i = int(np.searchsorted(self.escalation, rate - 1e-12))
        return self.point(min(i, len(self.escalation) - 1))

    def _within(self, tolerance: float) -> np.ndarray:
        return np.asarray(self.accuracy >= self.center_accuracy - tolerance - 1e-12)

    def lowest_within(self, tolerance: float) -> Point:
        """The lowest escalation whose cascade accuracy is within ``tolerance`` of center-only
        (escalating everything is center-only, so there always is one)."""
        return self.point(int(np.argmax(self._within(tolerance))))

    def stays_within(self, tolerance: float) -> Point:
        """The lowest escalation from which the cascade stays within ``tolerance`` at every
        higher rate (``publish``'s rule without the bootstrap)."""
        within = self._within(tolerance)
        return self.point(int(np.argmax(np.logical_and.accumulate(within[::-1])[::-1])))


def merge_points(named: Sequence[tuple[str, Point]]) -> list[tuple[str, Point]]:
    """Named points by escalation; names of the same operating point joined with " = "."""
    merged: dict[tuple[float, float], tuple[list[str], Point]] = {}
    for name, point in named:
        names, _ = merged.setdefault((point.escalation, point.accuracy), ([], point))
        if name not in names:
            names.append(name)
    return [(" = ".join(names), point) for names, point in
            sorted(merged.values(), key=lambda item: item[1].escalation)]


def points(value: float) -> str:
    """Signed accuracy points, never "-0.00"."""
    return f"{round(value, 2) + 0.0:+.2f} pts"


def goal_met(point: Point, center_accuracy: float, tolerance: float = GOAL_TOLERANCE,
             max_escalation: float = GOAL_ESCALATION) -> bool:
    """Within ``tolerance`` (a fraction) of center-only while escalating <= ``max_escalation``."""
    return (point.accuracy >= center_accuracy - tolerance - 1e-12
            and point.escalation <= max_escalation + 1e-12)


@dataclass(frozen=True)
class Saved:
    """What the cascade saves against center-only, per request (escalation is a share)."""

    escalation: float
    center_ms_per_row: float
    edge_ms_per_row: float

    @property
    def center_calls_avoided(self) -> float:
        return 1 - self.escalation

    @property
    def center_ms_avoided(self) -> float:
        """Center compute not spent, per request."""
        return self.center_calls_avoided * self.center_ms_per_row

    @property
    def cascade_ms(self) -> float:
        """Model compute per request in the cascade: the edge always, the center when unsure."""
        return self.edge_ms_per_row + self.escalation * self.center_ms_per_row

    @property
    def net_saved(self) -> float:
        """Share of center-only model compute the cascade does not spend (edge included)."""
        return 1 - self.cascade_ms / self.center_ms_per_row
