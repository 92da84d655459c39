"""Wave rollouts: a release reaches the edges in waves of nodes chosen by a stable hash, at a
pace, with a gate after each wave that halts the rollout, and brings the wave's nodes back to
the version they ran, when the new version installs badly or does worse on live traffic.

``registry publish --waves 1%,10%,50%,100%`` records the release with a ``waves`` row instead of
moving ``production``. ``registry serve`` (the primary) steers it, once a second (``tick``):

1. **admit** the wave's nodes: the edges this registry knows, ranked by ``position`` (a hash of
   model and node id: the same nodes go first every time, a ring), up to the wave's share of
   them, at most ``pace`` nodes a minute (times ``growth`` per wave; 0: the whole wave at once).
   What is admitted is a ``cutoff`` on the ranking, stored: a node that joins or reconnects
   later gets what its position says, never more than the rollout reached.
2. **install**: wait until every connected node of the wave acknowledged the version, ACTIVE or
   FAILED/REFUSED (at most ``install_timeout_s``; one that never answered counts as failed).
3. **bake** ``bake_s``, then **gate** (``judge``) on what the nodes report about the new
   version against what the other edges report about the previous one, in the same minutes
   and against the same centers: install failures over ``max_failures``; live audit agreement
   with the center lower by more than ``max_agreement_drop`` and significantly so (its 95%
   interval); a larger share of nodes with a drift alarm (``max_drift_share``); median p99
   over ``max_p99_ratio`` times the previous version's. Agreement needs ``min_audit_rows``
   audited rows from ``min_audit_nodes`` distinct nodes on both sides: short of them the gate
   waits up to another ``bake_s`` and then judges without it (the figures say "not measured").
   No single node moves a side's agreement beyond its share (``registry.releases.evidence``): its
   rows are bounded by what it could have answered and weigh at most the median node's, and a
   side's agreement is the median of its nodes'.
4. A gate that fails **halts** the rollout: every node is desired back on the previous version
   at once (the registry pushes it), and the audit log records why with the figures. A gate that
   passes starts the next wave; after the last, ``production`` moves to the new version (centers
   follow then: until that moment they answer escalations and audits with the version the
   rollout is judged against).

``registry rollout show|pause|resume|abort`` steers it by hand; ``publish --canary`` stays the
manual form. A later publish, promote or rollback of the model ends an unfinished rollout
(``superseded``; promoting its own version completes it, ``done``).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import sqlite3
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import msgspec

from registry.errors import NotFound, RegistryError
from registry.releases.evidence import Side
from registry.store import chain
from registry.store.clock import now as timestamp

ALIAS = "wave"  # how a release pushed by a wave rollout is named to the node
ACTIVE = ("running", "baking", "paused")  # the release is desired on the admitted nodes
OPEN = (*ACTIVE, "halted")  # not finished: a person may resume or abort it
STEPPED = ("running", "baking")  # what ``tick`` moves on
STATES = (*OPEN, "aborted", "done", "superseded")
MAX_WAVES = 20
Z95 = 1.959964
SHARE = re.compile(r"(\d+(?:\.\d+)?)%")


class WavePolicy(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """How one rollout proceeds; stored with it (JSON), defaults from ``RegistrySettings``."""

    waves: tuple[float, ...]  # cumulative shares of the edges, ascending, the last 1.0
    pace: float = 0.0  # nodes admitted per minute in the first wave (0: the wave at once)
    growth: float = 2.0  # the pace is multiplied by this for every following wave
    bake_s: float = 300.0  # after a wave installed, before its gate
    install_timeout_s: float = 900.0  # a wave node that has not answered by then has failed
    max_failures: float = 0.1  # share of a wave's nodes that failed or refused to install
    max_agreement_drop: float = 0.02  # live audit agreement below the previous version's
    min_audit_rows: int = 200  # audited rows on each side before agreement is judged
    min_audit_nodes: int = 3  # ... from at least this many distinct nodes
    max_drift_share: float = 0.25  # more of the wave's nodes in drift than of the others'
    max_p99_ratio: float = 2.0  # median p99 against the previous version's

    def check(self) -> WavePolicy:
        """This policy, or a RegistryError saying what is wrong with it."""
        shares = self.waves
        if not 1 <= len(shares) <= MAX_WAVES:
            raise RegistryError(f"a rollout has 1 to {MAX_WAVES} waves, not {len(shares)}")
        if any(not 0 < s <= 1 for s in shares) or list(shares) != sorted(set(shares)):
            raise RegistryError("wave shares must grow, each above 0% and at most 100%")
        if shares[-1] != 1.0:
            raise RegistryError("the last wave must be 100% (every edge)")
        for name, value, low, high in (
                ("pace", self.pace, 0, 1e9), ("growth", self.growth, 1, 1000),
                ("bake_s", self.bake_s, 0, 7 * 86400),
                ("install_timeout_s", self.install_timeout_s, 1, 7 * 86400),
                ("max_failures", self.max_failures, 0, 1),
                ("max_agreement_drop", self.max_agreement_drop, 0, 1),
                ("min_audit_rows", self.min_audit_rows, 1, 10**9),
                ("min_audit_nodes", self.min_audit_nodes, 1, 1000),
                ("max_drift_share", self.max_drift_share, 0, 1),
                ("max_p99_ratio", self.max_p99_ratio, 1, 1000)):
            if not (math.isfinite(value) and low <= value <= high):
                raise RegistryError(f"rollout {name} must be within [{low}, {high}], "
                                    f"not {value!r}")
        return self

    def rate(self, wave: int) -> float:
        """Nodes per minute admitted in ``wave`` (0: all at once)."""
        return self.pace * self.growth ** wave


def parse_waves(text: str) -> tuple[float, ...]:
    """``"1%,10%,50%,100%"`` -> (0.01, 0.1, 0.5, 1.0)."""
    shares = []
    for part in (p.strip() for p in text.split(",")):
        match = SHARE.fullmatch(part)
        if match is None:
            raise RegistryError(f"invalid wave {part!r}: give percentages of the edges, e.g. "
                                f"--waves 1%,10%,50%,100%")
        shares.append(float(match[1]) / 100)
    return tuple(shares)


def position(model: str, node_id: str) -> float:
    """Where a node ranks in every rollout of ``model``, in [0, 1): a stable hash, so the same
    nodes go first every time."""
    digest = hashlib.sha256(f"{model}\0{node_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0 ** 64


def admitted(model: str, node_id: str, cutoff: float) -> bool:
    return position(model, node_id) < cutoff


@dataclass(frozen=True)
class Rollout:
    id: int
    model: str
    version: int
    previous: int | None
    policy: WavePolicy
    wave: int
    cutoff: float
    state: str
    wave_started: float
    admitted_at: float
    installed_at: float | None
    reason: str | None
    figures: dict[str, Any]
    created_at: str
    updated_at: str

    @classmethod
    def of(cls, row: sqlite3.Row | tuple[Any, ...]) -> Rollout:
        (id_, model, version, previous, policy, wave, cutoff, state, wave_started, admitted_at,
         installed_at, reason, figures, created_at, updated_at) = row
        return cls(id_, model, version, previous, msgspec.json.decode(policy, type=WavePolicy),
                   wave, cutoff, state, wave_started, admitted_at, installed_at, reason,
                   json.loads(figures) if figures else {}, created_at, updated_at)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "model": self.model, "version": self.version,
                "previous": self.previous, "state": self.state, "wave": self.wave + 1,
                "waves": [f"{s * 100:g}%" for s in self.policy.waves],
                "share": self.policy.waves[self.wave], "cutoff": self.cutoff,
                "reason": self.reason, "figures": self.figures,
                "policy": msgspec.to_builtins(self.policy), "created_at": self.created_at,
                "updated_at": self.updated_at}


COLUMNS = ("id, model, version, previous, policy, wave, cutoff, state, wave_started, "
           "admitted_at, installed_at, reason, figures, created_at, updated_at")


def latest(conn: sqlite3.Connection, model: str) -> Rollout | None:
    """The model's newest wave rollout, finished or not."""
    row = conn.execute(f"SELECT {COLUMNS} FROM waves WHERE model = ? ORDER BY id DESC LIMIT 1",
                       [model]).fetchone()
    return Rollout.of(row) if row else None


