"""Wave rollouts: a release reaches the edges in waves of nodes chosen by a stable hash, at a
pace, with a gate after each wave that halts the rollout, and brings the wave's nodes back to
the version they ran, when the new version installs badly or does worse on live traffic.

``registry publish --waves 1%,10%,50%,100%`` records the release with a ``waves`` row instead of
moving ``production``. ``registry serve`` (the primary) steers it, once a second
(``registry.releases.steering.tick``):

1. **admit** the wave's nodes: the edges this registry knows, ranked by ``position`` (a hash of
   model and node id: the same nodes go first every time, a ring), up to the wave's share of
   them (a wave before the last at least 3 where one stolen edge is tolerated,
   ``gate.least_wave``), at most ``pace`` nodes a minute (times ``growth`` per wave; 0: the
   whole wave at once). What is admitted is a ``cutoff`` on the ranking, stored: a node that
   joins or reconnects later gets what its position says, never more than the rollout reached.
   Before the first node is admitted, the whole fleet's figures of the previous version are
   kept as the baseline.
2. **install**: wait until every connected node of the wave acknowledged the version, ACTIVE or
   FAILED/REFUSED (at most ``install_timeout_s``; one that never answered counts as failed).
3. **bake** ``bake_s``, then **gate** (``registry.releases.gate``) on what the nodes report
   about the new version against what the other edges report about the previous one, in the
   same minutes and against the same centers (or the baseline, when too few are left outside
   the wave): installs, live audit agreement, drift alarms, p99; no single node decides any of
   them (``registry.releases.evidence``).
4. A gate that fails **halts** the rollout: every node is desired back on the previous version
   at once (the registry pushes it), and the audit log records why with the figures. A gate that
   cannot judge (agreement not measured, or undecided by one node's word) waits one more bake,
   then **holds**: nothing advances until it can judge or a person resumes (with a reason: the
   gate passes) or aborts it. A gate that passes starts the next wave; after the last,
   ``production`` moves to the new version (centers follow then: until that moment they answer
   escalations and audits with the version the rollout is judged against).

``registry rollout show|pause|resume|abort`` steers it by hand; ``publish --canary`` stays the
manual form. A later publish, promote or rollback of the model ends an unfinished rollout
(``superseded``; promoting its own version completes it, ``done``).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from dataclasses import dataclass
from typing import Any

import msgspec

from registry.releases import gate
from registry.releases.gate import EdgeAtGate
from registry.releases.policy import MAX_WAVES as MAX_WAVES  # re-exported
from registry.releases.policy import WavePolicy
from registry.releases.policy import parse_waves as parse_waves  # re-exported
from registry.store import chain
from registry.store.clock import now as timestamp

ALIAS = "wave"  # how a release pushed by a wave rollout is named to the node
ACTIVE = ("running", "baking", "held", "paused")  # the release is desired on the admitted nodes
OPEN = (*ACTIVE, "halted")  # not finished: a person may resume or abort it
STEPPED = ("running", "baking", "held")  # what ``tick`` moves on (a held gate is judged again)
STATES = (*OPEN, "aborted", "done", "superseded")
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
                "held": self.figures.get("held") if self.state == "held" else None,
                "policy": msgspec.to_builtins(self.policy), "created_at": self.created_at,
                "updated_at": self.updated_at}


COLUMNS = ("id, model, version, previous, policy, wave, cutoff, state, wave_started, "
           "admitted_at, installed_at, reason, figures, created_at, updated_at")


def latest(conn: sqlite3.Connection, model: str) -> Rollout | None:
    """The model's newest wave rollout, finished or not."""
    row = conn.execute(f"SELECT {COLUMNS} FROM waves WHERE model = ? ORDER BY id DESC LIMIT 1",
                       [model]).fetchone()
    return Rollout.of(row) if row else None


def newest(conn: sqlite3.Connection) -> list[tuple[str, str, int, str | None]]:
    """(model, state, wave, 1-based; why it is held, one of ``gate.HOLDS``, or None) of each
    model's newest wave rollout."""
    rows = conn.execute("SELECT model, state, wave + 1, CASE WHEN state = 'held' THEN "
                        "json_extract(figures, '$.held') END FROM waves WHERE id IN "
                        "(SELECT MAX(id) FROM waves GROUP BY model) ORDER BY model").fetchall()
    return [(m, s, int(w), h if h in gate.HOLDS else None) for m, s, w, h in rows]


def summary(conn: sqlite3.Connection, model: str) -> dict[str, Any] | None:
    """The model's newest wave rollout (``Rollout.to_json``) with its current wave's nodes:
    what ``registry rollout show`` prints and the fleet console shows."""
    r = latest(conn, model)
    if r is None:
        return None
    fleet = edges(conn, model)
    inside = [s for pos, s in fleet if pos < r.cutoff]
    return r.to_json() | {"nodes": {
        "edges": len(fleet), "wave": len(inside),
        "installed": sum(s.installed(r.version) for s in inside),
        "failed": sum(s.failed(r.version) for s in inside),
        "connected": sum(s.connected for s in inside)}}


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
                  first_admit(policy, 0, at), timestamp(), timestamp()])


def first_admit(policy: WavePolicy, wave: int, at: float) -> float:
    """``admitted_at`` at a wave's start: one node's worth earlier, so the first goes at once."""
    rate = policy.rate(wave)
    return at - 60.0 / rate if rate > 0 else at


def end(conn: sqlite3.Connection, model: str, actor: str, state: str, why: str) -> None:
    """Finish the model's unfinished rollout (``done`` or ``superseded``), audited; inside the
    caller's transaction (a publish, promote or rollback)."""
    for r in unfinished(conn, model):
        update(conn, r.id, state=state, reason=why)
        chain.append(conn, actor=actor, action=f"rollout-{state}", model=model,
                     version=r.version, payload={"wave": r.wave + 1, "reason": why})


def update(conn: sqlite3.Connection, rollout_id: int, **values: Any) -> None:
    values["updated_at"] = timestamp()
    names = ", ".join(f"{k} = ?" for k in values)  # keys are this module's, never a caller's
    conn.execute(f"UPDATE waves SET {names} WHERE id = ?", [*values.values(), rollout_id])


# -- what the nodes said -----------------------------------------------------------------------

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
