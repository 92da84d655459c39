"""What a wave gate takes from the nodes' reports about one version, and how much any one node
is worth in it (``registry.releases.gate`` judges with it).

A report is its node's own word, and one node's token may be in an attacker's hands: an edge in
the wave could claim ``audit_rows=10**12, audit_agreement=1.0`` for a bad release, one outside
it the same for the previous version to make a good release look worse. So no single node can
move a side's figures beyond its share:

- **rows**: a node's audited rows count at most what it could have answered in the report's
  window (``requests`` times ``MAX_REQUEST_ROWS``: the audit may sample every row, no more) and
  at most ``MAX_AUDIT_ROWS`` (the largest audit window an edge keeps). An honest edge's window
  spans several reports, so an edge with little traffic in its last window counts less, never
  more, than it audited: the bound only ever takes evidence away.
- **weight**: a node's rows count in the side's total (the ``n`` of the gate's 95% interval,
  and what ``min_audit_rows`` is held to) at most up to the median node's (the lower median):
  however many rows one node claims, it adds no more than a typical node does.
- **agreement**: the side's agreement is the **median of its nodes'** agreements. With at least
  three nodes one node cannot move it outside the range the others report, whatever it says;
  with two it is their mean (one node moves it by half its lie); with one it is that node's.
- **quorum**: a side counts as measured only with agreement figures from ``quorum`` distinct
  nodes and ``min_audit_rows`` rows by the weights above. The quorum is scaled to the side:
  ``min_audit_nodes`` (default 3: the least number for which the median holds against one
  liar) or a majority of the side's nodes, whichever is fewer, and never fewer than the liars
  tolerated plus one. The side's size counts every edge the registry knows in it, connected or
  not, reporting or not: a node that falls silent removes its own figures, never the quorum.
- **liars tolerated** (``tolerated``): one in a fleet of 3 edges or more; none where one node
  is half the fleet (or the policy asks for one node's word, ``min_audit_nodes`` 1). With one
  tolerated, the true figure of a side of two audited nodes is only known to lie between
  their two figures (``bounds``: either may be the liar), and a gate judges the worst and the
  best case: it halts only when even the best case is worse, passes only when even the worst
  is not, and holds otherwise. With three or more the median is within the honest nodes'
  range already.

The figures each side writes into the rollout and its audit record list every node's claimed,
bounded and counted rows, its agreement and its weight (its share of the side's counted rows),
the heaviest ``MAX_LISTED`` of them.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

MAX_REQUEST_ROWS = 256
"""Rows a report may claim per request: the V2 default ``max_request_rows`` (serving
settings, ``CENTER_/EDGE_MAX_REQUEST_ROWS``); a node cannot have answered more."""
MAX_AUDIT_ROWS = 1_000_000
"""The most audited rows one report counts: an edge's audit window holds at most this many
(``EDGE_AUDIT_WINDOW``'s bound)."""
MAX_LISTED = 50
"""Nodes listed by name in a side's figures (the heaviest); the others are counted."""


def tolerated(fleet: int, min_nodes: int) -> int:
    """Stolen nodes a gate withstands in a fleet of ``fleet`` edges: one from 3 edges on (unless
    the policy's ``min_audit_nodes`` is 1: one node's word, asked for); none in a fleet of one
    or two, where no gate can tell one stolen node's word from the truth."""
    return 1 if fleet >= 3 and min_nodes > 1 else 0


def quorum(side: int, min_nodes: int, liars: int) -> int:
    """Distinct audited nodes a side of ``side`` edges needs: ``min_nodes`` or a majority of
    the side, whichever is fewer, and at least ``liars + 1`` (one honest node's figure)."""
    return max(liars + 1, min(min_nodes, side // 2 + 1))


def bounds(values: list[float], liars: int) -> tuple[float, float] | None:
    """Where a side's true figure lies whatever ``liars`` (0 or 1) of its nodes said: the
    median with no liar or with three nodes or more (one node cannot move it outside the
    others' range); with one liar and two nodes, between the two; with one, unknown."""
    if not values or len(values) <= liars:
        return None
    if liars and len(values) == 2:
        return min(values), max(values)
    middle = statistics.median(values)
    return middle, middle


def number(value: Any) -> float:
    """A report's figure, or 0 where it is not a finite number."""
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else 0.0


@dataclass(frozen=True)
class AuditFigures:
    """One node's live audit figures, as the gate counts them."""

    node_id: str
    rows: int  # bounded by what the node could have answered, and MAX_AUDIT_ROWS
    claimed: int  # what its report said
    agreement: float


def audit_of(node_id: str, report: dict[str, Any]) -> AuditFigures | None:
    """The node's audit figures from its report, bounded; None when it has none."""
    claimed = number(report.get("audit_rows"))
    agreement = report.get("audit_agreement")
    served = number(report.get("requests")) * MAX_REQUEST_ROWS
    rows = int(min(claimed, served, MAX_AUDIT_ROWS))
    if rows <= 0 or not isinstance(agreement, int | float) or not 0 <= agreement <= 1:
        return None  # (NaN fails the comparison)
    return AuditFigures(node_id, rows, int(min(claimed, 2**63 - 1)), float(agreement))


@dataclass
class Side:
    """Reports about one version: its nodes' audits, drift alarms and p99s."""

    nodes: int = 0
    audits: list[AuditFigures] = field(default_factory=list)
    drifted: int = 0
    p99s: list[float] = field(default_factory=list)

    def add(self, node_id: str, report: dict[str, Any]) -> None:
        self.nodes += 1
        if (audit := audit_of(node_id, report)) is not None:
            self.audits.append(audit)
        if report.get("drift") is True or report.get("confidence_drift") is True:
            self.drifted += 1
        p99 = number(report.get("p99_ms"))
        if p99 > 0 and number(report.get("requests")) > 0:
            self.p99s.append(p99)

    def weights(self) -> dict[str, int]:
        """Each audited node's rows as they count in the side's total: at most the (lower)
        median node's."""
        if not self.audits:
            return {}
        cap = statistics.median_low(a.rows for a in self.audits)
        return {a.node_id: min(a.rows, cap) for a in self.audits}

    def figures(self, min_nodes: int, min_rows: int, liars: int) -> dict[str, Any]:
        """The side's figures; ``min_nodes``: its quorum (``quorum``), ``liars``: how many of
        its nodes may be lying (``tolerated``)."""
        weights = self.weights()
        rows = sum(weights.values())
        agreement = statistics.median(a.agreement for a in self.audits) if self.audits \
            else None
        span = bounds([a.agreement for a in self.audits], liars)
        p99 = bounds(self.p99s, liars)
        listed = sorted(self.audits, key=lambda a: (-weights[a.node_id], a.node_id))
        return {"nodes": self.nodes, "audit_nodes": len(self.audits), "audit_rows": rows,
                "agreement": round(agreement, 4) if agreement is not None else None,
                "quorum": min_nodes,
                "measured": len(self.audits) >= min_nodes and rows >= min_rows and
                span is not None,
                "low": round(span[0], 4) if span else None,
                "high": round(span[1], 4) if span else None,
                "weights": [{"node": a.node_id, "claimed": a.claimed, "rows": a.rows,
                             "counted": weights[a.node_id], "agreement": round(a.agreement, 4),
                             "weight": round(weights[a.node_id] / rows, 4)}
                            for a in listed[:MAX_LISTED]],
                "drifted": self.drifted,
                "drift_share": round(self.drifted / self.nodes, 4) if self.nodes else None,
                "p99_ms": round(statistics.median(self.p99s), 3) if self.p99s else None,
                "p99_low": round(p99[0], 3) if p99 else None,
                "p99_high": round(p99[1], 3) if p99 else None}
