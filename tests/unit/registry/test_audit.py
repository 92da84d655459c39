from __future__ import annotations

import sqlite3
from itertools import pairwise
from pathlib import Path

import pytest
import sqlite_utils

from registry.store import chain
from registry.store.db import connect, transaction


@pytest.fixture
def db(tmp_path: Path) -> sqlite_utils.Database:
    db = connect(tmp_path / "r.sqlite3")
    for i in range(5):
        with transaction(db) as conn:
            chain.append(conn, actor="a", action="publish", model="m", version=i + 1,
                         sha256=f"{i:x}" * 64, payload={"i": i, "text": "é"})
    return db


def test_intact_chain_verifies(db: sqlite_utils.Database) -> None:
    assert chain.verify(db) == (5, None)
    records = chain.records(db)
    assert [r.seq for r in records] == [1, 2, 3, 4, 5]
    assert records[0].prev_hash == chain.GENESIS
    assert all(b.prev_hash == a.hash for a, b in pairwise(records))


def test_triggers_reject_update_and_delete(db: sqlite_utils.Database) -> None:
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        db.conn.execute("UPDATE audit SET actor = 'mallory' WHERE seq = 2")
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        db.conn.execute("DELETE FROM audit WHERE seq = 5")


def test_tampered_row_is_named(db: sqlite_utils.Database) -> None:
    db.conn.execute("DROP TRIGGER audit_no_update")
    db.conn.execute("UPDATE audit SET payload = '{\"i\":99}' WHERE seq = 3")
    checked, finding = chain.verify(db)
    assert checked == 2
    assert finding is not None and finding.seq == 3 and "altered" in finding.reason


# Every column of the audit table, each with another value a forger might write into row 3.
TAMPERED = {
    "at": "2000-01-01T00:00:00.000+00:00",
    "actor": "mallory",
    "action": "rollback",
    "model": "other",
    "version": 99,
    "sha256": "f" * 64,
    "payload": '{"i":2,"text":"e"}',
}


def test_every_audit_column_is_tested_below(db: sqlite_utils.Database) -> None:
    columns = [row[1] for row in db.conn.execute("PRAGMA table_info(audit)")]
    assert set(columns) == {"seq", "prev_hash", "hash", *TAMPERED}


@pytest.mark.parametrize("column", sorted(TAMPERED))
def test_each_hashed_column_tampered_is_named(db: sqlite_utils.Database, column: str) -> None:
    """The hash covers every column: changing any one of them in place is found, in that row."""
    db.conn.execute("DROP TRIGGER audit_no_update")
    db.conn.execute(f"UPDATE audit SET {column} = ? WHERE seq = 3", [TAMPERED[column]])
    checked, finding = chain.verify(db)
    assert checked == 2
    assert finding is not None and finding.seq == 3 and "altered" in finding.reason


@pytest.mark.parametrize("column", ["model", "version", "sha256"])
def test_a_nulled_column_is_named(db: sqlite_utils.Database, column: str) -> None:
    db.conn.execute("DROP TRIGGER audit_no_update")
    db.conn.execute(f"UPDATE audit SET {column} = NULL WHERE seq = 3")
    _, finding = chain.verify(db)
    assert finding is not None and finding.seq == 3 and "altered" in finding.reason


def test_tampered_hash_or_link_is_named(db: sqlite_utils.Database) -> None:
    db.conn.execute("DROP TRIGGER audit_no_update")
    db.conn.execute("UPDATE audit SET hash = ? WHERE seq = 3", ["e" * 64])
    _, finding = chain.verify(db)
    assert finding is not None and finding.seq == 3 and "altered" in finding.reason
    db.conn.execute("UPDATE audit SET hash = ? WHERE seq = 3", [chain.records(db)[2]
                                                                .expected_hash()])
    assert chain.verify(db) == (5, None)
    db.conn.execute("UPDATE audit SET prev_hash = ? WHERE seq = 3", ["e" * 64])
    _, finding = chain.verify(db)
    assert finding is not None and finding.seq == 3 and "previous-hash" in finding.reason


def test_renumbered_row_is_named(db: sqlite_utils.Database) -> None:
    db.conn.execute("DROP TRIGGER audit_no_update")
    db.conn.execute("UPDATE audit SET seq = 50 WHERE seq = 5")
    assert chain.verify(db) == (4, chain.Finding(50, "sequence gap: expected record 5"))


def test_a_rehashed_renumbering_is_still_found(db: sqlite_utils.Database) -> None:
    """Rows 4 and 5 moved down to fill a deleted row 3, each re-hashed: the link breaks."""
    db.conn.execute("DROP TRIGGER audit_no_update")
    db.conn.execute("DROP TRIGGER audit_no_delete")
    old = chain.records(db)
    db.conn.execute("DELETE FROM audit WHERE seq = 3")
    for record in old[3:]:
        moved = chain.Record(**{**record.__dict__, "seq": record.seq - 1, "hash": ""})
        db.conn.execute("UPDATE audit SET seq = ?, hash = ? WHERE seq = ?",
                        [moved.seq, moved.expected_hash(), record.seq])
    _, finding = chain.verify(db)
    assert finding is not None and finding.seq == 3 and "previous-hash" in finding.reason


def test_rehashed_row_breaks_the_next_link(db: sqlite_utils.Database) -> None:
    """Recomputing the tampered row's own hash does not help: record 4 no longer links."""
    db.conn.execute("DROP TRIGGER audit_no_update")
    row = chain.records(db)[1]
    forged = chain.Record(**{**row.__dict__, "actor": "mallory", "hash": ""})
    db.conn.execute("UPDATE audit SET actor = ?, hash = ? WHERE seq = 2",
                    ["mallory", forged.expected_hash()])
    _, finding = chain.verify(db)
    assert finding is not None and finding.seq == 3 and "previous-hash" in finding.reason


def test_the_newest_row_tampered_is_named(db: sqlite_utils.Database) -> None:
    """The last record has no successor whose link would break: its own hash is checked."""
    db.conn.execute("DROP TRIGGER audit_no_update")
    db.conn.execute("UPDATE audit SET payload = '{\"i\":99}' WHERE seq = 5")
    assert chain.verify(db) == (4, chain.Finding(5, "content does not match its hash (altered)"))


def test_deleted_row_is_a_gap(db: sqlite_utils.Database) -> None:
    db.conn.execute("DROP TRIGGER audit_no_delete")
    db.conn.execute("DELETE FROM audit WHERE seq = 2")
    _, finding = chain.verify(db)
    assert finding is not None and finding.seq == 3 and "gap" in finding.reason


def test_record_and_change_commit_together(tmp_path: Path) -> None:
    db = connect(tmp_path / "r.sqlite3")
    with pytest.raises(RuntimeError), transaction(db) as conn:
        chain.append(conn, actor="a", action="publish")
        raise RuntimeError("the change failed")
    assert chain.records(db) == []
