"""Retiring a model (``registry retire NAME``): no node is to run it any more.

A retirement ends what sends the model anywhere (its ``production`` and ``canary`` aliases, an
unfinished wave rollout) and records who retired it, when, why and which version was in
production, in the model's ``retirements`` row (replicated like the rest of the catalog) and an
audit record, in the caller's one transaction. Nothing else is removed: every version, its
manifest, signature, blobs and audit records stay, so ``registry show NAME`` still tells the
model's history and ``registry pull NAME@N`` still works.

The nodes are told by ``registry serve`` (``registry.server.push``): each node that holds the
model gets a directive signed for it, which it obeys only when it is fresher than every
directive it accepted for that model (``sync.wire.retire``).

Publishing the model again (any way: production, canary, waves) or ``registry promote NAME
--version N`` brings it back, as that version: the retirement row goes, an ``unretire`` audit
record says by what.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any

from registry.errors import RegistryError
from registry.releases import waves
from registry.releases.names import CANARY, PRODUCTION, check_name
from registry.store import chain
from registry.store.clock import now


class NotRetirable(RegistryError):
    """A retire the user asked for by mistake: no such model (one line, exit 2)."""

    exit_code = 2


@dataclass(frozen=True)
class Retirement:
    model: str
    version: int | None  # production when it was retired (None: there was none)
    seq: int  # the audit record of the retirement
    actor: str
    reason: str | None
    retired_at: str

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "version": self.version, "seq": self.seq,
                "actor": self.actor, "reason": self.reason, "retired_at": self.retired_at}


COLUMNS = "model, version, seq, actor, reason, retired_at"


def retirements(conn: sqlite3.Connection) -> dict[str, Retirement]:
    """Every retired model's retirement."""
    rows = conn.execute(f"SELECT {COLUMNS} FROM retirements ORDER BY model").fetchall()
    return {row[0]: Retirement(*row) for row in rows}


def retirement(conn: sqlite3.Connection, model: str) -> Retirement | None:
    row = conn.execute(f"SELECT {COLUMNS} FROM retirements WHERE model = ?",
                       [model]).fetchone()
    return Retirement(*row) if row else None


def retire(conn: sqlite3.Connection, actor: str, model: str,
           reason: str | None) -> tuple[Retirement, bool]:
    """Retire ``model`` inside the caller's audited transaction; returns the retirement and
    whether this call made it (False: it was retired already, nothing is written)."""
    check_name(model)
    if not conn.execute("SELECT 1 FROM models WHERE name = ?", [model]).fetchone():
        raise NotRetirable(f"no model named {model!r} in the registry (`registry list` shows "
                           f"the models)")
    done = retirement(conn, model)
    if done is not None:
        return done, False
    aliases = dict(conn.execute("SELECT alias, version FROM aliases WHERE model = ?",
                                [model]).fetchall())
    production = aliases.get(PRODUCTION)
    waves.end(conn, model, actor, "superseded", f"{model} retired by {actor}")
    record = chain.append(conn, actor=actor, action="retire", model=model, version=production,
                          payload={"production": production, "canary": aliases.get(CANARY),
                                   "reason": reason})
    conn.execute("DELETE FROM aliases WHERE model = ? AND alias IN (?, ?)",
                 [model, PRODUCTION, CANARY])
    made = Retirement(model, production, record.seq, actor, reason, now())
    conn.execute(f"INSERT INTO retirements ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)",
                 [made.model, made.version, made.seq, made.actor, made.reason,
                  made.retired_at])
    return made, True


def unretire(conn: sqlite3.Connection, actor: str, model: str, version: int, by: str) -> None:
    """A retired model is brought back by ``by`` (publish, promote) as ``version``, audited;
    a model that is not retired is left as it is. Inside the caller's transaction."""
    done = retirement(conn, model)
    if done is None:
        return
    chain.append(conn, actor=actor, action="unretire", model=model, version=version,
                 payload={"by": by, "retired_seq": done.seq})
    conn.execute("DELETE FROM retirements WHERE model = ?", [model])
