"""Audit witnesses state only what a standby holds (``registry.ha.witness_gate``): a benign
failover never makes ``registry audit --verify`` say "rewritten", real rewriting still does.

Real registry databases: a primary and a standby that applies the primary's captured changes,
its acks recorded as the primary's Follow stream records them; what nodes were told is checked
the way ``audit --verify`` checks it (``anchor.witnessed``)."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest
import sqlite_utils

from registry.fleet import nodes
from registry.ha import changes, leader, witness_gate
from registry.ha.witness_gate import WitnessGate
from registry.store import chain, role
from registry.store.chain import Head
from registry.store.db import connect, read, transaction
from registry.trust import anchor


def db_at(path: Path, name: str) -> sqlite_utils.Database:
    return connect(path / name / "registry.sqlite3")


def as_role(db: sqlite_utils.Database, name: str, term: int = 1) -> None:
    with transaction(db) as conn:
        role.set_role(conn, name, term=term, registry_id=f"registry-{name}",
                      lease_until=time.time() + 60 if name == "primary" else 0.0)


def write(db: sqlite_utils.Database, action: str = "note") -> Head:
    with transaction(db) as conn:
        chain.append(conn, actor="t", action=action, payload={"x": 1})
        head = chain.head(conn)
    assert head is not None
    return head


def replicate(primary: sqlite_utils.Database, standby: sqlite_utils.Database,
              replica: str = "registry-b") -> int:
    """The standby applies everything the primary has and acks it (what Follow does)."""
    at = changes.position(standby.conn)
    found = changes.read_changes(primary.conn, at, 10_000)
    if found:
        at = changes.apply(standby, found)
    ack(primary, replica, at)
    return at


def ack(primary: sqlite_utils.Database, replica: str, at: int) -> None:
    with transaction(primary) as conn:
        changes.acked(conn, replica, at)


def due(gate: WitnessGate, db: sqlite_utils.Database) -> Head | None:
    with read(db) as conn:
        return gate.due(conn)


def shown(db: sqlite_utils.Database, node: str, head: Head) -> None:
    """Node ``node`` shows ``head`` in its hello to the registry at ``db`` (kept as
    ``WitnessTeller.shown`` keeps it)."""
    with transaction(db) as conn:
        conn.execute("INSERT OR IGNORE INTO nodes (node_id, tier, region, first_seen, "
                     "last_seen) VALUES (?, 'edge', 'eu', 'now', 'now')", (node,))
        nodes.witnessed(node, head.seq, head.hash).apply(conn)


@pytest.fixture
def pair(tmp_path: Path) -> tuple[sqlite_utils.Database, sqlite_utils.Database]:
    primary, standby = db_at(tmp_path, "a"), db_at(tmp_path, "b")
    as_role(primary, "primary")
    for _ in range(3):
        write(primary)
    as_role(standby, "standby")
    replicate(primary, standby)
    return primary, standby


def test_a_failover_after_an_unreplicated_head_is_not_a_rewrite(
        pair: tuple[sqlite_utils.Database, sqlite_utils.Database]) -> None:
    """Finding 5: the primary wrote record 4, paused before its standby had it, and the standby
    took over writing its own record 4. Only record 3, which the standby held, was told."""
    primary, standby = pair
    gate = WitnessGate(sync_standbys=1)
    replicated = due(gate, primary)
    assert replicated == chain.head(standby.conn) and replicated is not None
    assert replicated.seq == 3
    unreplicated = write(primary)  # committed; the standby never gets it
    assert due(gate, primary) is None  # what the old code told: the nodes' record 4
    with transaction(standby) as conn:  # the standby promoted: its own record 4
        role.set_role(conn, "primary", term=2, lease_until=time.time() + 60)
        leader.promotion_record(conn, "t", "registry-b", 2, "registry-a")
    assert chain.head(standby.conn) == Head(4, chain.hash_at(standby.conn, 4) or "")
    assert chain.hash_at(standby.conn, 4) != unreplicated.hash

    shown(standby, "edge-1", replicated)
    assert anchor.witnessed(standby) == (3, None)  # `audit --verify` passes
    # the word the old primary used to give: the alarm this gate keeps from firing
    shown(standby, "edge-2", unreplicated)
    seen, problem = anchor.witnessed(standby)
    assert seen == 4 and problem is not None and "the chain was rewritten" in problem


def test_a_head_is_told_once_a_standby_holds_its_change_and_not_one_change_before(
        pair: tuple[sqlite_utils.Database, sqlite_utils.Database]) -> None:
    primary, standby = pair
    gate = WitnessGate(sync_standbys=1)
    assert due(gate, primary) == Head(3, chain.hash_at(primary.conn, 3) or "")
    head = write(primary)
    at = changes.position(primary.conn)
    ack(primary, "registry-b", at - 1)  # just short of the record
    assert due(gate, primary) is None
    assert due(gate, primary) is None  # still waiting, not forgotten
    changes.apply(standby, changes.read_changes(primary.conn, at - 1, 10))
    ack(primary, "registry-b", at)  # the standby holds it
    assert due(gate, primary) == head


def test_a_held_older_head_is_told_while_a_newer_one_waits(
        pair: tuple[sqlite_utils.Database, sqlite_utils.Database]) -> None:
    primary, _ = pair
    gate = WitnessGate(sync_standbys=1)
    due(gate, primary)
    fourth = write(primary)
    assert due(gate, primary) is None
    held = changes.position(primary.conn)
    write(primary)  # a fifth, read on the next tick, not yet on the standby
    ack(primary, "registry-b", held)
    assert due(gate, primary) == fourth
    assert [c.head.seq for c in gate.waiting] == [5]


@pytest.mark.parametrize(("sync_standbys", "holders", "told"), [
    (0, 0, False),  # a group that does not wait for writes still witnesses only what one holds
    (0, 1, True),
    (1, 1, True),
    (2, 1, False),  # semi-sync waits for two: so do witnesses
    (2, 2, True),
])
def test_as_many_standbys_hold_a_told_head_as_a_write_waits_for(
        tmp_path: Path, sync_standbys: int, holders: int, told: bool) -> None:
    primary = db_at(tmp_path, "a")
    as_role(primary, "primary")
    head = write(primary)
    gate = WitnessGate(sync_standbys)
    for i in range(holders):
        ack(primary, f"registry-{i}", changes.position(primary.conn))
    assert due(gate, primary) == (head if told else None)


def test_an_ack_older_than_the_following_window_holds_nothing(tmp_path: Path) -> None:
    primary = db_at(tmp_path, "a")
    as_role(primary, "primary")
    head = write(primary)
    ack(primary, "registry-b", changes.position(primary.conn))
    gate = WitnessGate(1)
    with transaction(primary) as conn:
        conn.execute("UPDATE replicas SET acked_at = ?", (time.time() - 31,))
    assert due(gate, primary) is None
    with transaction(primary) as conn:
        conn.execute("UPDATE replicas SET acked_at = ?", (time.time() - 29,))
    assert due(gate, primary) == head


def test_a_standalone_registry_tells_its_head_at_once_and_a_standby_tells_nothing(
        tmp_path: Path) -> None:
    alone = db_at(tmp_path, "alone")
    head = write(alone)
    assert role.state(alone.conn).role == "standalone"
    assert due(WitnessGate(1), alone) == head  # no standby to lose it to: as before
    as_role(alone, "standby")
    assert due(WitnessGate(1), alone) is None


def test_heads_waiting_for_a_standby_are_bounded_and_the_newest_is_told_once_held(
        tmp_path: Path) -> None:
    primary = db_at(tmp_path, "a")
    as_role(primary, "primary")
    gate = WitnessGate(1)
    for _ in range(witness_gate.KEEP + 5):
        write(primary)
        assert due(gate, primary) is None
    assert len(gate.waiting) == witness_gate.KEEP
    assert gate.waiting[0].head.seq == 6  # the five oldest dropped
    ack(primary, "registry-b", changes.position(primary.conn))
    assert due(gate, primary) == chain.head(primary.conn)
    assert not gate.waiting


def test_heads_of_an_earlier_term_are_never_told_after_the_history_was_replaced(
        pair: tuple[sqlite_utils.Database, sqlite_utils.Database]) -> None:
    """Primary ``a`` read record 4 (never replicated) and lost the lock; ``b`` led and wrote
    its own record 4; ``a``'s database became ``b``'s (the snapshot a diverged registry
    copies) and ``a`` led again in the same process: its old record 4 must not be told."""
    primary, standby = pair
    gate = WitnessGate(1)
    due(gate, primary)
    lost = write(primary)
    assert due(gate, primary) is None  # waiting
    with transaction(standby) as conn:
        role.set_role(conn, "primary", term=3, lease_until=time.time() + 60)
        leader.promotion_record(conn, "t", "registry-a", 3, "registry-b")
    ours = chain.head(standby.conn)
    ack(standby, "registry-b", changes.position(primary.conn) + 5)  # past the lost record's
    assert due(gate, standby) == ours != lost  # the same gate, now on the replaced history
    # were the term the same, a held head the chain no longer holds is still not told
    write(standby)  # a newer head, not yet on any standby
    with transaction(standby) as conn:
        conn.execute("DELETE FROM replicas")
        changes.acked(conn, "registry-c", 1)
    gate.waiting.append(witness_gate.Candidate(lost, 1))
    assert due(gate, standby) is None


def test_rewriting_a_replicated_told_record_is_still_caught(
        pair: tuple[sqlite_utils.Database, sqlite_utils.Database], tmp_path: Path) -> None:
    primary, _ = pair
    gate = WitnessGate(1)
    told = due(gate, primary)
    assert told is not None
    shown(primary, "edge-1", told)
    assert anchor.witnessed(primary) == (3, None)
    raw = sqlite3.connect(tmp_path / "a" / "registry.sqlite3")
    raw.executescript(f"""
        DROP TRIGGER audit_no_update;
        UPDATE audit SET hash = '{"0" * 64}' WHERE seq = {told.seq};""")
    raw.close()
    seen, problem = anchor.witnessed(primary)
    assert seen == 3 and problem is not None and "the chain was rewritten" in problem
