"""Steering the wave rollouts (``registry.releases.waves``): ``tick`` admits, waits for the
installs, bakes and gates (``registry.releases.gate``) every unfinished rollout, once a step of
``registry serve``; ``steer`` is a person's pause, resume and abort, audited.

A gate that cannot judge waits one more bake for the evidence, then **holds**: the wave's nodes
keep the new version, no further wave is admitted, the reason is stored and audited
(``rollout-hold``). A held gate is judged again at every step and passes or halts by itself
once the evidence decides; a person may pass it (``resume`` with a reason, audited in the same
transaction) or ``abort`` it. "Could not measure" never means "passed".
"""

from __future__ import annotations

import json
import math
import sqlite3
import unicodedata
from typing import Any

from registry.errors import NotFound, RegistryError
from registry.releases import gate
from registry.releases.evidence import tolerated
from registry.releases.waves import (
    COLUMNS,
    STEPPED,
    Rollout,
    edges,
    first_admit,
    latest,
    unfinished,
    update,
)
from registry.store import chain
from registry.store.clock import now as timestamp

MAX_REASON = 500  # characters of a person's reason for a resume or abort


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


def target(share: float, total: int, least: int = 1) -> int:
    """Nodes in a wave of ``share`` of ``total`` edges: at least ``least`` (the fewest whose
    figures a gate can judge when one may be lying, ``gate.least_wave``); all of them at a
    share of 1."""
    return min(total, max(least, math.ceil(share * total - 1e-9)))


def _step(conn: sqlite3.Connection, r: Rollout, at: float, actor: str) -> list[str]:
    fleet = edges(conn, r.model)
    name = f"{r.model} version {r.version}, wave {r.wave + 1}/{len(r.policy.waves)}"
    if r.state == "running":
        return _admit_and_install(conn, r, fleet, at, name)
    assert r.installed_at is not None
    if at - r.installed_at < r.policy.bake_s:
        return []
    wave = [s for pos, s in fleet if pos < r.cutoff]
    others = [s for pos, s in fleet if pos >= r.cutoff]
    verdict = gate.judge(r.policy, r.version, r.previous, wave, others,
                         r.figures.get("baseline"))
    if verdict.hold is not None:
        return _hold(conn, r, verdict, at, actor, name)
    figures = {**r.figures, f"wave {r.wave + 1}": verdict.figures}
    figures.pop("held", None)
    previous = verdict.figures["previous"]
    if previous.get("measured") is True or "baseline" not in figures:
        figures["baseline"] = previous
    payload = {"wave": r.wave + 1, "share": r.policy.waves[r.wave], "figures": verdict.figures}
    if verdict.failed:
        why = "; ".join(verdict.failed)
        update(conn, r.id, state="halted", reason=why, figures=json.dumps(figures))
        chain.append(conn, actor=actor, action="rollout-halt", model=r.model,
                     version=r.version, payload={**payload, "reason": why,
                                                 "back_to": r.previous})
        return [f"{name}: gate failed, halted; nodes go back to version {r.previous}: {why}"]
    chain.append(conn, actor=actor, action="rollout-gate", model=r.model, version=r.version,
                 payload={**payload, "passed": True})
    return _advance(conn, r, figures, at, actor, name)


def _admit_and_install(conn: sqlite3.Connection, r: Rollout, fleet: list[tuple[float, Any]],
                       at: float, name: str) -> list[str]:
    p = r.policy
    share = p.waves[r.wave]
    least = gate.least_wave(len(fleet), tolerated(len(fleet), p.min_audit_nodes))
    wanted_total = target(share, len(fleet), least)
    inside = sum(pos < r.cutoff for pos, _ in fleet)
    if inside < wanted_total:
        rate = p.rate(r.wave)
        wanted = wanted_total if rate <= 0 else \
            min(wanted_total, inside + math.floor((at - r.admitted_at) * rate / 60.0))
        if wanted <= inside:
            return []
        cutoff = 1.0 if share >= 1 and wanted == len(fleet) else \
            math.nextafter(fleet[wanted - 1][0], 2.0)
        admitted_at = r.admitted_at + (wanted - inside) * 60.0 / rate if rate > 0 else at
        values: dict[str, Any] = {"cutoff": max(cutoff, r.cutoff), "admitted_at": admitted_at}
        if r.cutoff == 0 and r.wave == 0 and r.previous is not None:
            values["figures"] = json.dumps({**r.figures, **_start(r, fleet)})
        update(conn, r.id, **values)
        return [f"{name}: {wanted} of {wanted_total} nodes admitted"]
    if share >= 1 and r.cutoff < 1.0:
        update(conn, r.id, cutoff=1.0)  # and whoever joins later
    wave = [s for pos, s in fleet if pos < max(r.cutoff, 1.0 if share >= 1 else 0.0)]
    pending = [s.node_id for s in wave if s.connected and not s.installed(r.version)
               and not s.failed(r.version)]
    if pending and at - r.wave_started < p.install_timeout_s:
        return []
    update(conn, r.id, state="baking", installed_at=at)
    installed = sum(s.installed(r.version) for s in wave)
    failed = sum(not s.installed(r.version) and s.failed(r.version) for s in wave)
    gone = len(wave) - installed - failed - len(pending)  # neither: disconnected
    others = [f"{failed} failed"] if failed else []
    others += [f"{gone} disconnected"] if gone else []
    others += [f"{len(pending)} not answered within {p.install_timeout_s:g}s"] if pending else []
    return [f"{name}: installed on {installed} of {len(wave)} nodes"
            + (f" ({', '.join(others)})" if others else "") + f"; baking {p.bake_s:g}s"]


