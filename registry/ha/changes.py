"""Replication at the database: the captured changes a standby applies and the standbys'
positions that a semi-synchronous commit waits for (the role and lease that fence writes are
``registry.store.role``).

The primary's triggers copy every write to a replicated table (``migrations.REPLICATED``) into
``changes`` in commit order; a standby reads them in one read transaction (so it always gets
whole transactions), applies them in one transaction of its own with the same ids, and says how
far it got. Fencing is in SQLite too: a write to a replicated table is refused (``NOT_PRIMARY``)
unless this registry is standalone, or the primary with an unexpired lease, or applying what its
primary sent. So no code path and no other process can write to a standby or to a primary that
lost its lock, whatever it runs.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from dataclasses import dataclass
from typing import Any

import sqlite_utils

from registry.errors import RegistryError
from registry.store.db import transaction
from registry.store.migrations import REPLICATED
from registry.store.role import PROMOTE, promoted_term


def position(conn: sqlite3.Connection) -> int:
    """The id of the newest captured change (0: none): how far this registry's data goes."""
    row = conn.execute("SELECT max(id) FROM changes").fetchone()
    return int(row[0] or 0)


def prune(conn: sqlite3.Connection, keep: int) -> int:
    """Forget all but the newest ``keep`` changes (a standby further behind takes a snapshot);
    returns how many were deleted. ``changes`` is neither replicated nor fenced."""
    cursor = conn.execute("DELETE FROM changes WHERE id <= (SELECT max(id) FROM changes) - ?",
                          (keep,))
    return int(cursor.rowcount)


def first_position(conn: sqlite3.Connection) -> int:
    row = conn.execute("SELECT min(id) FROM changes").fetchone()
    return int(row[0] or 0)


def digest_at(conn: sqlite3.Connection, change_id: int) -> str | None:
    """The sha256 of change ``change_id`` (None: there is none): two registries agree on their
    history up to an id when they hold the same change there."""
    row = conn.execute("SELECT tbl, op, row FROM changes WHERE id = ?", (change_id,)).fetchone()
    if row is None:
        return None
    return hashlib.sha256(json.dumps([change_id, *row]).encode()).hexdigest()


@dataclass(frozen=True)
class Change:
    id: int
    table: str
    op: str
    row: str  # JSON object of the row's columns (upsert) or its key (delete)


def read_changes(conn: sqlite3.Connection, after: int, limit: int) -> list[Change]:
    """Changes after ``after``, oldest first. Call inside a read transaction and read up to the
    newest id in it: a batch then ends on a commit of the primary, never inside one."""
    rows = conn.execute("SELECT id, tbl, op, row FROM changes WHERE id > ? ORDER BY id LIMIT ?",
                        (after, limit)).fetchall()
    return [Change(int(r[0]), str(r[1]), str(r[2]), str(r[3])) for r in rows]


class BadChange(RegistryError):
    """A change a primary sent that does not fit this registry's schema."""

    exit_code = 5


def _checked(change: Change) -> tuple[str, tuple[str, ...], tuple[str, ...], dict[str, Any]]:
    spec = REPLICATED.get(change.table)
    if spec is None:
        raise BadChange(f"change {change.id}: table {change.table[:40]!r} is not replicated")
    columns, key = spec
    try:
        row = json.loads(change.row)
    except ValueError as exc:
        raise BadChange(f"change {change.id}: row is not JSON") from exc
    wanted = columns if change.op == "upsert" else key
    if change.op not in ("upsert", "delete") or not isinstance(row, dict) or \
            set(row) != set(wanted):
        raise BadChange(f"change {change.id} ({change.table} {change.op[:10]!r}): its columns "
                        f"are not the table's")
    for value in row.values():
        if value is not None and not isinstance(value, str | int | float):
            raise BadChange(f"change {change.id}: a value of type {type(value).__name__}")
    return change.table, columns, key, row


