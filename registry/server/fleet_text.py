"""The ``registry_fleet_*`` families as Prometheus text (0.0.4): their names and help, the
confidence buckets a report may add to, and the lines of one scrape (``Text``)."""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client.utils import floatToGoString

PREFIX = "registry_fleet_"
GROUP = ("model", "version", "tier", "region")
MEANS: dict[str, tuple[str | None, str]] = {
    # report field (= series) -> (the report's field counting the rows the value is over, or
    # None: its confidence histogram's rows; help)
    "escalation_rate": ("rows", "Share of rows answered by the center"),
    "degraded_rate": ("rows", "Share of rows answered edge-degraded (center unreachable)"),
    "shed_rate": ("rows", "Share of rows answered edge-shed (over budget at the floor)"),
    "input_shift": ("input_rows", "Standardized shift of the inputs from the release's "
                    "calibration rows"),
    "input_outliers": ("input_rows", "Share of rows with an input statistic beyond 4 "
                       "reference standard deviations"),
    "low_confidence_share": (None, "Share of edge rows with confidence below 0.3"),
    "audit_agreement": ("audit_rows", "Edge-center agreement on the edges' audit samples"),
    "estimated_accuracy": ("audit_rows", "Live cascade accuracy estimated from the audits "
                           "(nodes without an estimate left out)"),
}
WEIGHED = " (weighted by the rows each node's value is over, each node's last report)"
FAMILIES: dict[str, tuple[str, str]] = {  # name -> (type, help)
    "nodes": ("gauge", "Nodes whose last report (within the staleness window) is of this "
              "version"),
    **{name: ("gauge", text + WEIGHED) for name, (_, text) in MEANS.items()},
    "input_shift_max": ("gauge", "Largest input shift of a node's last report"),
    "p99_seconds": ("gauge", "Largest 99th percentile latency of a node's last report (an "
                    "upper bound of the group's)"),
    "drifting_nodes": ("gauge", "Nodes whose last report flags an audit or confidence drift"),
    "requests_total": ("counter", "Requests the nodes reported"),
    "rows_total": ("counter", "Rows the nodes reported, by who answered them"),
    "confidence": ("histogram", "Confidence of the edges' rows"),
}
Buckets = list[tuple[float, float]]  # (upper bound, rows in that bucket alone), by bound


def bounds(raw: Any, accepted: frozenset[float]) -> Buckets:
    """A report's confidence buckets ({le, count} each; proto JSON may write both as
    strings), only at ``accepted`` bounds: a node cannot add a label value of its own."""
    found: dict[float, float] = {}
    for bucket in raw if isinstance(raw, list) else []:
        try:
            le, count = float(bucket["le"]), float(bucket["count"])
        except (TypeError, KeyError, ValueError):
            continue
        if le in accepted and math.isfinite(count) and count > 0:
            found[le] = found.get(le, 0.0) + count
    return sorted(found.items())


def confidence(counts: dict[float, float], buckets: Buckets) -> None:
    """Add a report's buckets to a cumulative histogram (``counts``: bound -> rows at or
    below it, +Inf: all). At a bound the report lacks (a node older or newer than another)
    its rows at the next lower bound it has are added, and a bound new to the group starts
    where the bound below it is: the buckets stay cumulative."""
    les = [le for le, _ in buckets]
    cumulative = list(itertools.accumulate(c for _, c in buckets))
    for le in (*les, math.inf):
        if le not in counts:  # a bound new to the group: as many as the one below it so far
            below = [n for n in counts if n < le]
            counts[le] = counts[max(below)] if below else 0.0
    for le in counts:
        i = len(les) - 1 if le == math.inf else bisect.bisect_right(les, le) - 1
        if i >= 0:
            counts[le] += cumulative[i]


class Text:
    """One scrape's lines, by family; ``labels(names, values)`` formats a label set."""

    def __init__(self, labels: Callable[[Iterable[str], Iterable[str]], str]) -> None:
        self.labels = labels
        self.lines: dict[str, list[str]] = {name: [] for name in FAMILIES}

    def add(self, family: str, group: tuple[str, ...], value: float, suffix: str = "",
            names: tuple[str, ...] = GROUP, **extra: str) -> None:
        shown = self.labels((*names, *extra), (*group, *extra.values()))
        self.lines[family].append(f"{PREFIX}{family}{suffix}{shown} {floatToGoString(value)}\n")

    def gauges(self, group: tuple[str, ...], nodes: int, weights: list[float],
               weighted: list[float], drifting: float, p99_s: float, shift: float) -> None:
        """A group's gauges; a mean no node measured (no rows) is left out, not shown as 0."""
        self.add("nodes", group, nodes)
        for name, weight, total in zip(MEANS, weights, weighted, strict=True):
            if weight > 0:  # (the running sums' rounding may leave a -1e-17)
                self.add(name, group, max(total / weight, 0.0))
        self.add("input_shift_max", group, shift)
        self.add("p99_seconds", group, p99_s)
        self.add("drifting_nodes", group, drifting)

    def histogram(self, key: tuple[str, str, str], counts: dict[float, float]) -> None:
        names = ("model", "version", "region")
        for le, count in sorted(counts.items()):
            self.add("confidence", key, count, "_bucket", names, le=floatToGoString(le))
        self.add("confidence", key, counts.get(math.inf, 0.0), "_count", names)


def label_set(names: Iterable[str], values: Iterable[str], cut: int | None = None) -> str:
    """``{name="value",...}`` in the text format, each value escaped (and cut to ``cut``
    characters): the nodes' and the fleet's series alike."""
    shown = (v[:cut].replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
             for v in values)
    return "{" + ",".join(f'{k}="{v}"' for k, v in zip(names, shown, strict=True)) + "}"


def render(text: Text) -> str:
    out = []
    for name, (kind, help_text) in FAMILIES.items():
        out.append(f"# HELP {PREFIX}{name} {help_text}\n# TYPE {PREFIX}{name} {kind}\n")
        out.extend(text.lines[name])
    return "".join(out)
