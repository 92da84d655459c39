"""Escalation budgets: the centers' capacity split over the edges (docs/cascade.md).

Every center reports the rows per second it offers to escalations (``capacity_rows_s``), every
edge the rows it answered per report window. ``registry serve`` sums the fresh capacities of a
model and splits them over the connected edges by their traffic (or equally), then pushes each
edge its share; the edge's controller holds its escalations to it.

The policy per model (``registry cascade MODEL``) is the operator's: ``auto`` (the default) or
``static`` (every edge holds the release's calibrated threshold), a capacity figure that
replaces the centers' own, and the split. Changing it is an audited action (``cascade-policy``);
the budgets computed from it move with every report and are not audited.

What a node reports is its own word, and one node's token may be in an attacker's hands. So a
report's figures are clamped before they count (``LastReport.of``): rows at most
``MAX_REQUEST_ROWS`` per request, a window of at least ``MIN_WINDOW_S`` (or the report interval, if
shorter), a node's first figure at most ``START_ROWS_S`` and each later one at most twice the last
per report interval (falling figures count at once: a center under load must be able to say so).
The operator's ceiling (``max_capacity_rows_s``) bounds the capacity the centers' reports add
up to, and in a traffic split no edge counts more than ``MAX_SKEW`` (2) times the median of the
other edges' traffic. So one edge's claims, however large, take at most about 2/(n+1) of the
budget among n edges of equal honest traffic: with 3 edges and 100 rows/s, a liar at its
largest claims gets 49.1 and each honest edge 25.5 (at 8x: 77.7 and 11.2). The price is paid
by honest fleets whose traffic really is that uneven: an edge with more than twice the median
of the others' traffic is budgeted as if it had twice (traffic within that stays proportional).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

import sqlite_utils

from registry.errors import RegistryError
from registry.releases.evidence import MAX_REQUEST_ROWS
from registry.store import chain
from registry.store.clock import now
from registry.trust.anchor import Anchor, audited
from serving.protocol.budget import MAX_ROWS_S, Budget

Mode = Literal["auto", "static"]
Split = Literal["traffic", "equal"]
FLOOR = 0.05
"""Each edge's weight in a traffic split is its traffic plus this share of the mean edge's (and
0.1 rows/s): an edge that was idle gets a little budget, not none, until its next report."""
CHANGE = 0.05
"""A budget is pushed again when it moves by more than this share (or 0.5 rows/s)."""
MIN_WINDOW_S = 1.0
"""A report's window counts as at least this long (or the report interval, if shorter)."""
START_ROWS_S = 100.0
"""A node's first figure (capacity or traffic) for a model counts at most this much ..."""
GROWTH = 2.0
"""... and each later one at most this factor more than the last per report interval."""
MAX_SKEW = 2.0
"""In a traffic split an edge counts at most this many times the median of the others (one
node's word takes at most about 2/(n+1) of the budget among n edges)."""


@dataclass(frozen=True)
class CascadePolicy:
    mode: Mode = "auto"
    capacity_rows_s: float | None = None  # the operator's figure instead of the centers'
    split: Split = "traffic"
    max_capacity_rows_s: float | None = None  # the ceiling on the centers' reported capacity


@dataclass(frozen=True)
class LastReport:
    """One node's last report about one model, as far as budgets care."""

    node_id: str
    tier: str
    at: float  # monotonic seconds when it arrived
    rows_per_s: float  # rows it answered per second in that window
    capacity_rows_s: float  # a center's offer (0: none)

    @classmethod
    def of(cls, node_id: str, tier: str, at: float, report: dict[str, Any],
           previous: LastReport | None = None, interval_s: float = 10.0) -> LastReport:
        """From a received report, clamped (see the module's doc); figures that are not
        finite, negative or absurd count 0. ``previous``: this node's last report of the
        model on this stream; ``interval_s``: the report interval nodes were told."""
        def figure(value: object) -> float:
            number = float(value) if isinstance(value, int | float) else 0.0
            return number if math.isfinite(number) and 0 <= number <= MAX_ROWS_S else 0.0

        window = max(figure(report.get("window_s")), min(MIN_WINDOW_S, interval_s))
        rows = min(figure(report.get("rows")),
                   figure(report.get("requests")) * MAX_REQUEST_ROWS)
        rate, capacity = rows / window, figure(report.get("capacity_rows_s"))
        if previous is None:
            return cls(node_id, tier, at, min(rate, START_ROWS_S), min(capacity, START_ROWS_S))
        factor = GROWTH ** (max(0.0, at - previous.at) / interval_s)
        return cls(node_id, tier, at,
                   min(rate, max(previous.rows_per_s, START_ROWS_S) * factor),
                   min(capacity, max(previous.capacity_rows_s, START_ROWS_S) * factor))


