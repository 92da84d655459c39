from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

from registry.store.db import applied_migrations, connect, integrity_check
from registry.store.migrations import MIGRATIONS


def test_migrations_are_recorded_once_and_wal_is_on(tmp_path: Path) -> None:
    path = tmp_path / "r.sqlite3"
    db = connect(path)
    assert applied_migrations(db) == [m[0] for m in MIGRATIONS]
    db.conn.close()
    again = connect(path)  # reopening applies nothing twice
    assert applied_migrations(again) == [m[0] for m in MIGRATIONS]
    assert again.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert integrity_check(again) == "ok"
    assert {"models", "versions", "artifacts", "aliases", "rollouts", "audit", "blobs"} <= set(
        again.table_names())


def _open(path: str, barrier: Any, errors: Any) -> None:
    barrier.wait()
    try:
        connect(Path(path)).conn.close()
    except Exception as exc:  # reported to the test, not lost in the child
        errors.put(f"{type(exc).__name__}: {exc}")


def test_processes_opening_a_new_registry_at_once_all_succeed(tmp_path: Path) -> None:
    """Three `registry publish` runs started together on a new registry each open (and try to
    convert to WAL) the same new file; SQLite refused some of them at once ("database is
    locked", about 1 open in 15 here) until the conversion was retried."""
    ctx = multiprocessing.get_context("fork")
    errors = ctx.Queue()
    for round_ in range(30):
        path = str(tmp_path / f"r{round_}.sqlite3")
        barrier = ctx.Barrier(3)
        procs = [ctx.Process(target=_open, args=(path, barrier, errors)) for _ in range(3)]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join(timeout=60)
            assert proc.exitcode == 0
        db = connect(Path(path))
        assert db.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert applied_migrations(db) == [m[0] for m in MIGRATIONS]
        db.conn.close()
    found = []
    while not errors.empty():
        found.append(errors.get())
    assert found == []
