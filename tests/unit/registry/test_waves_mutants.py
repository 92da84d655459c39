"""A wave rollout's record (``registry.releases.waves``) as an operator reads it: the row
``registry publish --waves`` writes, ``registry rollout show --json`` (``Rollout.to_json``),
the ``registry_rollout_held`` metric's rows (``newest``), who is in the wave (a node's stable
position against the stored cutoff, exclusive), the edges the gate reads, and the audited end of
a rollout a later publish, promote or rollback finishes."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from registry.fleet import nodes as node_writes
from registry.fleet.nodes import NodeBook
from registry.releases import waves
from registry.releases.catalog import Catalog
from registry.releases.plan import RolloutNode
from registry.releases.waves import WavePolicy
from registry.store import chain
from registry.store.db import connect, transaction
from tests.unit.registry.test_rollout import manifest

MODEL = "m"
POLICY = WavePolicy((0.015, 0.5, 1.0), pace=6, growth=3, bake_s=30, min_audit_rows=100)


@pytest.fixture
def catalog(tmp_path: Path) -> Catalog:
    c = Catalog(connect(tmp_path / "r.sqlite3"), "tester")
    c.create_version(manifest(seed=1))
    c.create_version(manifest(seed=2))
    c.create_version(manifest(name="other", seed=3))
    return c


def start(catalog: Catalog, model: str = MODEL, version: int = 2, previous: int | None = 1,
          policy: WavePolicy = POLICY, at: float = 1000.0) -> waves.Rollout:
    with transaction(catalog.db) as conn:
        waves.start(conn, model, version, previous, policy, at)
    r = waves.latest(catalog.db.conn, model)
    assert r is not None
    return r


def test_a_started_rollout_is_running_wave_one_with_nothing_admitted_and_its_policy(
        catalog: Catalog) -> None:
    r = start(catalog)
    assert (r.model, r.version, r.previous, r.policy) == (MODEL, 2, 1, POLICY)
    assert (r.wave, r.cutoff, r.state, r.wave_started) == (0, 0.0, "running", 1000.0)
    assert r.admitted_at == 990.0  # 6 a minute: one node's worth (10 s) before, the first at once
    assert (r.installed_at, r.reason, r.figures) == (None, None, {})
    assert r.created_at == r.updated_at and r.created_at.startswith("20")
    assert waves.latest(catalog.db.conn, "other") is None
    assert [x.id for x in waves.unfinished(catalog.db.conn)] == [r.id]


def test_the_first_node_of_each_wave_goes_at_once_one_nodes_worth_before_its_start() -> None:
    assert waves.first_admit(POLICY, 0, 1000.0) == 990.0  # 6 a minute
    assert waves.first_admit(POLICY, 1, 1000.0) == pytest.approx(1000.0 - 60 / 18)
    assert waves.first_admit(WavePolicy((1.0,), pace=0.5), 0, 1000.0) == 880.0  # one in 2 min
    assert waves.first_admit(WavePolicy((1.0,)), 0, 1000.0) == 1000.0  # no pace: all at once


def test_latest_is_the_models_newest_rollout_and_unfinished_lists_the_open_ones_by_model(
        catalog: Catalog) -> None:
    first = start(catalog)
    with transaction(catalog.db) as conn:
        waves.update(conn, first.id, state="halted", reason="drift: 2 of 3")
    second = start(catalog, at=2000.0)
    other = start(catalog, model="other", version=1, previous=None)
    with transaction(catalog.db) as conn:
        waves.update(conn, second.id, state="aborted")
    latest = waves.latest(catalog.db.conn, MODEL)
    assert latest is not None and (latest.id, latest.state) == (second.id, "aborted")
    assert [r.id for r in waves.unfinished(catalog.db.conn)] == [first.id, other.id]
    assert [r.id for r in waves.unfinished(catalog.db.conn, MODEL)] == [first.id]
    assert [r.id for r in waves.unfinished(catalog.db.conn, "other")] == [other.id]
    r = waves.latest(catalog.db.conn, MODEL)
    assert r is not None and r.updated_at >= r.created_at


def test_update_writes_the_named_columns_of_that_rollout_only(catalog: Catalog) -> None:
    a, b = start(catalog), start(catalog, model="other", version=1, previous=None)
    with transaction(catalog.db) as conn:
        waves.update(conn, a.id, state="held", reason="agreement not measured",
                     figures=json.dumps({"held": "not-measured"}), cutoff=0.25)
    held = waves.latest(catalog.db.conn, MODEL)
    assert held is not None
    assert (held.state, held.reason, held.figures, held.cutoff) == (
        "held", "agreement not measured", {"held": "not-measured"}, 0.25)
    untouched = waves.latest(catalog.db.conn, "other")
    assert untouched == b


def test_rollout_show_json_of_a_held_rollout(catalog: Catalog) -> None:
    r = start(catalog)
    figures = {"held": "undecided", "wave 1": {"liars": 1}}
    with transaction(catalog.db) as conn:
        waves.update(conn, r.id, state="held", wave=1, cutoff=0.5, reason="agreement undecided",
                     figures=json.dumps(figures))
    held = waves.latest(catalog.db.conn, MODEL)
    assert held is not None
    assert held.to_json() == {
        "id": r.id, "model": MODEL, "version": 2, "previous": 1, "state": "held", "wave": 2,
        "waves": ["1.5%", "50%", "100%"], "share": 0.5, "cutoff": 0.5,
        "reason": "agreement undecided", "figures": figures, "held": "undecided",
        "policy": msgspec.to_builtins(POLICY), "created_at": r.created_at,
        "updated_at": held.updated_at}
    assert json.loads(json.dumps(held.to_json()))["policy"]["waves"] == [0.015, 0.5, 1.0]


def test_rollout_show_json_says_held_only_while_the_rollout_is_held(catalog: Catalog) -> None:
    r = start(catalog)
    with transaction(catalog.db) as conn:  # a stale "held" in its figures, running again
        waves.update(conn, r.id, figures=json.dumps({"held": "not-measured"}))
    running = waves.latest(catalog.db.conn, MODEL)
    assert running is not None
    assert running.to_json()["held"] is None and running.to_json()["wave"] == 1


def test_the_held_metric_rows_are_each_models_newest_rollout_with_a_known_reason(
        catalog: Catalog) -> None:
    old = start(catalog)
    with transaction(catalog.db) as conn:
        waves.update(conn, old.id, state="held", figures=json.dumps({"held": "undecided"}))
    new = start(catalog, at=2000.0)
    with transaction(catalog.db) as conn:
        waves.update(conn, new.id, state="held", wave=2,
                     figures=json.dumps({"held": "not-measured"}))
    other = start(catalog, model="other", version=1, previous=None)
    with transaction(catalog.db) as conn:  # a reason no metric label may carry
        waves.update(conn, other.id, state="held", figures=json.dumps({"held": "x\ny"}))
    assert waves.newest(catalog.db.conn) == [(MODEL, "held", 3, "not-measured"),
                                             ("other", "held", 1, None)]
    with transaction(catalog.db) as conn:  # halted: its old hold is no reason any more
        waves.update(conn, new.id, state="halted")
    assert waves.newest(catalog.db.conn)[0] == (MODEL, "halted", 3, None)


def test_a_node_at_the_cutoff_is_outside_the_wave_as_the_gate_counts_it() -> None:
    at = waves.position(MODEL, "edge-07")
    assert not waves.admitted(MODEL, "edge-07", at)
    assert waves.admitted(MODEL, "edge-07", at + 1e-12)
    assert waves.admitted(MODEL, "edge-07", 1.0) and not waves.admitted(MODEL, "edge-07", 0.0)


def test_a_nodes_position_is_the_first_8_bytes_of_the_hash_of_model_and_node() -> None:
    """Stable across registries and releases: a fixed point of the ranking, documented so a
    fleet's first wave can be predicted."""
    import hashlib

    digest = hashlib.sha256(b"m\x00edge-07").digest()
    assert waves.position(MODEL, "edge-07") == int.from_bytes(digest[:8], "big") / 2.0 ** 64
    assert waves.position(MODEL, "edge-07") != waves.position(MODEL, "edge-7")
    assert waves.position("m1", "edge") != waves.position("m", "1edge")  # separated


