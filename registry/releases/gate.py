"""A wave rollout's gate (``registry.releases.waves`` steps it): what the wave's edges report
about the new version against what the other edges report about the previous one, judged so
that no single node decides it, and so that a gate that cannot judge holds instead of passing.

A verdict is one of:

- **failed** (the rollout halts, the wave's nodes go back): installs failed on at least
  ``least_failures`` distinct nodes *and* over ``max_failures`` of the wave; agreement down by
  more than ``max_agreement_drop``, significantly, even in the best case one lying node leaves
  open; a drift alarm on at least ``least_failures`` wave nodes and over ``max_drift_share``
  more of them than of the others; p99 over ``max_p99_ratio`` times the previous version's,
  in the best case.
- **held** (``HOLDS``, a person decides: ``registry rollout resume --reason`` or ``abort``):
  ``not-measured``, a side short of its quorum of audited nodes or rows
  (``registry.releases.evidence.quorum``); ``undecided``, measured, but the verdict depends on
  which node is lying (a side of two that disagree). A held gate is judged again at every
  step and passes or fails by itself once the evidence decides it.
- **passed**: none of the above, agreement no worse even in the worst case.

A first release (no previous version) has nothing to be compared with: its gates judge
installs alone.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from registry.releases.evidence import Side, quorum, tolerated
from registry.releases.policy import WavePolicy

Z95 = 1.959964
NOT_MEASURED, UNDECIDED = "not-measured", "undecided"
HOLDS = (NOT_MEASURED, UNDECIDED)
"""Why a gate holds: the only values of the ``reason`` label of ``registry_rollout_held``."""


@dataclass(frozen=True)
class EdgeAtGate:
    """One edge as the gate sees it: connected, its state for the model, its last report."""

    node_id: str
    connected: bool
    version: int | None
    state: str
    reason: str
    report_json: str | None  # parsed only when a gate reads it (thousands of edges a tick)

    @cached_property
    def report(self) -> dict[str, Any] | None:
        try:
            parsed = json.loads(self.report_json) if self.report_json else None
        except ValueError:
            return None
        return parsed if isinstance(parsed, dict) else None

    def installed(self, version: int) -> bool:
        return self.version == version and self.state == "ACTIVE"

    def failed(self, version: int) -> bool:
        return self.state == "FAILED" and (self.reason == f"version {version}" or
                                           self.reason.startswith(f"version {version}:"))

    def reporting(self, version: int | None) -> dict[str, Any] | None:
        """Its last report when it is about ``version`` and the node is connected."""
        if not self.connected or self.report is None or version is None:
            return None
        return self.report if self.report.get("version") == version else None


@dataclass(frozen=True)
class Verdict:
    failed: list[str]  # why the gate failed (empty: it did not)
    hold: str | None  # one of HOLDS when it could not judge (and did not fail), else None
    why: str  # the hold's explanation, for the reason column and the audit log
    figures: dict[str, Any]


def least_failures(liars: int) -> int:
    """Distinct nodes whose install failures (or drift alarms) a gate needs to fail: one more
    than the stolen nodes it withstands."""
    return liars + 1


def least_wave(fleet: int, liars: int) -> int:
    """The fewest nodes a wave before the last admits in a fleet of ``fleet`` edges: with one
    liar tolerated, three (its median holds against the liar, and it keeps a quorum of two
    when the liar falls silent), leaving at least one edge on the previous version."""
    return max(1, min(2 * liars + 1, fleet - 1))


def side(policy: WavePolicy, edges: list[EdgeAtGate], version: int | None,
         liars: int) -> dict[str, Any]:
    """The figures of what ``edges`` report about ``version``, with the quorum of their
    number."""
    found = Side()
    for s in edges:
        if (report := s.reporting(version)) is not None:
            found.add(s.node_id, report)
    least = quorum(len(edges), policy.min_audit_nodes, liars)
    return found.figures(least, policy.min_audit_rows, liars)


def judge(policy: WavePolicy, version: int, previous: int | None, wave: list[EdgeAtGate],
          others: list[EdgeAtGate], baseline: dict[str, Any] | None) -> Verdict:
    """The gate after a wave: ``wave`` are its nodes, ``others`` the edges outside it (on the
    previous version); ``baseline``: the previous version's figures from before (the rollout's
    start or an earlier gate), used when the others are too few to be measured (the last wave:
    none)."""
    liars = tolerated(len(wave) + len(others), policy.min_audit_nodes)
    failed: list[str] = []
    connected = [s for s in wave if s.connected]
    installed = sum(s.installed(version) for s in connected)
    broken = len(connected) - installed  # failed, refused, or silent past the timeout
    share = broken / len(connected) if connected else 0.0
    if broken >= least_failures(liars) and share > policy.max_failures:
        failed.append(f"installs: {broken} of {len(connected)} connected wave nodes failed, "
                      f"refused or did not answer ({share:.0%} > {policy.max_failures:.0%})")
    now = side(policy, wave, version, liars)
    was = side(policy, others, previous, liars)
    if not was["measured"] and baseline and baseline.get("measured") is True:
        was = baseline
    figures: dict[str, Any] = {"nodes": len(wave), "connected": len(connected),
                               "installed": installed, "failed": broken, "liars": liars,
                               "new": now, "previous": was}
    hold, why = _agreement(policy, previous, now, was, failed, figures)
    failed += _drift_and_latency(policy, now, was, liars)
    return Verdict(failed, None if failed else hold, why, figures)


def _bounds(figures: dict[str, Any]) -> tuple[float, float]:
    """A side's agreement bounds (figures written before they were kept: its median)."""
    middle = figures["agreement"]
    return figures.get("low", middle), figures.get("high", middle)