def newest(conn: sqlite3.Connection) -> list[tuple[str, str, int]]:
    """(model, state, wave, 1-based) of each model's newest wave rollout."""
    rows = conn.execute("SELECT model, state, wave + 1 FROM waves WHERE id IN (SELECT MAX(id) "
                        "FROM waves GROUP BY model) ORDER BY model").fetchall()
    return [(m, s, int(w)) for m, s, w in rows]


def unfinished(conn: sqlite3.Connection, model: str | None = None) -> list[Rollout]:
    marks = ", ".join("?" * len(OPEN))
    rows = conn.execute(f"SELECT {COLUMNS} FROM waves WHERE state IN ({marks}) AND "
                        f"(? IS NULL OR model = ?) ORDER BY id", [*OPEN, model, model])
    return [Rollout.of(r) for r in rows.fetchall()]


def start(conn: sqlite3.Connection, model: str, version: int, previous: int | None,
          policy: WavePolicy, at: float) -> None:
    """Record a rollout of ``version`` (inside the publish's transaction); ``tick`` admits its
    first nodes."""
    conn.execute("INSERT INTO waves (model, version, previous, policy, wave, cutoff, state, "
                 "wave_started, admitted_at, created_at, updated_at) VALUES (?, ?, ?, ?, 0, 0, "
                 "'running', ?, ?, ?, ?)",
                 [model, version, previous, msgspec.json.encode(policy).decode(), at,
                  _first_admit(policy, 0, at), timestamp(), timestamp()])