def split(policy: CascadePolicy, seen: list[LastReport], now: float,
          stale_s: float) -> dict[str, Budget]:
    """Each edge's budget (by node id) from the nodes' latest reports of one model. Reports
    older than ``stale_s`` say nothing about capacity or traffic."""
    fresh = [s for s in seen if now - s.at <= stale_s]
    edges = sorted({s.node_id for s in seen if s.tier == "edge"})
    capacity = (policy.capacity_rows_s if policy.capacity_rows_s is not None else
                sum(s.capacity_rows_s for s in fresh if s.tier == "center"))
    if policy.max_capacity_rows_s is not None:
        capacity = min(capacity, policy.max_capacity_rows_s)
    if policy.mode == "static" or not capacity or not edges:
        return {e: Budget(False) for e in edges}
    traffic = {e: 0.0 for e in edges}
    for s in fresh:
        if s.tier == "edge":
            traffic[s.node_id] = s.rows_per_s
    if len(edges) > 1:  # no edge's word outweighs MAX_SKEW times the median of the others'
        ordered = sorted(traffic.values())
        others = {e: _median_without(ordered, t) for e, t in traffic.items()}
        traffic = {e: min(t, MAX_SKEW * others[e]) if others[e] > 0 else t
                   for e, t in traffic.items()}
    if policy.split == "equal":
        weights = {e: 1.0 for e in edges}
    else:
        mean = sum(traffic.values()) / len(edges)
        weights = {e: t + FLOOR * mean + 0.1 for e, t in traffic.items()}
    total = sum(weights.values())
    return {e: Budget(True, capacity * w / total, capacity, w / total)
            for e, w in weights.items()}


def _median_without(ordered: list[float], value: float) -> float:
    """The median of sorted ``ordered`` less one occurrence of ``value`` (in it), without
    copying: one split over N edges costs O(N log N), not O(N² log N)."""
    gone = bisect.bisect_left(ordered, value)  # any equal value leaves the same numbers

    def at(i: int) -> float:  # the i-th of what remains
        return ordered[i if i < gone else i + 1]

    n = len(ordered) - 1
    middle = n // 2
    return at(middle) if n % 2 else (at(middle - 1) + at(middle)) / 2


def changed(old: Budget | None, new: Budget) -> bool:
    """Whether ``new`` is worth pushing over ``old``."""
    if old is None or old.controlled != new.controlled:
        return True
    if not new.controlled:
        return False
    return abs(new.rows_per_s - old.rows_per_s) > max(CHANGE * old.rows_per_s, 0.5)


# --- the operator's policy -------------------------------------------------------------------

def policies(db: sqlite_utils.Database) -> dict[str, CascadePolicy]:
    return {r["model"]: CascadePolicy(r["mode"], r["capacity_rows_s"], r["split"],
                               r["max_capacity_rows_s"])
            for r in db.query("SELECT * FROM cascade_policies")}


def set_policy(db: sqlite_utils.Database, anchor: Anchor | None, actor: str, model: str,
               policy: CascadePolicy) -> CascadePolicy:
    """Record ``model``'s policy with its audit record, in one transaction."""
    if policy.mode not in ("auto", "static") or policy.split not in ("traffic", "equal"):
        raise RegistryError(f"unknown cascade policy {policy}")
    for figure in (policy.capacity_rows_s, policy.max_capacity_rows_s):
        if figure is not None and not (math.isfinite(figure) and 0 < figure <= MAX_ROWS_S):
            raise RegistryError(f"capacity must be a positive number of rows per second, at "
                                f"most {MAX_ROWS_S:g}")
    with audited(db, anchor) as conn:
        if conn.execute("SELECT 1 FROM models WHERE name = ?", [model]).fetchone() is None:
            raise RegistryError(f"no model named {model!r}")
        row = conn.execute("SELECT mode, capacity_rows_s, split, max_capacity_rows_s FROM "
                           "cascade_policies WHERE model = ?", [model]).fetchone()
        before = CascadePolicy(*row) if row else CascadePolicy()
        if before == policy:
            return policy  # nothing changes: nothing to audit
        chain.append(conn, actor=actor, action="cascade-policy", model=model,
                     payload={"from": asdict(before), "to": asdict(policy)})
        conn.execute("INSERT INTO cascade_policies (model, mode, capacity_rows_s, split, "
                     "max_capacity_rows_s, updated_at) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT "
                     "(model) DO UPDATE SET mode = excluded.mode, capacity_rows_s = "
                     "excluded.capacity_rows_s, split = excluded.split, max_capacity_rows_s = "
                     "excluded.max_capacity_rows_s, updated_at = excluded.updated_at",
                     [model, policy.mode, policy.capacity_rows_s, policy.split,
                      policy.max_capacity_rows_s, now()])
    return policy