def apply(db: sqlite_utils.Database, changes: list[Change]) -> int:
    """Apply a batch a primary sent, in one transaction, keeping its ids; return the new
    position. Every change is checked against the schema (names come from ``REPLICATED``,
    never from the wire); a change this registry already holds, or one out of order, is
    refused with the rest of the batch."""
    checked = [_checked(c) for c in changes]
    with transaction(db) as conn:
        at = position(conn)
        conn.execute("UPDATE replication_state SET applying = 1 WHERE id = 1")
        for change, (table, columns, key, row) in zip(changes, checked, strict=True):
            if change.id <= at:
                raise BadChange(f"change {change.id} is not after this registry's position {at}")
            at = change.id
            if change.op == "upsert":
                updates = ", ".join(f"{c} = excluded.{c}" for c in columns if c not in key)
                conflict = (f"ON CONFLICT ({', '.join(key)}) DO UPDATE SET {updates}"
                            if updates else "ON CONFLICT DO NOTHING")
                conn.execute(f"INSERT INTO {table} ({', '.join(columns)}) VALUES "
                             f"({', '.join('?' for _ in columns)}) {conflict}",
                             [row[c] for c in columns])
            else:
                conn.execute(f"DELETE FROM {table} WHERE "
                             f"{' AND '.join(f'{c} = ?' for c in key)}", [row[c] for c in key])
            conn.execute("INSERT INTO changes (id, tbl, op, row) VALUES (?, ?, ?, ?)",
                         (change.id, change.table, change.op, change.row))
        conn.execute("UPDATE replication_state SET applying = 0 WHERE id = 1")
        if any(c.table == "audit" and PROMOTE in c.row for c in changes):
            promoted_term(conn)
    return at


def blobs_in(changes: list[Change]) -> list[tuple[str, int]]:
    """The blobs a batch records (sha256, size): a standby holds each before it commits."""
    wanted = []
    for change in changes:
        if change.table == "blobs" and change.op == "upsert":
            row = json.loads(change.row)
            wanted.append((str(row["sha256"]), int(row["size"])))
    return wanted


def acked(conn: sqlite3.Connection, replica: str, at: int) -> None:
    """A standby says it holds everything up to change ``at`` (the primary records it)."""
    conn.execute("INSERT INTO replicas (replica, position, acked_at) VALUES (?, ?, ?) ON "
                 "CONFLICT (replica) DO UPDATE SET position = max(position, excluded.position),"
                 " acked_at = excluded.acked_at", (replica, at, time.time()))


def standbys_at(conn: sqlite3.Connection, at: int, fresh_s: float = 30.0) -> list[str]:
    """The standbys (heard from in the last ``fresh_s``) that hold change ``at``."""
    rows = conn.execute("SELECT replica FROM replicas WHERE position >= ? AND acked_at > ? "
                        "ORDER BY replica", (at, time.time() - fresh_s)).fetchall()
    return [str(r[0]) for r in rows]


FRESH_S = 3.0  # a standby that acked (or heartbeat-acked, once a second) this recently is
# following; with fewer following than a commit waits for, it does not wait at all


def wait_replicated(db: sqlite_utils.Database, at: int, count: int, timeout_s: float,
                    poll_s: float = 0.01) -> list[str] | None:
    """Wait until ``count`` standbys hold change ``at``: their names, or None at the timeout
    (which is counted: the commit stands on the primary alone, replicated asynchronously).
    When fewer than ``count`` standbys are following at all (none acked in ``FRESH_S``), the
    wait would only delay the answer: it ends at once, counted the same way."""
    deadline = time.monotonic() + timeout_s
    while True:
        holders = standbys_at(db.conn, at)
        if len(holders) >= count:
            return holders
        following = len(standbys_at(db.conn, 0, FRESH_S))
        if time.monotonic() >= deadline or following < count:
            try:
                with transaction(db) as conn:
                    conn.execute("UPDATE replication_state SET async_commits = "
                                    "async_commits + 1 WHERE id = 1")
            except sqlite3.Error:
                pass  # a count, not the change: the change is committed already
            return None
        time.sleep(poll_s)