def _agreement(policy: WavePolicy, previous: int | None, now: dict[str, Any],
               was: dict[str, Any], failed: list[str],
               figures: dict[str, Any]) -> tuple[str | None, str]:
    """Judge agreement into ``failed`` and ``figures``; (the hold, why) when it cannot."""
    if previous is None:
        figures["agreement_drop"] = "not compared (a first release)"
        return None, ""
    rows_new, rows_old = now["audit_rows"], was.get("audit_rows") or 0
    if not (now["measured"] and was.get("measured") is True):
        why = (f"agreement not measured ({rows_new} and {rows_old} audited rows from "
               f"{now['audit_nodes']} and {was.get('audit_nodes') or 0} nodes{_when(was)}; "
               f"{policy.min_audit_rows} rows from {now['quorum']} and "
               f"{was.get('quorum', policy.min_audit_nodes)} nodes needed)")
        figures["agreement_drop"] = why.removeprefix("agreement ")
        return NOT_MEASURED, why
    (new_low, new_high), (old_low, old_high) = _bounds(now), _bounds(was)
    best = _drop(old_low, rows_old, new_high, rows_new)  # the most a liar can have hidden
    worst = _drop(old_high, rows_old, new_low, rows_new)
    figures["agreement_drop"] = {"drop": round(worst[0], 4), "interval": round(worst[1], 4),
                                 "best": round(best[0], 4)}
    said = (f"live audit agreement {now['agreement']:.3f} ({rows_new} rows, "
            f"{now['audit_nodes']} nodes) against {was['agreement']:.3f} ({rows_old} rows, "
            f"{was['audit_nodes']} nodes) for version {previous}{_when(was)}")
    if _worse(policy, *best):
        failed.append(f"{said}: down {best[0]:.3f} ± {best[1]:.3f}, more than "
                      f"{policy.max_agreement_drop:g}")
        return None, ""
    if _worse(policy, *worst):
        return UNDECIDED, (f"agreement undecided: {said}; the drop is between "
                           f"{best[0]:.3f} and {worst[0]:.3f} depending on which one node "
                           f"is lying")
    return None, ""


def _when(was: dict[str, Any]) -> str:
    return " at the rollout's start" if was.get("from") == "start" else ""


def _drop(old: float, rows_old: int, new: float, rows_new: int) -> tuple[float, float]:
    """(old - new, the half-width of its 95% interval)."""
    half = Z95 * math.sqrt(new * (1 - new) / rows_new + old * (1 - old) / rows_old)
    return old - new, half


def _worse(policy: WavePolicy, drop: float, half: float) -> bool:
    return drop > policy.max_agreement_drop and drop - half > 0


def _drift_and_latency(policy: WavePolicy, now: dict[str, Any], was: dict[str, Any],
                       liars: int) -> list[str]:
    failed = []
    drift_new, drift_old = now["drift_share"], was.get("drift_share") or 0.0
    if drift_new is not None and now["drifted"] >= least_failures(liars) and \
            drift_new - drift_old > policy.max_drift_share:
        failed.append(f"drift: {now['drifted']} of {now['nodes']} wave nodes report a drift "
                      f"alarm ({drift_new:.0%}, against {drift_old:.0%} of the others)")
    p99_new, p99_old = now["p99_low"], was.get("p99_high", was.get("p99_ms"))
    if p99_new is not None and p99_old and p99_new > policy.max_p99_ratio * p99_old:
        failed.append(f"latency: median p99 {now['p99_ms']:.1f} ms against "
                      f"{was['p99_ms']:.1f} ms (over {policy.max_p99_ratio:g}x)")
    return failed
