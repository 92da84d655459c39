"""Escalation budgets: the centers' capacity split over the edges (docs/cascade.md).

Every center reports the rows per second it offers to escalations (``capacity_rows_s``), every
edge the rows it answered per report window. ``registry serve`` sums the fresh capacities of a
model and splits them over the connected edges by their traffic (or equally), then pushes each
edge its share; the edge's controller holds its escalations to it.

The policy per model (``registry cascade MODEL``) is the operator's: ``auto`` (the default) or
``static`` (every edge holds the release's calibrated threshold), a capacity figure that
replaces the centers' own, and the split. Changing it is an audited action (``cascade-policy``);
the budgets computed from it move with every report and are not audited.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

import sqlite_utils

from registry import audit
from registry.anchor import Anchor, audited
from registry.db import now
from registry.errors import RegistryError
from serving.protocol.budget import MAX_ROWS_S, Budget

Mode = Literal["auto", "static"]
Split = Literal["traffic", "equal"]
FLOOR = 0.05
"""Each edge's weight in a traffic split is its traffic plus this share of the mean edge's (and
0.1 rows/s): an edge that was idle gets a little budget, not none, until its next report."""
CHANGE = 0.05
"""A budget is pushed again when it moves by more than this share (or 0.5 rows/s)."""


@dataclass(frozen=True)
class Policy:
    mode: Mode = "auto"
    capacity_rows_s: float | None = None  # the operator's figure instead of the centers'
    split: Split = "traffic"


@dataclass(frozen=True)
class Seen:
    """One node's last report about one model, as far as budgets care."""

    node_id: str
    tier: str
    at: float  # monotonic seconds when it arrived
    rows_per_s: float  # rows it answered per second in that window
    capacity_rows_s: float  # a center's offer (0: none)

    @classmethod
    def of(cls, node_id: str, tier: str, at: float, report: dict[str, Any]) -> Seen:
        """From a received report; figures that are not finite, negative or absurd count 0."""
        def figure(value: object) -> float:
            number = float(value) if isinstance(value, int | float) else 0.0
            return number if math.isfinite(number) and 0 <= number <= MAX_ROWS_S else 0.0

        window = figure(report.get("window_s"))
        rows = figure(report.get("rows"))
        return cls(node_id, tier, at, rows / window if window >= 0.1 else 0.0,
                   figure(report.get("capacity_rows_s")))


def split(policy: Policy, seen: list[Seen], now: float, stale_s: float) -> dict[str, Budget]:
    """Each edge's budget (by node id) from the nodes' latest reports of one model. Reports
    older than ``stale_s`` say nothing about capacity or traffic."""
    fresh = [s for s in seen if now - s.at <= stale_s]
    edges = sorted({s.node_id for s in seen if s.tier == "edge"})
    capacity = (policy.capacity_rows_s if policy.capacity_rows_s is not None else
                sum(s.capacity_rows_s for s in fresh if s.tier == "center"))
    if policy.mode == "static" or not capacity or not edges:
        return {e: Budget(False) for e in edges}
    traffic = {e: 0.0 for e in edges}
    for s in fresh:
        if s.tier == "edge":
            traffic[s.node_id] = s.rows_per_s
    if policy.split == "equal":
        weights = {e: 1.0 for e in edges}
    else:
        mean = sum(traffic.values()) / len(edges)
        weights = {e: t + FLOOR * mean + 0.1 for e, t in traffic.items()}
    total = sum(weights.values())
    return {e: Budget(True, capacity * w / total, capacity, w / total)
            for e, w in weights.items()}


def changed(old: Budget | None, new: Budget) -> bool:
    """Whether ``new`` is worth pushing over ``old``."""
    if old is None or old.controlled != new.controlled:
        return True
    if not new.controlled:
        return False
    return abs(new.rows_per_s - old.rows_per_s) > max(CHANGE * old.rows_per_s, 0.5)


# --- the operator's policy -------------------------------------------------------------------

def policies(db: sqlite_utils.Database) -> dict[str, Policy]:
    return {r["model"]: Policy(r["mode"], r["capacity_rows_s"], r["split"])
            for r in db.query("SELECT * FROM cascade_policies")}


def set_policy(db: sqlite_utils.Database, anchor: Anchor | None, actor: str, model: str,
               policy: Policy) -> Policy:
    """Record ``model``'s policy with its audit record, in one transaction."""
    if policy.mode not in ("auto", "static") or policy.split not in ("traffic", "equal"):
        raise RegistryError(f"unknown cascade policy {policy}")
    if policy.capacity_rows_s is not None and not (
            math.isfinite(policy.capacity_rows_s) and 0 < policy.capacity_rows_s <= MAX_ROWS_S):
        raise RegistryError(f"capacity must be a positive number of rows per second, at most "
                            f"{MAX_ROWS_S:g}")
    with audited(db, anchor) as conn:
        if conn.execute("SELECT 1 FROM models WHERE name = ?", [model]).fetchone() is None:
            raise RegistryError(f"no model named {model!r}")
        row = conn.execute("SELECT mode, capacity_rows_s, split FROM cascade_policies WHERE "
                           "model = ?", [model]).fetchone()
        before = Policy(*row) if row else Policy()
        if before == policy:
            return policy  # nothing changes: nothing to audit
        audit.append(conn, actor=actor, action="cascade-policy", model=model,
                     payload={"from": asdict(before), "to": asdict(policy)})
        conn.execute("INSERT INTO cascade_policies (model, mode, capacity_rows_s, split, "
                     "updated_at) VALUES (?, ?, ?, ?, ?) ON CONFLICT (model) DO UPDATE SET "
                     "mode = excluded.mode, capacity_rows_s = excluded.capacity_rows_s, "
                     "split = excluded.split, updated_at = excluded.updated_at",
                     [model, policy.mode, policy.capacity_rows_s, policy.split, now()])
    return policy
