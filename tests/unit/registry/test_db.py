from __future__ import annotations

from pathlib import Path

from registry.db import applied_migrations, connect, integrity_check
from registry.migrations import MIGRATIONS


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