def _start(r: Rollout, fleet: list[tuple[float, Any]]) -> dict[str, Any]:
    """Before the first node is admitted: the whole fleet's figures of the previous version,
    the baseline a gate falls back on when too few edges are left outside its wave to be
    measured (a fleet of three: one)."""
    everyone = [s for _, s in fleet]
    liars = tolerated(len(everyone), r.policy.min_audit_nodes)
    figures = gate.side(r.policy, everyone, r.previous, liars)
    return {"baseline": {**figures, "from": "start"}} if figures["measured"] else {}


def _hold(conn: sqlite3.Connection, r: Rollout, verdict: gate.Verdict, at: float, actor: str,
          name: str) -> list[str]:
    """A gate that could not judge: wait out one more bake, then hold (audited once, and again
    when the reason changes)."""
    assert r.installed_at is not None
    if r.state != "held" and at - r.installed_at < 2 * r.policy.bake_s:
        return []
    if r.state == "held" and r.figures.get("held") == verdict.hold:
        return []
    figures = {**r.figures, f"wave {r.wave + 1}": verdict.figures, "held": verdict.hold}
    update(conn, r.id, state="held", reason=verdict.why, figures=json.dumps(figures))
    chain.append(conn, actor=actor, action="rollout-hold", model=r.model, version=r.version,
                 payload={"wave": r.wave + 1, "share": r.policy.waves[r.wave],
                          "hold": verdict.hold, "reason": verdict.why,
                          "figures": verdict.figures})
    return [f"{name}: gate held ({verdict.hold}): {verdict.why}; `registry rollout resume "
            f"{r.model} --reason ...` passes it, `abort` ends it"]


def _advance(conn: sqlite3.Connection, r: Rollout, figures: dict[str, Any], at: float,
             actor: str, name: str) -> list[str]:
    """The wave's gate passed: the next wave begins, or production moves after the last."""
    p = r.policy
    if r.wave + 1 < len(p.waves):
        update(conn, r.id, state="running", wave=r.wave + 1, wave_started=at,
               installed_at=None, admitted_at=first_admit(p, r.wave + 1, at), reason=None,
               figures=json.dumps(figures))
        return [f"{name}: gate passed; wave {r.wave + 2} begins"]
    update(conn, r.id, state="done", reason="every wave passed its gate",
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

def check_reason(reason: str | None) -> str | None:
    """A person's reason, stripped, or a RegistryError: printable text up to MAX_REASON."""
    if reason is None:
        return None
    reason = reason.strip()
    if not reason:
        raise RegistryError("--reason is empty: say why")
    if len(reason) > MAX_REASON:
        raise RegistryError(f"--reason is {len(reason)} characters; at most {MAX_REASON}")
    if any(unicodedata.category(c).startswith("C") for c in reason):
        raise RegistryError("--reason must be printable text (no control characters)")
    return reason


def steer(conn: sqlite3.Connection, model: str, action: str, actor: str, at: float,
          reason: str | None = None) -> Rollout:
    """``pause``, ``resume`` or ``abort`` the model's unfinished rollout, audited with the
    person's ``reason`` (required to resume a held one: that passes its gate)."""
    reason = check_reason(reason)
    found = unfinished(conn, model)
    if not found:
        raise NotFound(f"{model} has no unfinished wave rollout")
    r = found[-1]
    payload: dict[str, Any] = {"wave": r.wave + 1, "was": r.state}
    if reason is not None:
        payload["reason"] = reason
    if action == "pause":
        if r.state not in ("running", "baking"):
            raise RegistryError(f"{model}'s rollout of version {r.version} is {r.state}; only "
                                f"a running one can be paused")
        update(conn, r.id, state="paused")
    elif action == "resume" and r.state == "held":
        if reason is None:
            raise RegistryError(f"{model}'s rollout of version {r.version} is held at wave "
                                f"{r.wave + 1} ({r.reason}); resuming passes its gate: give "
                                f"--reason saying why")
        payload |= {"hold": r.figures.get("held"), "held_because": r.reason}
        chain.append(conn, actor=actor, action="rollout-resume", model=model,
                     version=r.version, payload={**payload, "passed": True})
        figures = {k: v for k, v in r.figures.items() if k != "held"}
        _advance(conn, r, figures, at, actor, f"{model} version {r.version}")
        return latest(conn, model) or r
    elif action == "resume":
        if r.state not in ("paused", "halted"):
            raise RegistryError(f"{model}'s rollout of version {r.version} is {r.state}, not "
                                f"paused, held or halted")
        # the current wave again, from its admission on: its gate is judged afresh
        update(conn, r.id, state="running", wave_started=at, installed_at=None,
               admitted_at=first_admit(r.policy, r.wave, at))
    elif action == "abort":
        update(conn, r.id, state="aborted", reason=f"aborted by {actor}" +
               (f": {reason}" if reason else ""))
    else:
        raise ValueError(action)
    chain.append(conn, actor=actor, action=f"rollout-{action}", model=model, version=r.version,
                 payload=payload)
    return latest(conn, model) or r
