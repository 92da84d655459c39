"""What the registry knows about its subscribers: who they are, what each runs, how it does.

Written by ``registry serve`` as nodes say hello, acknowledge releases and report quality (a
``Write`` per message, written in batches: one transaction for all that arrived in an interval);
read by ``registry status``. Every acknowledgement is an audit record, in the same transaction
as its change.
"""

from __future__ import annotations

import json
import logging
import math
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import sqlite_utils

from registry.errors import NotPrimary
from registry.releases.catalog import Catalog
from registry.releases.plan import RolloutNode
from registry.store import chain
from registry.store.clock import now
from registry.store.db import transaction
from registry.trust.anchor import Anchor, audited

log = logging.getLogger(__name__)
STATES = ("DOWNLOADING", "ACTIVE", "FAILED", "REFUSED", "RETIRED")
CASCADE = ("capacity_rows_s", "threshold", "budget_rows_s", "shed_rate", "degraded_rate",
           "audit_rows", "audit_agreement", "audit_expected", "audit_interval", "drift",
           "estimated_accuracy", "accuracy_interval", "confidence_psi", "confidence_drift")
"""Report fields about the cascade controller and the live audit (docs/cascade.md)."""
REFUSED = "refused:"
"""Prefix of the stored reason of a release the node refused (its state is recorded as FAILED)."""


@dataclass(frozen=True)
class Held:
    model: str
    versions: list[int]
    active: int | None


@dataclass(frozen=True)
class AckedFidelity:
    """A node's probe agreement for the version an ack names, on its hardware."""

    fidelity: float
    rows: int
    platform: dict[str, Any]


class NodeBook:
    def __init__(self, db: sqlite_utils.Database, anchor: Anchor | None = None) -> None:
        """``anchor``: where the signed audit head is moved after each audited write."""
        self.db = db
        self.anchor = anchor

    def all_disconnected(self) -> None:
        """At ``registry serve`` start: no stream is open yet, whatever a killed server left."""
        with transaction(self.db) as conn:
            conn.execute("UPDATE nodes SET connected = 0 WHERE connected = 1")

    def write(self, writes: Sequence[Write]) -> list[Write]:
        """Apply ``writes`` in order in one transaction (each ack's audit record in it, with its
        own ``node_models`` change), the signed audit head moved once after it. If that
        fails, each write is tried alone, so one bad write costs no other its place. Returns
        the writes that failed for a reason that may pass (a busy or unwritable database),
        to be tried again; the others that failed are logged and dropped."""
        if not writes:
            return []
        try:
            _apply(self.db, self.anchor, writes)
            return []
        except NotPrimary as exc:  # a standby now: its streams were closed, none is written
            log.warning("dropped %d node writes: %s", len(writes), exc)
            return []
        except Exception:
            if len(writes) == 1:
                return _alone(self.db, self.anchor, writes[0])
        return [w for write in writes for w in _alone(self.db, self.anchor, write)]

    def status(self, catalog: Catalog) -> list[dict[str, Any]]:
        """One row per (model, node): what it runs, what it should run, its last report."""
        rows = []
        nodes = {r["node_id"]: r for r in self.db.query("SELECT * FROM nodes ORDER BY node_id")}
        desired: dict[str, dict[str, int]] = {}
        plan = catalog.plan()
        for node_id, n in nodes.items():
            node = RolloutNode(node_id, n["tier"], n["region"])
            desired[node_id] = {t.model: t.version for t in plan.desired(node)}
        for r in self.db.query("SELECT * FROM node_models ORDER BY model, node_id"):
            n = nodes[r["node_id"]]
            report = json.loads(r["report"]) if r["report"] else {}
            platform = json.loads(n["platform"]) if n["platform"] else {}
            held = json.loads(n["trust"]) if n["trust"] else {}
            want = desired[r["node_id"]].get(r["model"])
            rows.append({
                "model": r["model"], "node": r["node_id"], "tier": n["tier"],
                "region": n["region"], "connected": bool(n["connected"]),
                "version": r["version"], "desired": want, "state": r["state"],
                "reason": r["reason"], "lagging": want is not None and r["version"] != want,
                "last_seen": n["last_seen"],
                "escalation_rate": report.get("escalation_rate"),
                "p99_ms": report.get("p99_ms"), "requests": report.get("requests"),
                "length_drift": report.get("length_drift"), "report_at": r["report_at"],
                **{key: report.get(key) for key in CASCADE},
                "fidelity": r["fidelity"], "fidelity_rows": r["fidelity_rows"],
                "fidelity_version": r["fidelity_version"], "directive_seq": r["directive_seq"],
                "cpu": platform.get("cpu"), "cpu_features": platform.get("features", []),
                "machine": platform.get("machine"), "runtime": platform.get("runtime"),
                "trust": _trust_row(held)})
        return rows

    def generations(self) -> dict[str, int]:
        """Token generations of the nodes whose tokens were ever revoked (others are at 1)."""
        return {r["node_id"]: r["generation"]
                for r in self.db.query("SELECT node_id, generation FROM node_tokens")}

    def revoke(self, node_id: str, actor: str) -> int:
        """Void ``node_id``'s token: its generation goes up by one (audited); the new
        generation's token is the only one accepted from now on."""
        with audited(self.db, self.anchor) as conn:
            row = conn.execute("SELECT generation FROM node_tokens WHERE node_id = ?",
                               [node_id]).fetchone()
            generation = (row[0] if row else 1) + 1
            chain.append(conn, actor=actor, action="revoke-node-token",
                         payload={"node": node_id, "generation": generation})
            conn.execute("INSERT INTO node_tokens (node_id, generation, updated_at) VALUES "
                         "(?, ?, ?) ON CONFLICT (node_id) DO UPDATE SET generation = "
                         "excluded.generation, updated_at = excluded.updated_at",
                         [node_id, generation, now()])
        return generation

    def refused_calls(self, rows: list[dict[str, Any]]) -> None:
        """Calls refused for a missing or wrong token, in aggregate: one audit record per
        interval (``registry.server.limits``: the top hosts by count, how many hosts, the total), so
        probing leaves a trace but neither a flood of refused calls nor many source addresses
        can flood the log or the database's one writer. ``rows``: one per interval (more only
        when earlier writes failed)."""
        if not rows:
            return
        with audited(self.db, self.anchor) as conn:
            for row in rows:
                chain.append(conn, actor="peers", action="auth-denied", payload=row)


