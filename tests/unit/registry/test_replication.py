"""Replication at the database: writes fenced by role and lease in SQLite, changes captured in
commit order and applied on another database to the same state, hostile changes refused, the
election's reading of what peers put in Consul."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import pytest
import sqlite_utils

from registry.errors import NotPrimary, SigningKeyError
from registry.fleet.nodes import NodeBook
from registry.ha import changes, leader
from registry.ha.changes import BadChange, Change
from registry.settings import RegistrySettings
from registry.store import chain, role
from registry.store.db import connect, transaction
from registry.store.migrations import REPLICATED
from registry.trust import keys


def db_at(path: Path) -> sqlite_utils.Database:
    return connect(path / "registry.sqlite3")


def write(db: sqlite_utils.Database, action: str = "note") -> None:
    with transaction(db) as conn:
        chain.append(conn, actor="t", action=action, payload={"x": "é\n"})


def everything(db: sqlite_utils.Database) -> dict[str, list[tuple[object, ...]]]:
    return {t: db.conn.execute(f"SELECT * FROM {t} ORDER BY 1, 2").fetchall()
            for t in REPLICATED}


def set_role(db: sqlite_utils.Database, name: str, lease_until: float = 0.0,
             leader_address: str | None = None) -> None:
    with transaction(db) as conn:
        role.set_role(conn, name, term=2, registry_id="registry-a",
                      leader=leader_address, lease_until=lease_until)


def test_a_standalone_registry_writes_and_captures_each_change(tmp_path: Path) -> None:
    db = db_at(tmp_path)
    write(db)
    write(db)
    found = changes.read_changes(db.conn, 0, 100)
    assert [c.table for c in found] == ["audit", "audit"]
    assert json.loads(found[1].row)["seq"] == 2
    assert changes.position(db.conn) == 2


def test_a_standby_refuses_writes_from_any_code_path_naming_its_primary(tmp_path: Path) -> None:
    db = db_at(tmp_path)
    set_role(db, "standby", leader_address="10.0.0.1:50051")
    with pytest.raises(NotPrimary, match=r"standby.*10\.0\.0\.1:50051"):
        write(db)
    with pytest.raises(NotPrimary):  # a revocation, through its own module
        NodeBook(db, None).revoke("edge-1", "t")  # type: ignore[arg-type]
    with transaction(db) as conn:  # what nodes report is not replicated (nor fenced)
        conn.execute("INSERT INTO nodes (node_id, tier, region, first_seen, last_seen) "
                     "VALUES ('edge-9', 'edge', 'eu', 'now', 'now')")
    # even a raw statement from another process: the trigger is in the file
    raw = sqlite3.connect(tmp_path / "registry.sqlite3")
    with pytest.raises(sqlite3.IntegrityError, match="not the primary"):
        raw.execute("INSERT INTO models VALUES ('m', 'now')")
    raw.close()
    assert changes.position(db.conn) == 0


def test_a_primary_writes_only_while_its_lease_lasts(tmp_path: Path) -> None:
    db = db_at(tmp_path)
    set_role(db, "primary", lease_until=time.time() + 30)
    write(db)
    with transaction(db) as conn:
        role.renew(conn, time.time() - 0.1)  # the lease ran out
    with pytest.raises(NotPrimary, match="lease ran out"):
        write(db)
    assert changes.position(db.conn) == 1


@pytest.mark.parametrize(("lease_in_s", "writable"), [(2.0, True), (-2.0, False)])
def test_what_the_registry_says_of_its_lease_is_what_the_database_does(
        tmp_path: Path, lease_in_s: float, writable: bool) -> None:
    """The lease is wall time (a primary's lease is compared with the database's clock, and
    may be read by another process): ``registry replication`` says "accepting writes" exactly
    when a write is accepted, a lease just ahead of now or just behind it."""
    db = db_at(tmp_path)
    set_role(db, "primary", lease_until=time.time() + lease_in_s)
    assert role.state(db.conn).writable is writable
    if writable:
        write(db)
    else:
        with pytest.raises(NotPrimary, match="lease ran out"):
            write(db)
    assert changes.position(db.conn) == int(writable)


def test_applied_changes_make_the_same_state_and_the_same_positions(tmp_path: Path) -> None:
    primary, standby = db_at(tmp_path / "a"), db_at(tmp_path / "b")
    write(primary)
    with transaction(primary) as conn:
        conn.execute("INSERT INTO models VALUES ('m', 'now')")
        conn.execute("INSERT INTO node_tokens VALUES ('edge-1', 1, 'now')")
    with transaction(primary) as conn:
        conn.execute("UPDATE node_tokens SET generation = 2 WHERE node_id = 'edge-1'")
        conn.execute("INSERT INTO cascade_policies VALUES ('m', 'static', 12.5, 'traffic', "
                     "'now', NULL)")
    with transaction(primary) as conn:
        conn.execute("DELETE FROM cascade_policies WHERE model = 'm'")
    set_role(standby, "standby")
    at = changes.apply(standby, changes.read_changes(primary.conn, 0, 1000))
    assert at == changes.position(primary.conn)
    assert everything(standby) == everything(primary)
    assert changes.digest_at(standby.conn, at) == changes.digest_at(primary.conn, at)
    # the standby's own capture did not run: its changes are the primary's, ids and all
    assert changes.read_changes(standby.conn, 0, 1000) == \
        changes.read_changes(primary.conn, 0, 1000)
    assert chain.verify(standby) == (1, None)
    # and applying leaves it fenced again
    with pytest.raises(NotPrimary):
        write(standby)


@pytest.mark.parametrize(("change", "why"), [
    (Change(2, "nodes", "upsert", "{}"), "not replicated"),
    (Change(2, "models; DROP TABLE audit", "upsert", "{}"), "not replicated"),
    (Change(2, "models", "upsert", '{"name": "m"}'), "columns"),
    (Change(2, "models", "upsert", '{"name": "m", "created_at": "x", "evil": 1}'), "columns"),
    (Change(2, "models", "upsert", '{"name": ["m"], "created_at": "x"}'), "type list"),
    (Change(2, "models", "drop", '{"name": "m"}'), "columns"),
    (Change(2, "models", "upsert", "not json"), "not JSON"),
])
def test_a_hostile_change_is_refused_with_its_whole_batch(tmp_path: Path, change: Change,
                                                          why: str) -> None:
    db = db_at(tmp_path)
    good = Change(1, "models", "upsert", '{"name": "ok", "created_at": "x"}')
    with pytest.raises(BadChange, match=why):
        changes.apply(db, [good, change])
    assert changes.position(db.conn) == 0
    assert db.conn.execute("SELECT count(*) FROM models").fetchone()[0] == 0


def test_a_change_already_held_or_out_of_order_is_refused(tmp_path: Path) -> None:
    db = db_at(tmp_path)
    first = Change(5, "models", "upsert", '{"name": "a", "created_at": "x"}')
    changes.apply(db, [first])
    with pytest.raises(BadChange, match="not after"):
        changes.apply(db, [Change(5, "models", "upsert", '{"name": "b", "created_at": "x"}')])
    assert [r[0] for r in db.conn.execute("SELECT name FROM models")] == ["a"]


def test_semi_sync_waits_for_a_standby_and_counts_a_timeout(tmp_path: Path) -> None:
    db = db_at(tmp_path)
    write(db)
    at = changes.position(db.conn)
    with transaction(db) as conn:
        changes.acked(conn, "registry-b", at)
    assert changes.wait_replicated(db, at, 1, 1.0) == ["registry-b"]
    write(db)
    started = time.monotonic()
    assert changes.wait_replicated(db, at + 1, 1, 0.2) is None
    assert time.monotonic() - started >= 0.2
    assert role.state(db.conn).async_commits == 1
    # no standby following at all (its last ack is old): no point waiting, the same count
    with transaction(db) as conn:
        conn.execute("UPDATE replicas SET acked_at = acked_at - 60")
    started = time.monotonic()
    assert changes.wait_replicated(db, at + 1, 1, 30) is None
    assert time.monotonic() - started < 5
    assert role.state(db.conn).async_commits == 2


def test_the_history_term_follows_promotions_applied_or_made(tmp_path: Path) -> None:
    primary, standby = db_at(tmp_path / "a"), db_at(tmp_path / "b")
    with transaction(primary) as conn:
        leader.promotion_record(conn, "t", "registry-a", 4, None)
    assert role.state(primary.conn).history_term == 4
    changes.apply(standby, changes.read_changes(primary.conn, 0, 100))
    assert role.state(standby.conn).history_term == 4


@pytest.mark.parametrize("raw", [
    None, b"", b"[]", b'{"registry_id": "a"}',
    b'{"registry_id": "A B", "address": "10.0.0.1:1", "term": 1}',
    b'{"registry_id": "a", "address": "10.0.0.1:1; rm -rf /", "term": 1}',
    b'{"registry_id": "a", "address": "10.0.0.1:99999", "term": 1}',
    b'{"registry_id": "a", "address": "10.0.0.1:1", "term": -1}',
    b'{"registry_id": "a", "address": "10.0.0.1:1", "term": "1"}',
])
def test_a_lock_value_that_is_not_a_registry_s_is_not_followed(raw: bytes | None) -> None:
    assert leader.leader_value(raw) is None


def test_a_lock_value_a_registry_wrote_names_its_address() -> None:
    raw = json.dumps({"registry_id": "registry-b", "address": "10.0.0.2:50051", "term": 3})
    assert leader.leader_value(raw.encode()) == ("registry-b", "10.0.0.2:50051", 3)


@pytest.mark.parametrize("raw", [
    b'{"registry_id": "b", "history_term": 1}',
    b'{"registry_id": "b", "history_term": 1, "position": 1e300}',
    b'{"registry_id": "b", "history_term": -1, "position": 3}',
    b'{"registry_id": "b\\n", "history_term": 1, "position": 3}',
])
def test_a_malformed_candidate_entry_is_ignored(raw: bytes) -> None:
    assert leader.candidate(raw) is None


def test_pruned_changes_send_a_standby_behind_them_to_a_snapshot(tmp_path: Path) -> None:
    db = db_at(tmp_path)
    for _ in range(10):
        write(db)
    with transaction(db) as conn:
        assert changes.prune(conn, 4) == 6
    assert [c.id for c in changes.read_changes(db.conn, 0, 100)] == [7, 8, 9, 10]
    assert changes.first_position(db.conn) == 7
    assert chain.verify(db) == (10, None)  # the data itself is untouched


def test_a_member_of_a_group_never_mints_its_own_signing_key(tmp_path: Path) -> None:
    """Nodes pin one key: a standby (or primary) without the provisioned key must not make a
    new one on first use, as a standalone registry does."""
    db = db_at(tmp_path)
    set_role(db, "standby")
    settings = RegistrySettings(home=tmp_path)
    with pytest.raises(SigningKeyError, match="replicated group"):
        keys.signer(settings)
    assert not settings.signing_key_path.exists()
    set_role(db, "standalone")
    assert keys.signer(settings).key_id  # standalone: made on first use, as before