def _first_admit(policy: WavePolicy, wave: int, at: float) -> float:
    """``admitted_at`` at a wave's start: one node's worth earlier, so the first goes at once."""
    rate = policy.rate(wave)
    return at - 60.0 / rate if rate > 0 else at


def end(conn: sqlite3.Connection, model: str, actor: str, state: str, why: str) -> None:
    """Finish the model's unfinished rollout (``done`` or ``superseded``), audited; inside the
    caller's transaction (a publish, promote or rollback)."""
    for r in unfinished(conn, model):
        _set(conn, r.id, state=state, reason=why)
        chain.append(conn, actor=actor, action=f"rollout-{state}", model=model,
                     version=r.version, payload={"wave": r.wave + 1, "reason": why})


def _set(conn: sqlite3.Connection, rollout_id: int, **values: Any) -> None:
    values["updated_at"] = timestamp()
    names = ", ".join(f"{k} = ?" for k in values)  # keys are this module's, never a caller's
    conn.execute(f"UPDATE waves SET {names} WHERE id = ?", [*values.values(), rollout_id])


# -- what the nodes said -----------------------------------------------------------------------

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


def edges(conn: sqlite3.Connection, model: str) -> list[tuple[float, EdgeAtGate]]:
    """Every edge this registry knows, with what it said about ``model``, by position."""
    rows = conn.execute(
        "SELECT n.node_id, n.connected, m.version, m.state, m.reason, m.report FROM nodes n "
        "LEFT JOIN node_models m ON m.node_id = n.node_id AND m.model = ? WHERE n.tier = "
        "'edge'", [model]).fetchall()
    seen = [(position(model, node_id), EdgeAtGate(node_id, bool(connected), version, state or "",
                                            reason or "", report))
            for node_id, connected, version, state, reason, report in rows]
    seen.sort(key=lambda p: p[0])
    return seen


# -- the gate ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Verdict:
    failed: list[str]  # why the gate failed (empty: it passed)
    waiting: bool  # agreement not measured yet (too few audited rows)
    figures: dict[str, Any]