def _trust_row(held: dict[str, Any]) -> dict[str, Any] | None:
    """A node's TUF state as status shows it: stale since when, in ISO time."""
    if not held:
        return None
    expires = held.get("expires") or 0.0
    shown = datetime.fromtimestamp(expires, UTC).isoformat() if expires else None
    return {"root_version": held.get("root_version"),
            "timestamp_version": held.get("timestamp_version"), "expires": shown,
            "stale": bool(held.get("stale")), "stale_since": shown if held.get("stale") else None,
            "error": held.get("error"), "reported_at": held.get("at")}


@dataclass(frozen=True)
class Write:
    """One node message's change to the database, applied inside a transaction: what
    ``registry serve`` queues per message and writes in batches (``NodeBook.write``). Its
    time is the message's, taken when the write is made, not when it is applied."""

    what: str  # for a log line
    apply: Callable[[sqlite3.Connection], None]
    audited: bool = False  # appends an audit record: the signed head moves after the commit


def hello(node: RolloutNode, peer: str, held: list[Held],
          platform: dict[str, Any] | None = None) -> Write:
    """A node said hello: (re)record it, its hardware and what it holds; it is online from
    now."""
    at = now()

    def apply(conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO nodes (node_id, tier, region, peer, connected, first_seen, "
                     "last_seen, platform) VALUES (?, ?, ?, ?, 1, ?, ?, ?) ON CONFLICT "
                     "(node_id) DO UPDATE SET tier = excluded.tier, region = "
                     "excluded.region, peer = excluded.peer, connected = 1, last_seen = "
                     "excluded.last_seen, platform = excluded.platform",
                     [node.node_id, node.tier, node.region, peer, at, at,
                      json.dumps(platform or {})])
        for h in held:  # only models this registry knows: a node's names make no rows
            state = "ACTIVE" if h.active else "HELD"
            conn.execute("INSERT INTO node_models (node_id, model, version, state, "
                         "updated_at) SELECT ?, ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM "
                         "models WHERE name = ?) ON CONFLICT (node_id, model) DO "
                         "UPDATE SET version = excluded.version, state = excluded.state, "
                         "reason = NULL, updated_at = excluded.updated_at",
                         [node.node_id, h.model, h.active, state, at, h.model])

    return Write(f"node {node.node_id}'s hello", apply)


def trust_state(node_id: str, state: Any) -> Write:
    """What a node's TUF client holds (``pb.TrustState``), bounded: numbers made sane, its
    error cut short; shown by ``registry status``."""
    def number(value: float) -> float:
        return float(value) if math.isfinite(value) and 0 <= value < 1e12 else 0.0

    row = {"root_version": max(0, min(int(state.root_version), 1 << 31)),
           "timestamp_version": max(0, min(int(state.timestamp_version), 1 << 62)),
           "expires": number(state.expires), "stale": bool(state.stale),
           "error": str(state.error)[:500] or None, "at": now()}

    def apply(conn: sqlite3.Connection) -> None:
        conn.execute("UPDATE nodes SET trust = ? WHERE node_id = ?", [json.dumps(row), node_id])

    return Write(f"node {node_id}'s release metadata state", apply)


def goodbye(node_id: str) -> Write:
    """A node's stream ended: it is offline from now."""
    at = now()

    def apply(conn: sqlite3.Connection) -> None:
        conn.execute("UPDATE nodes SET connected = 0, last_seen = ? WHERE node_id = ?",
                     [at, node_id])

    return Write(f"node {node_id}'s disconnection", apply)


def ack(node: RolloutNode, model: str, version: int, state: str, reason: str,
        measured: AckedFidelity | None = None, seq: int = 0) -> Write:
    """An ack and its audit record, in the same transaction (actor: the node). A release the
    node refused (bad or missing signature, unsafe manifest, fidelity below its floor on its
    hardware) is its own action, ``refused``. ``seq``: the directive seq the node accepted
    (checked by the caller against what was pushed to it); the highest is kept."""
    at = now()
    action = "refused" if state == "REFUSED" else "ack"
    if state == "REFUSED":  # recorded as a failure the node will not retry
        state, reason = "FAILED", f"{REFUSED} {reason}"
    payload: dict[str, Any] = {"state": state, "reason": reason, "tier": node.tier,
                               "region": node.region}
    if measured is not None:
        payload |= {"fidelity": measured.fidelity, "fidelity_rows": measured.rows,
                    "platform": measured.platform}

    def apply(conn: sqlite3.Connection) -> None:
        chain.append(conn, actor=f"node:{node.node_id}", action=action, model=model,
                     version=version, payload=payload)
        conn.execute("INSERT OR IGNORE INTO node_models (node_id, model, state, updated_at) "
                     "VALUES (?, ?, ?, ?)", [node.node_id, model, state, at])
        if measured is not None:  # the latest measurement, refused or served
            conn.execute("UPDATE node_models SET fidelity = ?, fidelity_rows = ?, "
                         "fidelity_version = ? WHERE node_id = ? AND model = ?",
                         [measured.fidelity, measured.rows, version, node.node_id, model])
            if measured.platform:
                conn.execute("UPDATE nodes SET platform = ? WHERE node_id = ?",
                             [json.dumps(measured.platform), node.node_id])
        if state == "ACTIVE":  # the node now serves it
            conn.execute("UPDATE node_models SET version = ?, state = ?, reason = NULL, "
                         "updated_at = ? WHERE node_id = ? AND model = ?",
                         [version, state, at, node.node_id, model])
        elif state == "RETIRED":  # unloaded and removed from its store: it serves none
            conn.execute("UPDATE node_models SET version = NULL, state = ?, reason = ?, "
                         "updated_at = ? WHERE node_id = ? AND model = ?",
                         [state, reason or None, at, node.node_id, model])
        else:  # still serving whatever it served; the reason names the version in flight
            detail = f"version {version}" + (f": {reason}" if reason else "")
            conn.execute("UPDATE node_models SET state = ?, reason = ?, updated_at = ? "
                         "WHERE node_id = ? AND model = ?",
                         [state, detail, at, node.node_id, model])
        if seq > 0:
            conn.execute("UPDATE node_models SET directive_seq = MAX(COALESCE(directive_seq, "
                         "0), ?) WHERE node_id = ? AND model = ?",
                         [seq, node.node_id, model])
        conn.execute("UPDATE nodes SET last_seen = ? WHERE node_id = ?", [at, node.node_id])

    return Write(f"node {node.node_id}'s {action} of {model} version {version}", apply,
                 audited=True)


def witnessed(node_id: str, seq: int, head_hash: str) -> Write:
    """Keep the newest audit witness ``node_id`` showed in its hello, verified by the caller
    (``registry.trust.witness_check``); never lowered by an older one."""
    def apply(conn: sqlite3.Connection) -> None:
        conn.execute("UPDATE nodes SET witness_seq = ?, witness_hash = ? WHERE node_id = ? "
                     "AND (witness_seq IS NULL OR witness_seq < ?)",
                     [seq, head_hash, node_id, seq])

    return Write(f"node {node_id}'s audit witness (record {seq})", apply)


def quality(node_id: str, model: str, report: dict[str, Any]) -> Write:
    """A node's quality report of ``model`` (the last one is kept)."""
    at, data = now(), json.dumps(report)

    def apply(conn: sqlite3.Connection) -> None:
        conn.execute("UPDATE node_models SET report = ?, report_at = ? WHERE node_id = ? "
                     "AND model = ?", [data, at, node_id, model])
        conn.execute("UPDATE nodes SET last_seen = ? WHERE node_id = ?", [at, node_id])

    return Write(f"node {node_id}'s report of {model}", apply)


def _apply(db: sqlite_utils.Database, anchor: Anchor | None, writes: Sequence[Write]) -> None:
    if any(w.audited for w in writes):
        with audited(db, anchor) as conn:
            for w in writes:
                w.apply(conn)
    else:
        with transaction(db) as conn:
            for w in writes:
                w.apply(conn)


def _alone(db: sqlite_utils.Database, anchor: Anchor | None, write: Write) -> list[Write]:
    try:
        _apply(db, anchor, [write])
    except sqlite3.OperationalError:
        log.exception("writing %s failed; trying again", write.what)
        return [write]
    except Exception:
        log.exception("writing %s failed; dropped", write.what)
    return []
