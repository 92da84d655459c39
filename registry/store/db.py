"""The SQLite database: WAL mode, one writer through ``BEGIN IMMEDIATE``, recorded migrations."""

from __future__ import annotations

import random
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlite_utils

from registry.errors import NotPrimary
from registry.store import private
from registry.store.clock import now
from registry.store.migrations import MIGRATIONS, NOT_PRIMARY
from registry.store.role import refusal

BUSY_TIMEOUT_MS = 30_000


def connect(path: Path) -> sqlite_utils.Database:
    """Open (creating if needed) the registry database and bring its schema up to date."""
    private.database(path)  # 0600 in a 0700 home, whatever the umask
    private.tighten(path.parent, private.FOLDER)
    # isolation_level=None: transactions are explicit (``transaction``), never implicit.
    conn = sqlite3.connect(path, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000)
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    _wal(conn)
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("PRAGMA foreign_keys = ON")
    db = sqlite_utils.Database(conn)
    migrate(db)
    return db


def _wal(conn: sqlite3.Connection) -> None:
    """Switch the file to WAL (persistent). Converting a new file needs an exclusive lock, and
    SQLite answers "database is locked" at once, without waiting out the busy timeout, when
    another process is opening or converting it too: several first ``registry publish`` runs at
    once saw that. So: retry, with a little jitter, within the same timeout."""
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(random.uniform(0.005, 0.05))
            continue
        if mode != "wal":
            raise sqlite3.OperationalError(f"the registry database stays in {mode} mode, not WAL")
        return


@contextmanager
def transaction(db: sqlite_utils.Database) -> Iterator[sqlite3.Connection]:
    """``BEGIN IMMEDIATE`` … ``COMMIT``: takes the write lock up front, rolls back on error."""
    conn = db.conn
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException as exc:
        conn.execute("ROLLBACK")
        if isinstance(exc, sqlite3.IntegrityError) and NOT_PRIMARY in str(exc):
            raise NotPrimary(refusal(conn)) from exc
        raise
    conn.execute("COMMIT")


@contextmanager
def read(db: sqlite_utils.Database) -> Iterator[sqlite3.Connection]:
    """A read transaction (``BEGIN`` … ``COMMIT``): everything read in it is one snapshot."""
    conn = db.conn
    conn.execute("BEGIN")
    try:
        yield conn
    finally:
        conn.execute("COMMIT")


def applied_migrations(db: sqlite_utils.Database) -> list[int]:
    if "schema_migrations" not in db.table_names():
        return []
    return [row["id"] for row in db.query("SELECT id FROM schema_migrations ORDER BY id")]


def migrate(db: sqlite_utils.Database) -> None:
    db.conn.execute("CREATE TABLE IF NOT EXISTS schema_migrations "
                    "(id INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)")
    for number, name, sql in MIGRATIONS:
        with transaction(db) as conn:
            # Re-checked under the write lock: another process may have just applied it.
            if conn.execute("SELECT 1 FROM schema_migrations WHERE id = ?", (number,)).fetchone():
                continue
            for statement in _statements(sql):
                conn.execute(statement)
            conn.execute("INSERT INTO schema_migrations VALUES (?, ?, ?)", (number, name, now()))


def _statements(sql: str) -> list[str]:
    """Split a script on statement boundaries (``executescript`` would commit on its own)."""
    statements, buffer = [], ""
    for line in sql.splitlines(keepends=True):
        buffer += line
        if sqlite3.complete_statement(buffer):
            statements.append(buffer.strip())
            buffer = ""
    return [s for s in statements if s]


def integrity_check(db: sqlite_utils.Database) -> str:
    return str(db.conn.execute("PRAGMA integrity_check").fetchone()[0])