def judge(policy: WavePolicy, version: int, previous: int | None, wave: list[EdgeAtGate],
          others: list[EdgeAtGate], baseline: dict[str, Any] | None) -> Verdict:
    """The gate after a wave: ``wave`` are its nodes, ``others`` the edges outside it (on the
    previous version); ``baseline``: the previous version's figures from an earlier gate, used
    when no other edge reports it any more (the last wave)."""
    failed: list[str] = []
    connected = [s for s in wave if s.connected]
    installed = sum(s.installed(version) for s in connected)
    broken = len(connected) - installed  # failed, refused, or silent past the timeout
    share = broken / len(connected) if connected else 0.0
    if connected and share > policy.max_failures:
        failed.append(f"installs: {broken} of {len(connected)} connected wave nodes failed, "
                      f"refused or did not answer ({share:.0%} > {policy.max_failures:.0%})")
    new, old = Side(), Side()
    for s in wave:
        if (report := s.reporting(version)) is not None:
            new.add(s.node_id, report)
    for s in others:
        if (report := s.reporting(previous)) is not None:
            old.add(s.node_id, report)
    least = (policy.min_audit_nodes, policy.min_audit_rows)
    was = old.figures(*least)
    if not was["measured"] and baseline:
        was = baseline  # the last wave: nobody runs the previous version any more
    now = new.figures(*least)
    figures: dict[str, Any] = {"nodes": len(wave), "connected": len(connected),
                               "installed": installed, "failed": broken,
                               "new": now, "previous": was}
    waiting = False
    rows_new, rows_old = now["audit_rows"], was.get("audit_rows") or 0
    if now["measured"] and was.get("measured") is True:
        pn, po = now["agreement"], was["agreement"]
        gap = po - pn
        half = Z95 * math.sqrt(pn * (1 - pn) / rows_new + po * (1 - po) / rows_old)
        figures["agreement_drop"] = {"drop": round(gap, 4), "interval": round(half, 4)}
        if gap > policy.max_agreement_drop and gap - half > 0:
            failed.append(f"live audit agreement {pn:.3f} ({rows_new} rows, "
                          f"{now['audit_nodes']} nodes) against {po:.3f} ({rows_old} rows, "
                          f"{was['audit_nodes']} nodes) for version {previous}: down "
                          f"{gap:.3f} ± {half:.3f}, more than {policy.max_agreement_drop:g}")
    else:
        waiting = True
        figures["agreement_drop"] = (
            f"not measured ({rows_new} and {rows_old} audited rows from "
            f"{now['audit_nodes']} and {was.get('audit_nodes') or 0} nodes; "
            f"{policy.min_audit_rows} rows from {policy.min_audit_nodes} nodes needed on "
            f"each side)")
    drift_new, drift_old = now["drift_share"], was.get("drift_share") or 0.0
    if drift_new is not None and new.drifted and \
            drift_new - drift_old > policy.max_drift_share:
        failed.append(f"drift: {new.drifted} of {new.nodes} wave nodes report a drift alarm "
                      f"({drift_new:.0%}, against {drift_old:.0%} of the others)")
    p99_new, p99_old = now["p99_ms"], was.get("p99_ms")
    if p99_new is not None and p99_old and p99_new > policy.max_p99_ratio * p99_old:
        failed.append(f"latency: median p99 {p99_new:.1f} ms against {p99_old:.1f} ms "
                      f"(over {policy.max_p99_ratio:g}x)")
    return Verdict(failed, waiting and not failed, figures)


# -- steering ----------------------------------------------------------------------------------

def tick(conn: sqlite3.Connection, at: float, actor: str) -> list[str]:
    """One step of every running rollout, inside the caller's (audited) transaction; what
    happened, for the log."""
    said = []
    marks = ", ".join("?" * len(STEPPED))
    rows = conn.execute(f"SELECT {COLUMNS} FROM waves WHERE state IN ({marks}) ORDER BY id",
                        list(STEPPED)).fetchall()
    for row in rows:
        said += _step(conn, Rollout.of(row), at, actor)
    return said


def _target(share: float, total: int) -> int:
    if share >= 1:
        return total
    return min(total, max(1, math.ceil(share * total - 1e-9)))


