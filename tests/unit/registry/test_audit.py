from __future__ import annotations

import sqlite3
from itertools import pairwise
from pathlib import Path

import pytest
import sqlite_utils

from registry import audit
from registry.db import connect, transaction


@pytest.fixture
def db(tmp_path: Path) -> sqlite_utils.Database:
    db = connect(tmp_path / "r.sqlite3")
    for i in range(5):
        with transaction(db) as conn:
            audit.append(conn, actor="a", action="publish", model="m", version=i + 1,
                         payload={"i": i, "text": "é"})
    return db


def test_intact_chain_verifies(db: sqlite_utils.Database) -> None:
    assert audit.verify(db) == (5, None)
    records = audit.records(db)
    assert [r.seq for r in records] == [1, 2, 3, 4, 5]
    assert records[0].prev_hash == audit.GENESIS
    assert all(b.prev_hash == a.hash for a, b in pairwise(records))


def test_triggers_reject_update_and_delete(db: sqlite_utils.Database) -> None:
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        db.conn.execute("UPDATE audit SET actor = 'mallory' WHERE seq = 2")
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        db.conn.execute("DELETE FROM audit WHERE seq = 5")


def test_tampered_row_is_named(db: sqlite_utils.Database) -> None:
    db.conn.execute("DROP TRIGGER audit_no_update")
    db.conn.execute("UPDATE audit SET payload = '{\"i\":99}' WHERE seq = 3")
    checked, finding = audit.verify(db)
    assert checked == 2
    assert finding is not None and finding.seq == 3 and "altered" in finding.reason


def test_rehashed_row_breaks_the_next_link(db: sqlite_utils.Database) -> None:
    """Recomputing the tampered row's own hash does not help: record 4 no longer links."""
    db.conn.execute("DROP TRIGGER audit_no_update")
    row = audit.records(db)[1]
    forged = audit.Record(**{**row.__dict__, "actor": "mallory", "hash": ""})
    db.conn.execute("UPDATE audit SET actor = ?, hash = ? WHERE seq = 2",
                    ["mallory", forged.expected_hash()])
    _, finding = audit.verify(db)
    assert finding is not None and finding.seq == 3 and "previous-hash" in finding.reason


def test_deleted_row_is_a_gap(db: sqlite_utils.Database) -> None:
    db.conn.execute("DROP TRIGGER audit_no_delete")
    db.conn.execute("DELETE FROM audit WHERE seq = 2")
    _, finding = audit.verify(db)
    assert finding is not None and finding.seq == 3 and "gap" in finding.reason


def test_record_and_change_commit_together(tmp_path: Path) -> None:
    db = connect(tmp_path / "r.sqlite3")
    with pytest.raises(RuntimeError), transaction(db) as conn:
        audit.append(conn, actor="a", action="publish")
        raise RuntimeError("the change failed")
    assert audit.records(db) == []
