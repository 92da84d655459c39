"""The registry's role in a replicated group (standalone, primary or standby) and the primary's
lease: what fences writes. A write to a replicated table is refused (``NOT_PRIMARY``, raised by
the database's own triggers) unless this registry is standalone, or the primary with an
unexpired lease, or applying what its primary sent (``registry.ha.changes``)."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from registry.store.clock import now
from registry.store.migrations import NOT_PRIMARY

ROLES = ("standalone", "primary", "standby")


@dataclass(frozen=True)
class RoleState:
    role: str
    term: int
    registry_id: str | None
    leader: str | None  # host:port of the primary it follows (or its own, as primary)
    lease_until: float
    async_commits: int
    history_term: int  # the term of the newest promotion in its audit chain: how recent its
    # history is (an election prefers the newest history, then the longest)

    @property
    def writable(self) -> bool:
        return self.role == "standalone" or (self.role == "primary" and
                                              self.lease_until > time.time())


def state(conn: sqlite3.Connection) -> RoleState:
    row = conn.execute("SELECT role, term, registry_id, leader, lease_until, async_commits, "
                       "history_term FROM replication_state WHERE id = 1").fetchone()
    return RoleState(str(row[0]), int(row[1]), row[2], row[3], float(row[4]), int(row[5]),
                 int(row[6]))


def read_state(database: Path) -> RoleState | None:
    """The replication state of the database file at ``database``, opened read-only (another
    process's registry, or one not opened yet); None when there is none to read."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True,
                                                timeout=5)) as conn:
            return state(conn)
    except (sqlite3.Error, TypeError):  # no file, no table yet, no row
        return None


PROMOTE = "registry-promote"  # the audit action of a new primary


def promoted_term(conn: sqlite3.Connection) -> int:
    """The term of the newest promotion recorded in the audit chain (0: none), stored as the
    history's term."""
    row = conn.execute("SELECT payload FROM audit WHERE action = ? ORDER BY seq DESC LIMIT 1",
                       (PROMOTE,)).fetchone()
    term = 0
    if row is not None:
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            term = int(json.loads(row[0]).get("term", 0))
    conn.execute("UPDATE replication_state SET history_term = ? WHERE id = 1", (term,))
    return term


def set_role(conn: sqlite3.Connection, role: str, *, term: int | None = None,
             registry_id: str | None = None, leader: str | None = None,
             lease_until: float = 0.0) -> None:
    """Change the role (in its own transaction, or the caller's). ``standby`` and a lapsed
    ``primary`` refuse writes from the moment this commits."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}")
    conn.execute("UPDATE replication_state SET role = ?, term = COALESCE(?, term), "
                 "registry_id = COALESCE(?, registry_id), leader = ?, lease_until = ?, "
                 "updated_at = ? WHERE id = 1",
                 (role, term, registry_id, leader, lease_until, now()))


def renew(conn: sqlite3.Connection, until: float) -> None:
    """Move the primary's lease on (only while it is the primary: a demoted one stays so)."""
    conn.execute("UPDATE replication_state SET lease_until = ? WHERE id = 1 AND role = "
                 "'primary'", (until,))


def refusal(conn: sqlite3.Connection) -> str:
    """Why this registry refuses writes, for the person who tried one."""
    s = state(conn)
    if s.role == "standby":
        where = f"the primary is {s.leader}" if s.leader else "no primary is known yet"
        return (f"this registry is a standby ({s.registry_id or 'unnamed'}, term {s.term}): it "
                f"refuses writes; {where}. Run the command on the primary's host")
    late = time.time() - s.lease_until
    return (f"this registry was the primary (term {s.term}) but its lease ran out "
            f"{max(late, 0):.1f}s ago: `registry serve` is not running here or lost its "
            f"Consul lock, so another registry may be primary now")


def is_refusal(exc: BaseException) -> bool:
    return isinstance(exc, sqlite3.IntegrityError) and NOT_PRIMARY in str(exc)
