"""Moving an alias: ``point`` (the alias and a rollout row naming its targets), which publish,
promote and rollback share; promote and rollback are the changes that move ``production``.
Each runs inside the caller's audited transaction."""

from __future__ import annotations

import json
import sqlite3

from registry.errors import RegistryError
from registry.releases import retire, waves
from registry.releases.names import ALL_NODES, CANARY, PRODUCTION
from registry.releases.reads import CatalogReads
from registry.store import chain
from registry.store.clock import now


def point(conn: sqlite3.Connection, model: str, alias: str, version: int,
          targets: list[str]) -> None:
    conn.execute("INSERT INTO aliases VALUES (?, ?, ?, ?) ON CONFLICT (model, alias) "
                 "DO UPDATE SET version = excluded.version, updated_at = excluded.updated_at",
                 [model, alias, version, now()])
    conn.execute("INSERT INTO rollouts (model, alias, version, targets, created_at) "
                 "VALUES (?, ?, ?, ?, ?)", [model, alias, version, json.dumps(targets), now()])


def promote(conn: sqlite3.Connection, catalog: CatalogReads, actor: str, model: str,
            version: int | None = None) -> int:
    """Move ``production`` to VERSION (default: the canary version, else the version of the
    unfinished wave rollout); clears the canary and ends the wave rollouts."""
    catalog.require_model(model)
    rolling = waves.unfinished(conn, model)
    target = version or catalog.alias(model, CANARY) or \
        (rolling[-1].version if rolling else None)
    if target is None:
        raise RegistryError(f"{model} has no canary or wave rollout to promote; name a version")
    catalog.require_version(model, target)
    previous = catalog.alias(model, PRODUCTION)
    for r in rolling:
        waves.end(conn, model, actor, "done" if r.version == target else "superseded",
                  f"version {target} promoted by {actor}")
    chain.append(conn, actor=actor, action="promote", model=model, version=target,
                 payload={"from": previous, "to": target})
    retire.unretire(conn, actor, model, target, "promote")  # promoting brings it back
    point(conn, model, PRODUCTION, target, ALL_NODES)
    conn.execute("DELETE FROM aliases WHERE model = ? AND alias = ?", [model, CANARY])
    return target


def rollback(conn: sqlite3.Connection, catalog: CatalogReads, actor: str, model: str,
             to: int | None = None) -> tuple[int, int]:
    """Point ``production`` back to TO (default: the newest version below the current)."""
    catalog.require_model(model)
    current = catalog.alias(model, PRODUCTION)
    if current is None:
        raise RegistryError(f"{model} has no production version to roll back from")
    if to is None:
        to = _version_before(conn, model, current)
    catalog.require_version(model, to)
    if to == current:
        raise RegistryError(f"{model} production is already version {to}")
    waves.end(conn, model, actor, "superseded", f"rolled back to version {to} by {actor}")
    chain.append(conn, actor=actor, action="rollback", model=model, version=to,
                 payload={"from": current, "to": to})
    point(conn, model, PRODUCTION, to, ALL_NODES)
    return current, to


def _version_before(conn: sqlite3.Connection, model: str, current: int) -> int:
    row = conn.execute("SELECT MAX(version) FROM versions WHERE model = ? AND version < ?",
                       [model, current]).fetchone()
    if row[0] is None:
        raise RegistryError(f"{model} version {current} is the first version; there is "
                            f"nothing to roll back to")
    return int(row[0])
