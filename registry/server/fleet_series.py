"""Fleet aggregates of the nodes' quality reports (``registry_fleet_*``), labelled by model,
version, tier and region only: bounded by the releases and the provisioned regions (a node's
tier and region are its token's, signed by the registry), never by the nodes.

Counters add each report (requests, rows by who answered them, edge confidences); gauges are
weighted means over each node's last report of a model, for nodes that reported within
``stale_after_s``. Each group keeps running sums that a report updates by the difference
between the node's new contribution and its last, so a scrape formats a line per group and
field and touches no node, except to expire the stale ones (oldest first) and to find a
maximum again in a group whose largest value was replaced by a smaller one."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from registry.server.fleet_text import MEANS, Text, bounds, confidence, label_set, render
from serving.telemetry.quality import CONFIDENCE_BUCKETS

ANSWERED_BY = ("edge", "center", "edge-degraded", "edge-shed")
Group = tuple[str, str, str, str]  # model, version, tier, region
ACCURACY = list(MEANS).index("estimated_accuracy")
MAX_LABEL = 64  # characters of a label value kept (model names may be 128)


@dataclass(frozen=True, slots=True)
class NodeLast:
    """One node's last report of a model, as it counts in its group's gauges."""

    group: Group
    at: float
    sums: tuple[float, ...]  # per MEANS field the rows its value is over, per field weight x
    # value, then 1 if it flags a drift (what the group's sums add up)
    p99_s: float
    shift: float


@dataclass
class Gauges:
    """A group's running sums over its nodes' last reports."""

    members: dict[tuple[str, str], NodeLast] = field(default_factory=dict)
    sums: list[float] = field(default_factory=lambda: [0.0] * (2 * len(MEANS) + 1))
    p99_s: float = 0.0
    shift: float = 0.0
    stale_max: bool = False  # the largest p99 or shift left: find them again at the scrape

    def add(self, key: tuple[str, str], e: NodeLast, sign: int) -> None:
        if sign > 0:
            self.sums = [a + b for a, b in zip(self.sums, e.sums, strict=True)]
            self.members[key] = e
            self.p99_s, self.shift = max(self.p99_s, e.p99_s), max(self.shift, e.shift)
        else:
            self.sums = [a - b for a, b in zip(self.sums, e.sums, strict=True)]
            del self.members[key]
            self.stale_max |= e.p99_s >= self.p99_s or e.shift >= self.shift

    def maxima(self) -> tuple[float, float]:
        if self.stale_max:
            entries = self.members.values()
            self.p99_s = max((e.p99_s for e in entries), default=0.0)
            self.shift = max((e.shift for e in entries), default=0.0)
            self.stale_max = False
        return self.p99_s, self.shift


class FleetSeries:
    """The ``registry_fleet_*`` series, fed one report at a time (``report``), rendered as
    text at each scrape (``render``); ``clock`` is monotonic seconds (tests pass their own)."""

    def __init__(self, stale_after_s: float, clock: Callable[[], float] = time.monotonic,
                 confidence_bounds: Iterable[float] = CONFIDENCE_BUCKETS) -> None:
        self.stale_after_s, self.clock = stale_after_s, clock
        self.accepted = frozenset(float(b) for b in confidence_bounds)
        self._last: OrderedDict[tuple[str, str], NodeLast] = OrderedDict()  # oldest report first
        self._gauges: dict[Group, Gauges] = {}
        self._requests: dict[Group, float] = {}
        self._rows: dict[tuple[Group, str], float] = {}
        self._confidence: dict[tuple[str, str, str], dict[float, float]] = {}  # le -> count
        self._lock = threading.Lock()  # reports come on the event loop, scrapes on a thread

    def report(self, labels: list[str], report: dict[str, Any]) -> None:
        """One node's report (``labels``: node, tier, region, model, version): it replaces
        the node's last report of the model in the gauges and adds to the counters."""
        node, tier, region, model, version = labels
        group: Group = (model, version, tier, region)
        rows = _number(report.get("rows"))
        shares = [min(_number(report.get(f)), 1.0)
                  for f in ("escalation_rate", "degraded_rate", "shed_rate")]
        answered: dict[str, float] = dict(zip(("center", "edge-degraded", "edge-shed"),
                                              (round(rows * s) for s in shares), strict=True))
        answered["edge"] = max(rows - sum(answered.values()), 0.0)
        buckets = bounds(report.get("confidence"), self.accepted)
        weights = [_number(report.get(w)) if w else sum(c for _, c in buckets)
                   for w, _ in MEANS.values()]
        values = [_number(report.get(f)) for f in MEANS]
        if values[ACCURACY] <= 0:  # 0: not enough audit rows for an estimate
            weights[ACCURACY] = 0.0
        drifting = float(bool(report.get("drift")) or bool(report.get("confidence_drift")))
        entry = NodeLast(group, self.clock(), (*weights, *(w * v for w, v in zip(
            weights, values, strict=True)), drifting), _number(report.get("p99_ms")) / 1000,
                      _number(report.get("input_shift")))
        key = (node, model)
        with self._lock:
            self._forget(key)
            self._last[key] = entry
            self._gauges.setdefault(group, Gauges()).add(key, entry, +1)
            self._requests[group] = self._requests.get(group, 0.0) + _number(
                report.get("requests"))
            for by in ANSWERED_BY:
                self._rows[(group, by)] = self._rows.get((group, by), 0.0) + answered[by]
            if tier == "edge":
                confidence(self._confidence.setdefault((model, version, region), {}), buckets)

    def _forget(self, key: tuple[str, str]) -> None:
        entry = self._last.pop(key, None)
        if entry is None:
            return
        gauges = self._gauges[entry.group]
        gauges.add(key, entry, -1)
        if not gauges.members:  # starts again from exact zeros: no rounding left behind
            del self._gauges[entry.group]

    def render(self) -> str:
        """The text format's lines of every ``registry_fleet_*`` family."""
        with self._lock:
            oldest = self.clock() - self.stale_after_s
            while self._last and next(iter(self._last.values())).at < oldest:
                self._forget(next(iter(self._last)))
            text = Text(_labels)
            for group, g in sorted(self._gauges.items()):
                n = len(MEANS)
                text.gauges(group, len(g.members), g.sums[:n], g.sums[n:2 * n], g.sums[-1],
                            *g.maxima())
            for group, total in sorted(self._requests.items()):
                text.add("requests_total", group, total)
            for (group, by), total in sorted(self._rows.items()):
                text.add("rows_total", group, total, answered_by=by)
            for (model, version, region), counts in sorted(self._confidence.items()):
                text.histogram((model, version, region), counts)
        return render(text)


def _number(value: Any) -> float:
    """A report's number, 0 where it is missing, not a number, negative or not finite."""
    kind = type(value)  # not isinstance: a bool is no count
    return float(value) if (kind is float or kind is int) and 0 < value < 1e300 else 0.0



def _labels(names: Iterable[str], values: Iterable[str]) -> str:
    return label_set(names, values, MAX_LABEL)