def test_the_gate_reads_every_edge_by_position_with_its_state_for_the_model(
        catalog: Catalog) -> None:
    book = NodeBook(catalog.db)
    nodes = [RolloutNode(f"edge-{i}", "edge", "eu") for i in range(4)]
    for n in [*nodes, RolloutNode("center-1", "center", "eu")]:
        book.write([node_writes.hello(n, "peer", [])])
    book.write([node_writes.ack(nodes[0], MODEL, 2, "ACTIVE", ""),
                node_writes.quality(nodes[0].node_id, MODEL, {"version": 2, "requests": 5}),
                node_writes.ack(nodes[1], MODEL, 2, "FAILED", "bad artifact"),
                node_writes.ack(nodes[2], "other", 1, "ACTIVE", "")])
    seen = waves.edges(catalog.db.conn, MODEL)
    assert [p for p, _ in seen] == sorted(waves.position(MODEL, n.node_id) for n in nodes)
    assert [s.node_id for _, s in seen] == sorted(
        (n.node_id for n in nodes), key=lambda i: waves.position(MODEL, i))  # no center
    by = {s.node_id: s for _, s in seen}
    assert (by["edge-0"].version, by["edge-0"].state, by["edge-0"].report) == (
        2, "ACTIVE", {"version": 2, "requests": 5})
    assert by["edge-0"].installed(2) and by["edge-1"].failed(2)
    assert (by["edge-1"].reason, by["edge-1"].report) == ("version 2: bad artifact", None)
    assert (by["edge-2"].version, by["edge-2"].state, by["edge-2"].reason) == (None, "", "")
    assert all(s.connected for s in by.values())


def test_a_later_release_ends_the_rollout_audited_with_its_wave_and_why(
        catalog: Catalog) -> None:
    r = start(catalog)
    other = start(catalog, model="other", version=1, previous=None)
    with transaction(catalog.db) as conn:
        waves.update(conn, r.id, wave=1)
        waves.end(conn, MODEL, "ops@host", "superseded", "version 3 published by ops@host")
        waves.end(conn, MODEL, "ops@host", "superseded", "again")  # nothing left to end
    ended = waves.latest(catalog.db.conn, MODEL)
    assert ended is not None
    assert (ended.state, ended.reason) == ("superseded", "version 3 published by ops@host")
    (record,) = [x for x in chain.records(catalog.db) if x.action.startswith("rollout-")]
    assert (record.action, record.actor, record.model, record.version) == (
        "rollout-superseded", "ops@host", MODEL, 2)
    assert json.loads(record.payload) == {"wave": 2, "reason": "version 3 published by ops@host"}
    assert waves.unfinished(catalog.db.conn, MODEL) == []
    assert waves.unfinished(catalog.db.conn) == [other]  # another model's rollout goes on