def _step(conn: sqlite3.Connection, r: Rollout, at: float, actor: str) -> list[str]:
    p = r.policy
    fleet = edges(conn, r.model)
    share = p.waves[r.wave]
    target = _target(share, len(fleet))
    inside = sum(pos < r.cutoff for pos, _ in fleet)
    name = f"{r.model} version {r.version}, wave {r.wave + 1}/{len(p.waves)}"
    if r.state == "running":
        if inside < target:
            rate = p.rate(r.wave)
            wanted = target if rate <= 0 else \
                min(target, inside + math.floor((at - r.admitted_at) * rate / 60.0))
            if wanted > inside:
                cutoff = 1.0 if share >= 1 and wanted == len(fleet) else \
                    math.nextafter(fleet[wanted - 1][0], 2.0)
                admitted_at = r.admitted_at + (wanted - inside) * 60.0 / rate if rate > 0 \
                    else at
                _set(conn, r.id, cutoff=max(cutoff, r.cutoff), admitted_at=admitted_at)
                return [f"{name}: {wanted} of {target} nodes admitted"]
            return []
        if share >= 1 and r.cutoff < 1.0:
            _set(conn, r.id, cutoff=1.0)  # and whoever joins later
        wave = [s for pos, s in fleet if pos < max(r.cutoff, 1.0 if share >= 1 else 0.0)]
        pending = [s.node_id for s in wave if s.connected and not s.installed(r.version)
                   and not s.failed(r.version)]
        if pending and at - r.wave_started < p.install_timeout_s:
            return []
        _set(conn, r.id, state="baking", installed_at=at)
        return [f"{name}: installed on {len(wave) - len(pending)} of {len(wave)} nodes; "
                f"baking {p.bake_s:g}s"]
    assert r.installed_at is not None
    if at - r.installed_at < p.bake_s:
        return []
    wave = [s for pos, s in fleet if pos < r.cutoff]
    others = [s for pos, s in fleet if pos >= r.cutoff]
    verdict = judge(p, r.version, r.previous, wave, others, r.figures.get("baseline"))
    if verdict.waiting and at - r.installed_at < 2 * p.bake_s:
        return []
    figures = {**r.figures, f"wave {r.wave + 1}": verdict.figures}
    previous = verdict.figures["previous"]
    if previous.get("measured") is True or "baseline" not in figures:
        figures["baseline"] = previous
    payload = {"wave": r.wave + 1, "share": share, "figures": verdict.figures}
    if verdict.failed:
        why = "; ".join(verdict.failed)
        _set(conn, r.id, state="halted", reason=why, figures=json.dumps(figures))
        chain.append(conn, actor=actor, action="rollout-halt", model=r.model,
                     version=r.version, payload={**payload, "reason": why,
                                                 "back_to": r.previous})
        return [f"{name}: gate failed, halted; nodes go back to version {r.previous}: {why}"]
    chain.append(conn, actor=actor, action="rollout-gate", model=r.model, version=r.version,
                 payload={**payload, "passed": True})
    if r.wave + 1 < len(p.waves):
        _set(conn, r.id, state="running", wave=r.wave + 1, wave_started=at, installed_at=None,
             admitted_at=_first_admit(p, r.wave + 1, at), figures=json.dumps(figures))
        return [f"{name}: gate passed; wave {r.wave + 2} begins"]
    _set(conn, r.id, state="done", reason="every wave passed its gate",
         figures=json.dumps(figures))
    _production(conn, r, actor)
    return [f"{name}: gate passed; production is version {r.version}"]


def _production(conn: sqlite3.Connection, r: Rollout, actor: str) -> None:
    """Every wave passed: ``production`` moves to the version (the catalog's own record of a
    promote, with its rollout row)."""
    chain.append(conn, actor=actor, action="promote", model=r.model, version=r.version,
                 payload={"from": r.previous, "to": r.version, "by": "waves"})
    conn.execute("INSERT INTO aliases VALUES (?, 'production', ?, ?) ON CONFLICT (model, alias) "
                 "DO UPDATE SET version = excluded.version, updated_at = excluded.updated_at",
                 [r.model, r.version, timestamp()])
    conn.execute("INSERT INTO rollouts (model, alias, version, targets, created_at) VALUES "
                 "(?, 'production', ?, '[\"*\"]', ?)", [r.model, r.version, timestamp()])


# -- by hand -----------------------------------------------------------------------------------

def steer(conn: sqlite3.Connection, model: str, action: str, actor: str, at: float) -> Rollout:
    """``pause``, ``resume`` or ``abort`` the model's unfinished rollout, audited."""
    found = unfinished(conn, model)
    if not found:
        raise NotFound(f"{model} has no unfinished wave rollout")
    r = found[-1]
    if action == "pause":
        if r.state not in ("running", "baking"):
            raise RegistryError(f"{model}'s rollout of version {r.version} is {r.state}; only "
                                f"a running one can be paused")
        _set(conn, r.id, state="paused")
    elif action == "resume":
        if r.state not in ("paused", "halted"):
            raise RegistryError(f"{model}'s rollout of version {r.version} is {r.state}, not "
                                f"paused or halted")
        # the current wave again, from its admission on: its gate is judged afresh
        _set(conn, r.id, state="running", wave_started=at, installed_at=None,
             admitted_at=_first_admit(r.policy, r.wave, at))
    elif action == "abort":
        _set(conn, r.id, state="aborted", reason=f"aborted by {actor}")
    else:
        raise ValueError(action)
    chain.append(conn, actor=actor, action=f"rollout-{action}", model=model, version=r.version,
                 payload={"wave": r.wave + 1, "was": r.state})
    return latest(conn, model) or r
