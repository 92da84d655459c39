"""Wave rollouts at the database: nodes admitted by a stable hash at a pace, gates between
waves that halt a worse release and bring its nodes back, a good one going all the way to
production unattended, a person's pause, resume and abort, all audited."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import pytest

from registry.errors import NotFound, NotPrimary, RegistryError
from registry.fleet import nodes as node_writes
from registry.fleet.nodes import NodeBook
from registry.ha import changes
from registry.releases import evidence, retire, steering, waves
from registry.releases.catalog import Catalog
from registry.releases.plan import RolloutNode
from registry.releases.waves import WavePolicy
from registry.store import chain, role
from registry.store.db import connect, transaction
from registry.trust.anchor import audited
from tests.unit.registry.test_rollout import manifest

MODEL = "m"
EDGES = [RolloutNode(f"edge-{i:02d}", "edge", "eu") for i in range(20)]
CENTER = RolloutNode("center-1", "center", "eu")
FAST = WavePolicy((0.05, 0.25, 1.0), bake_s=10, install_timeout_s=60, min_audit_rows=100)


@pytest.fixture
def catalog(tmp_path: Path) -> Catalog:
    return Catalog(connect(tmp_path / "r.sqlite3"), "tester")


def fleet(catalog: Catalog, nodes: list[RolloutNode] = EDGES) -> NodeBook:
    book = NodeBook(catalog.db)
    for node in [*nodes, CENTER]:
        book.write([node_writes.hello(node, "peer", [])])
    return book


def tick(catalog: Catalog, at: float) -> list[str]:
    with audited(catalog.db, None) as conn:
        return steering.tick(conn, at, "registry:waves")


def running(catalog: Catalog, node: RolloutNode) -> int | None:
    return next((t.version for t in catalog.desired(node) if t.model == MODEL), None)


def on_new(catalog: Catalog, version: int) -> list[str]:
    return [n.node_id for n in EDGES if running(catalog, n) == version]


def settle(catalog: Catalog, book: NodeBook, version: int, agreement: float = 0.9,
           previous_agreement: float = 0.9, failed: set[str] = frozenset(),  # type: ignore[assignment]
           rows: int = 300, p99: float = 20.0, drift: bool = False) -> None:
    """Every edge acks what it is desired to run and reports on it, like a node would."""
    for node in EDGES:
        want = running(catalog, node)
        if want is None:
            continue
        new = want == version
        if node.node_id in failed and new:
            book.write([node_writes.ack(node, MODEL, want, "FAILED", "bad artifact")])
            continue
        book.write([node_writes.ack(node, MODEL, want, "ACTIVE", ""),
                    node_writes.quality(node.node_id, MODEL, report(
                        want, agreement if new else previous_agreement, rows, p99,
                        drift and new))])


def report(version: int, agreement: float, rows: int, p99: float = 20.0,
           drift: bool = False) -> dict[str, Any]:
    return {"model": MODEL, "version": version, "requests": 100, "audit_rows": rows,
            "audit_agreement": agreement, "p99_ms": p99, "drift": drift,
            "confidence_drift": False}


def actions(catalog: Catalog) -> list[str]:
    return [r.action for r in chain.records(catalog.db)]


def publish_waves(catalog: Catalog, policy: WavePolicy = FAST) -> int:
    return catalog.create_version(manifest(seed=2), rollout=policy)


def test_wave_shares_parse_and_a_bad_policy_is_refused_before_anything_is_written() -> None:
    assert waves.parse_waves("1%,10%,50%,100%") == (0.01, 0.1, 0.5, 1.0)
    assert waves.parse_waves("0.5%, 100%") == (0.005, 1.0)
    for bad in ("10,100", "1%,x%", "", "100%;"):
        with pytest.raises(RegistryError, match="invalid wave"):
            waves.parse_waves(bad)
    for shares, match in (((0.5, 0.1, 1.0), "must grow"), ((0.1, 0.5), "last wave"),
                          ((0.0, 1.0), "must grow"), ((), "1 to 20")):
        with pytest.raises(RegistryError, match=match):
            WavePolicy(shares).check()
    with pytest.raises(RegistryError, match="growth"):
        WavePolicy((1.0,), growth=0.5).check()


def test_positions_are_stable_per_model_and_spread(catalog: Catalog) -> None:
    assert waves.position(MODEL, "edge-01") == waves.position(MODEL, "edge-01")
    assert waves.position(MODEL, "edge-01") != waves.position("other", "edge-01")
    spread = sorted(waves.position(MODEL, f"n{i}") for i in range(1000))
    assert 0 <= spread[0] < 0.01 and 0.99 < spread[-1] < 1
    assert 0.45 < spread[500] < 0.55


def test_a_good_release_passes_every_gate_unattended_and_becomes_production(
        catalog: Catalog) -> None:
    book = fleet(catalog)
    catalog.create_version(manifest(seed=1))
    new = publish_waves(catalog)
    assert catalog.alias(MODEL, "production") == 1
    assert on_new(catalog, new) == []  # nothing admitted before the registry's first step
    at = time.time()
    sizes = []
    for _ in range(40):
        at += 6
        tick(catalog, at)
        sizes.append(len(on_new(catalog, new)))
        assert running(catalog, CENTER) == (1 if catalog.alias(MODEL, "production") == 1
                                            else new)  # centers move last
        settle(catalog, book, new)
        if catalog.alias(MODEL, "production") == new:
            break
    assert catalog.alias(MODEL, "production") == new
    # 5%, 25%, 100% of 20; 5% is one node, raised to three: the fewest whose median holds
    # against one lying node (and keeps a quorum of two when it falls silent)
    assert [n for n in sorted(set(sizes)) if n] == [3, 5, 20]
    assert running(catalog, CENTER) == new
    r = waves.latest(catalog.db.conn, MODEL)
    assert r is not None and r.state == "done"
    assert actions(catalog).count("rollout-gate") == 3
    assert [a for a in actions(catalog) if a != "ack"][-2:] == ["rollout-gate", "promote"]
    assert r.figures["wave 1"]["new"]["agreement"] == pytest.approx(0.9)


def test_a_worse_release_halts_at_the_first_gate_and_its_nodes_go_back(catalog: Catalog) -> None:
    book = fleet(catalog)
    catalog.create_version(manifest(seed=1))
    # 15% of 20: three nodes, the least a side's agreement is judged on (min_audit_nodes)
    new = publish_waves(catalog, WavePolicy((0.15, 0.5, 1.0), bake_s=10, min_audit_rows=100))
    at = time.time()
    for _ in range(10):
        at += 6
        tick(catalog, at)
        settle(catalog, book, new, agreement=0.55, previous_agreement=0.9)
    r = waves.latest(catalog.db.conn, MODEL)
    assert r is not None and r.state == "halted" and r.wave == 0
    assert "live audit agreement 0.550" in (r.reason or "")
    assert on_new(catalog, new) == []  # every node desired back on version 1
    assert catalog.alias(MODEL, "production") == 1
    (halt,) = [x for x in chain.records(catalog.db) if x.action == "rollout-halt"]
    payload = json.loads(halt.payload)
    assert payload["back_to"] == 1 and payload["wave"] == 1
    assert payload["figures"]["new"]["agreement"] == pytest.approx(0.55)
    assert payload["figures"]["previous"]["agreement"] == pytest.approx(0.9)
    assert payload["figures"]["installed"] == 3  # 15% of 20
    for _ in range(5):  # halted stays halted: nobody is admitted again by the registry
        at += 60
        tick(catalog, at)
    assert on_new(catalog, new) == []


@pytest.mark.parametrize(("what", "kwargs", "match"), [
    ("install", {"failed": "all"}, "installs: "),
    ("drift", {"drift": True}, "drift: "),
    ("latency", {"p99": 100.0}, "latency: "),
])
def test_each_gate_halts_on_its_own(catalog: Catalog, what: str, kwargs: dict[str, Any],
                                     match: str) -> None:
    book = fleet(catalog)
    catalog.create_version(manifest(seed=1))
    new = publish_waves(catalog, WavePolicy((0.25, 1.0), bake_s=5, min_audit_rows=100))
    at = time.time()
    for _ in range(8):
        at += 6
        tick(catalog, at)
        wave = set(on_new(catalog, new))
        args = dict(kwargs)
        if args.get("failed") == "all":
            args["failed"] = wave
        if "p99" in args:  # the wave's p99 is 5x the others'
            settle(catalog, book, new, failed=set())
            for node in EDGES:
                if node.node_id in wave:
                    book.write([node_writes.quality(node.node_id, MODEL,
                                                    report(new, 0.9, 300, p99=args["p99"]))])
            continue
        settle(catalog, book, new, **args)
    r = waves.latest(catalog.db.conn, MODEL)
    assert r is not None and r.state == "halted", what
    assert (r.reason or "").startswith(match)


def test_without_audit_rows_the_gate_waits_another_bake_then_holds_until_a_person_decides(
        catalog: Catalog) -> None:
    book = fleet(catalog)
    catalog.create_version(manifest(seed=1))
    new = publish_waves(catalog, WavePolicy((0.25, 1.0), bake_s=30, min_audit_rows=100))
    at = time.time()
    at += 1
    tick(catalog, at)  # admitted
    settle(catalog, book, new, rows=0)
    at += 1
    tick(catalog, at)  # installed: baking
    at += 31
    tick(catalog, at)  # baked, but agreement not measured: it waits
    r = waves.latest(catalog.db.conn, MODEL)
    assert r is not None and r.state == "baking"
    for _ in range(3):  # held, and it stays held: "could not measure" is not "passed"
        at += 30
        tick(catalog, at)
        r = waves.latest(catalog.db.conn, MODEL)
        assert r is not None and (r.state, r.wave) == ("held", 0)
    assert r.to_json()["held"] == "not-measured"
    assert (r.reason or "").startswith("agreement not measured (0 and 0 audited rows")
    assert len(on_new(catalog, new)) == 5  # the wave keeps it, nobody else gets it
    assert catalog.alias(MODEL, "production") == 1
    (hold,) = [x for x in chain.records(catalog.db) if x.action == "rollout-hold"]
    assert json.loads(hold.payload)["hold"] == "not-measured"
    assert waves.newest(catalog.db.conn) == [(MODEL, "held", 1, "not-measured")]
    with pytest.raises(RegistryError, match="passes its gate: give --reason"), \
            audited(catalog.db, None) as conn:
        steering.steer(conn, MODEL, "resume", "ops@host", at)
    with pytest.raises(RegistryError, match="printable"), audited(catalog.db, None) as conn:
        steering.steer(conn, MODEL, "resume", "ops@host", at, "ok\x1b[2J")
    with audited(catalog.db, None) as conn:
        r = steering.steer(conn, MODEL, "resume", "ops@host", at, "idle fleet, checked by hand")
    assert (r.state, r.wave) == ("running", 1)  # its gate passed by a person
    resume = [x for x in chain.records(catalog.db) if x.action == "rollout-resume"][-1]
    payload = json.loads(resume.payload)
    assert resume.actor == "ops@host" and payload["reason"] == "idle fleet, checked by hand"
    assert payload["was"] == "held" and payload["hold"] == "not-measured"


def test_a_held_gate_is_judged_again_and_halts_by_itself_once_measured(
        catalog: Catalog) -> None:
    book = fleet(catalog)
    catalog.create_version(manifest(seed=1))
    new = publish_waves(catalog, WavePolicy((0.25, 1.0), bake_s=10, min_audit_rows=100))
    at = time.time()
    for _ in range(6):
        at += 6
        tick(catalog, at)
        settle(catalog, book, new, rows=0)
    r = waves.latest(catalog.db.conn, MODEL)
    assert r is not None and r.state == "held"
    settle(catalog, book, new, agreement=0.5, previous_agreement=0.9)  # evidence arrives
    tick(catalog, at + 1)
    r = waves.latest(catalog.db.conn, MODEL)
    assert r is not None
    assert r.state == "halted", r.reason
    assert "live audit agreement 0.500" in (r.reason or "") and "held" not in r.figures
    assert on_new(catalog, new) == []


def test_the_pace_admits_nodes_a_minute_growing_per_wave(catalog: Catalog) -> None:
    book = fleet(catalog)
    catalog.create_version(manifest(seed=1))
    new = publish_waves(catalog, WavePolicy((0.5, 1.0), pace=6, growth=2, bake_s=0,
                                        min_audit_rows=1))
    at = time.time()
    tick(catalog, at)
    assert len(on_new(catalog, new)) == 1  # the first at once
    tick(catalog, at + 9)
    assert len(on_new(catalog, new)) == 1  # 6 a minute: one every 10 s
    tick(catalog, at + 31)
    assert len(on_new(catalog, new)) == 4
    tick(catalog, at + 200)
    assert len(on_new(catalog, new)) == 10
    settle(catalog, book, new)
    tick(catalog, at + 201)  # installed
    tick(catalog, at + 202)  # gate passes, wave 2 at 12 a minute
    tick(catalog, at + 202)
    assert len(on_new(catalog, new)) == 11
    tick(catalog, at + 202 + 30)
    assert len(on_new(catalog, new)) == 17


def test_a_node_joining_later_gets_what_its_position_says_never_more(catalog: Catalog) -> None:
    book = fleet(catalog)
    catalog.create_version(manifest(seed=1))
    new = publish_waves(catalog, WavePolicy((0.25, 1.0), bake_s=1000))
    at = time.time()
    tick(catalog, at)
    r = waves.latest(catalog.db.conn, MODEL)
    assert r is not None
    late = [RolloutNode(f"late-{i}", "edge", "us") for i in range(200)]
    inside = [n for n in late if waves.position(MODEL, n.node_id) < r.cutoff]
    outside = [n for n in late if waves.position(MODEL, n.node_id) >= r.cutoff]
    assert inside and outside
    assert all(running(catalog, n) == new for n in inside)  # it rejoins its wave
    assert all(running(catalog, n) == 1 for n in outside)  # never ahead of the rollout
    with audited(catalog.db, None) as conn:
        steering.steer(conn, MODEL, "pause", "ops", at)
    for n in late[:50]:
        book.write([node_writes.hello(n, "peer", [])])
    tick(catalog, at + 100)
    r2 = waves.latest(catalog.db.conn, MODEL)
    assert r2 is not None and r2.cutoff == r.cutoff  # paused: nothing admitted


def test_pause_resume_abort_by_hand_are_audited(catalog: Catalog) -> None:
    fleet(catalog)
    catalog.create_version(manifest(seed=1))
    new = publish_waves(catalog)
    at = time.time()
    tick(catalog, at)

    def steer(action: str) -> waves.Rollout:
        with audited(catalog.db, None) as conn:
            return steering.steer(conn, MODEL, action, "ops@host", at)

    assert steer("pause").state == "paused"
    assert len(on_new(catalog, new)) == 3  # paused: the admitted keep it
    with pytest.raises(RegistryError, match="paused"):
        steer("pause")
    assert steer("resume").state == "running"
    assert steer("abort").state == "aborted"
    assert on_new(catalog, new) == []
    with pytest.raises(NotFound, match="no unfinished"):
        steer("resume")
    records = [r for r in chain.records(catalog.db) if r.action.startswith("rollout-")]
    assert [(r.action, r.actor) for r in records] == [
        ("rollout-pause", "ops@host"), ("rollout-resume", "ops@host"),
        ("rollout-abort", "ops@host")]


def test_promote_completes_and_a_new_publish_supersedes_a_rollout(catalog: Catalog) -> None:
    fleet(catalog)
    catalog.create_version(manifest(seed=1))
    new = publish_waves(catalog)
    assert catalog.promote(MODEL) == new  # no canary: the rolling version
    r = waves.latest(catalog.db.conn, MODEL)
    assert r is not None and r.state == "done"
    newer = publish_waves(catalog)
    catalog.create_version(manifest(seed=3))  # an ordinary publish
    r = waves.latest(catalog.db.conn, MODEL)
    assert r is not None and (r.version, r.state) == (newer, "superseded")
    assert "rollout-superseded" in actions(catalog)
    with pytest.raises(RegistryError, match="canary or in waves"):
        catalog.create_version(manifest(seed=4), canary=["edge-01"], rollout=FAST)


def test_a_first_release_in_waves_reaches_the_centers_at_once(catalog: Catalog) -> None:
    fleet(catalog)
    new = publish_waves(catalog)
    tick(catalog, time.time())
    assert running(catalog, CENTER) == new
    assert len(on_new(catalog, new)) == 3
    assert sum(running(catalog, n) is None for n in EDGES) == 17


def test_a_rollout_is_replicated_and_a_standby_cannot_steer_it(catalog: Catalog) -> None:
    fleet(catalog)
    catalog.create_version(manifest(seed=1))
    before = changes.position(catalog.db.conn)
    publish_waves(catalog)
    tick(catalog, time.time())
    found = changes.read_changes(catalog.db.conn, before, 1000)
    assert {"waves", "audit", "versions"} <= {c.table for c in found}
    with transaction(catalog.db) as conn:
        role.set_role(conn, "standby", term=2, registry_id="r", leader="p:1",
                             lease_until=0)
    with pytest.raises(NotPrimary, match="standby"), audited(catalog.db, None) as conn:
        steering.steer(conn, MODEL, "pause", "ops", time.time())


# -- one node's word: bounded (issue 46) -------------------------------------------------------

def first_gate(catalog: Catalog, policy: WavePolicy,
               says: Callable[[RolloutNode, bool], dict[str, Any] | None],
               silent: Collection[str] = ()) -> waves.Rollout:
    """Publish version 2 in waves over EDGES on version 1 and step to its first gate's verdict.
    ``says(node, in_wave)``: the node's report of what it runs (None: none); a node in
    ``silent`` never answers the install."""
    book = fleet(catalog)
    catalog.create_version(manifest(seed=1))
    new = publish_waves(catalog, policy)
    at = time.time()
    for _ in range(20):
        at += max(policy.bake_s, 1) + 1
        tick(catalog, at)
        r = waves.latest(catalog.db.conn, MODEL)
        assert r is not None
        if r.state not in ("running", "baking") or r.wave > 0:
            return r
        for node in EDGES:
            want = running(catalog, node)
            if want is None or (want == new and node.node_id in silent):
                continue
            book.write([node_writes.ack(node, MODEL, want, "ACTIVE", "")])
            if (said := says(node, want == new)) is not None:
                book.write([node_writes.quality(node.node_id, MODEL,
                                                {**said, "version": want})])
    raise AssertionError("no verdict")


def wave_of(policy: WavePolicy) -> list[str]:
    """The node ids of the first wave of ``policy`` over EDGES, by position."""
    ranked = sorted(EDGES, key=lambda n: waves.position(MODEL, n.node_id))
    return [n.node_id for n in ranked[:steering.target(policy.waves[0], len(EDGES))]]


def fresh(tmp_path: Path, name: object) -> Catalog:
    return Catalog(connect(tmp_path / f"{name}.sqlite3"), "tester")


THREE = WavePolicy((0.15, 1.0), bake_s=10, install_timeout_s=60, min_audit_rows=100)  # 3 of 20
LIE = {"audit_rows": 10**12, "audit_agreement": 1.0}


def honest(agreement: float, rows: int = 300) -> dict[str, Any]:
    return report(0, agreement, rows)


def test_a_liar_in_the_wave_claiming_a_trillion_perfect_rows_cannot_pass_a_flipped_release(
        catalog: Catalog) -> None:
    liar = wave_of(THREE)[0]

    def says(node: RolloutNode, new: bool) -> dict[str, Any]:
        if node.node_id == liar:
            return {**honest(0.9), **LIE}
        return honest(0.3 if new else 0.9)  # the flipped release agrees with nobody

    r = first_gate(catalog, THREE, says)
    assert r.state == "halted" and r.wave == 0, r.figures  # passed both gates before
    new = r.figures["wave 1"]["new"]
    assert new["agreement"] == pytest.approx(0.3)  # the median: the liar's 1.0 is not it
    (lie,) = [w for w in new["weights"] if w["node"] == liar]
    assert lie["claimed"] == 10**12
    assert lie["rows"] == 100 * evidence.MAX_REQUEST_ROWS  # what 100 requests could carry
    assert lie["counted"] == 300 and lie["weight"] == pytest.approx(1 / 3, abs=1e-3)
    assert new["audit_rows"] == 900 and new["audit_nodes"] == 3


def test_a_liar_outside_the_wave_claiming_the_old_version_perfect_cannot_halt_a_good_one(
        catalog: Catalog) -> None:
    inside = set(wave_of(THREE))
    outside = [n.node_id for n in EDGES if n.node_id not in inside]
    liar, reporting = outside[0], set(outside[:3])  # the least quorum: the liar and two others

    def says(node: RolloutNode, new: bool) -> dict[str, Any] | None:
        if node.node_id == liar:
            return {**honest(0.9), **LIE}
        return honest(0.9) if new or node.node_id in reporting else None

    r = first_gate(catalog, THREE, says)
    assert r.state == "running" and r.wave == 1, r.reason  # halted on "down 0.100" before
    gate = r.figures["wave 1"]
    assert gate["previous"]["agreement"] == pytest.approx(0.9)
    assert gate["previous"]["audit_nodes"] == 3 and gate["previous"]["audit_rows"] == 900
    assert gate["agreement_drop"]["drop"] == pytest.approx(0.0)


def test_a_nodes_audit_rows_are_bounded_by_its_requests_and_an_absolute_cap() -> None:
    per = evidence.MAX_REQUEST_ROWS
    for requests, claimed, counted in ((100, 100 * per, 100 * per),  # just inside
                                       (100, 100 * per + 1, 100 * per),  # just outside
                                       (10**9, evidence.MAX_AUDIT_ROWS,
                                        evidence.MAX_AUDIT_ROWS),
                                       (10**9, evidence.MAX_AUDIT_ROWS + 1,
                                        evidence.MAX_AUDIT_ROWS),
                                       (0, 500, None)):  # answered nothing: audited nothing
        audit = evidence.audit_of("e", {"requests": requests, "audit_rows": claimed,
                                             "audit_agreement": 0.9})
        assert (audit.rows if audit else None) == counted, (requests, claimed)
    for bad in (float("nan"), -0.1, 1.1, "1.0"):
        assert evidence.audit_of("e", {"requests": 1, "audit_rows": 10,
                                            "audit_agreement": bad}) is None


def side(*audits: tuple[float, int]) -> evidence.Side:
    s = evidence.Side()
    for i, (agreement, rows) in enumerate(audits):
        s.add(f"n{i}", {"requests": 10**6, "audit_rows": rows, "audit_agreement": agreement})
    return s


def test_one_node_moves_a_sides_agreement_no_further_than_the_others_range() -> None:
    for lie in (0.0, 1.0):
        f = side((0.30, 300), (0.32, 300), (lie, 10**6)).figures(3, 100, 0)
        assert f["agreement"] == (0.3 if lie == 0.0 else 0.32)
        assert [w["counted"] for w in f["weights"]] == [300, 300, 300]  # at the median node's
    two = side((0.3, 300), (1.0, 10**6)).figures(1, 100, 0)
    assert two["agreement"] == pytest.approx(0.65)  # two nodes: their mean (why 3 is default)
    assert [w["weight"] for w in two["weights"]] == [0.5, 0.5]  # the lower median: 300


def test_a_sides_quorum_is_scaled_to_its_nodes_and_one_below_it_holds(tmp_path: Path) -> None:
    """A wave of 3 of 20 edges: its quorum is 2 (a majority of 3), the others' is 3
    (min_audit_nodes, fewer than a majority of 17). At each quorum a flipped release halts;
    one node short of either, the gate holds: it never passes."""
    wave = set(wave_of(THREE))
    outside = [n.node_id for n in EDGES if n.node_id not in wave]
    for name, inside_reporting, outside_reporting, state in (
            ("both at quorum", 2, 3, "halted"), ("wave one below", 1, 17, "held"),
            ("others one below", 3, 2, "held")):
        audited_in = set(sorted(wave)[:inside_reporting])
        audited_out = set(outside[:outside_reporting])

        def says(node: RolloutNode, new: bool, audited_in: set[str] = audited_in,
                 audited_out: set[str] = audited_out) -> dict[str, Any]:
            on = node.node_id in (audited_in if new else audited_out)
            return honest(0.3 if new else 0.9, 300 if on else 0)

        r = first_gate(fresh(tmp_path, name.replace(" ", "-")), THREE, says)
        assert r.state == state, (name, r.figures)
        gate = r.figures["wave 1"]
        assert (gate["new"]["quorum"], gate["previous"]["quorum"]) == (2, 3)
        if state == "held":
            assert r.wave == 0 and "baseline" not in r.figures
            assert r.figures["held"] == "not-measured"
            assert "rows from 2 and 3 nodes needed" in (r.reason or ""), r.reason


def test_agreement_needs_min_audit_rows_not_just_some(tmp_path: Path) -> None:
    """(Mutation W2: judging on any audited rows above zero.) Three wave nodes with 33 audited
    rows each count 99: judged at min_audit_rows 99, held at 100."""
    for least, state in ((99, "halted"), (100, "held")):
        policy = WavePolicy((0.15, 1.0), bake_s=10, min_audit_rows=least)
        r = first_gate(fresh(tmp_path, least),
                       policy, lambda node, new: honest(0.3, 33) if new else honest(0.9))
        assert r.state == state, r.figures
        if state == "held":
            assert r.wave == 0  # not passed: agreement not measured
            assert "not measured (99 and " in r.figures["wave 1"]["agreement_drop"]


def test_connected_wave_nodes_that_never_answer_the_install_count_as_failed(
        tmp_path: Path) -> None:
    """(Mutation W3: counting them as successes.) A wave of 5 with max_failures 20%: one
    silent node passes the gate, two halt it."""
    policy = WavePolicy((0.25, 1.0), bake_s=5, install_timeout_s=30, min_audit_rows=100,
                    max_failures=0.2)
    for count, halted in ((1, False), (2, True)):
        silent = wave_of(policy)[:count]
        r = first_gate(fresh(tmp_path, count),
                       policy, lambda node, new: honest(0.9), silent=silent)
        assert (r.state == "halted") is halted, (count, r.reason)
        assert r.figures["wave 1"]["failed"] == count
        if halted:
            assert (r.reason or "").startswith("installs: 2 of 5 connected wave nodes failed, "
                                               "refused or did not answer")


def test_a_two_edge_fleet_rolls_out_judging_each_nodes_word(catalog: Catalog) -> None:
    """In a fleet of two no gate can tell a stolen node's word from the truth: it tolerates no
    liar, and each side's quorum is its one node (a majority of one)."""
    two = EDGES[:2]
    book = fleet(catalog, two)
    catalog.create_version(manifest(seed=1))
    new = publish_waves(catalog, WavePolicy((0.5, 1.0), bake_s=10, min_audit_rows=100))
    at = time.time()
    for _ in range(20):
        at += 6
        tick(catalog, at)
        for node in two:
            if (want := running(catalog, node)) is not None:
                book.write([node_writes.ack(node, MODEL, want, "ACTIVE", ""),
                            node_writes.quality(node.node_id, MODEL, report(want, 0.9, 300))])
    r = waves.latest(catalog.db.conn, MODEL)
    assert r is not None and r.state == "done"
    assert catalog.alias(MODEL, "production") == new
    first = r.figures["wave 1"]
    assert (first["liars"], first["new"]["quorum"], first["previous"]["quorum"]) == (0, 1, 1)
    assert first["agreement_drop"]["drop"] == pytest.approx(0.0)
    assert r.figures["wave 2"]["new"]["audit_nodes"] == 2


def test_a_held_last_wave_resumed_with_a_reason_makes_production_and_an_abort_keeps_it(
        tmp_path: Path) -> None:
    for action, reason in (("resume", "checked the edges by hand"), ("abort", "not today")):
        catalog = fresh(tmp_path, action)
        book = fleet(catalog)
        catalog.create_version(manifest(seed=1))
        new = publish_waves(catalog, WavePolicy((1.0,), bake_s=10, min_audit_rows=100))
        at = time.time()
        for _ in range(8):
            at += 6
            tick(catalog, at)
            settle(catalog, book, new, rows=0)
        r = waves.latest(catalog.db.conn, MODEL)
        assert r is not None and r.state == "held"
        assert len(on_new(catalog, new)) == 20 and running(catalog, CENTER) == 1
        with audited(catalog.db, None) as conn:
            r = steering.steer(conn, MODEL, action, "ops@host", at, f"  {reason} ")
        records = [x for x in chain.records(catalog.db) if x.actor == "ops@host"]
        assert [x.action for x in records] == {"resume": ["rollout-resume", "promote"],
                                               "abort": ["rollout-abort"]}[action]
        assert json.loads(records[0].payload)["reason"] == reason  # stripped
        if action == "resume":  # the person passed the last gate: production moves, by them
            assert r.state == "done" and catalog.alias(MODEL, "production") == new
            assert running(catalog, CENTER) == new
        else:
            assert r.state == "aborted" and r.reason == f"aborted by ops@host: {reason}"
            assert catalog.alias(MODEL, "production") == 1 and on_new(catalog, new) == []


def test_a_persons_reason_is_printable_text_up_to_500_characters() -> None:
    assert steering.check_reason(None) is None
    assert steering.check_reason("x" * 500) == "x" * 500
    for bad, said in (("x" * 501, "at most 500"), ("   ", "empty"), ("a\nb", "printable"),
                      ("\u202eevil", "printable")):
        with pytest.raises(RegistryError, match=said):
            steering.check_reason(bad)


def test_a_registry_from_before_held_keeps_its_rollouts_and_captures_their_changes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Migration 12 rebuilds ``waves`` to allow ``held``: an unfinished rollout survives it,
    and its replication capture still copies each change."""
    from registry.store import db as store_db
    from registry.store.migrations import MIGRATIONS

    before = [m for m in MIGRATIONS if m[0] < 12]
    monkeypatch.setattr(store_db, "MIGRATIONS", before)
    old = Catalog(connect(tmp_path / "r.sqlite3"), "tester")
    with monkeypatch.context() as then:  # publishing then knew no retired models (migration 13)
        then.setattr(retire, "unretire", lambda *_: None)
        fleet(old)
        old.create_version(manifest(seed=1))
        publish_waves(old)
    with pytest.raises(Exception, match="CHECK constraint"), transaction(old.db) as conn:
        conn.execute("UPDATE waves SET state = 'held'")
    old.db.conn.close()
    monkeypatch.setattr(store_db, "MIGRATIONS", MIGRATIONS)
    catalog = Catalog(connect(tmp_path / "r.sqlite3"), "tester")
    r = waves.latest(catalog.db.conn, MODEL)
    assert r is not None and (r.version, r.state) == (2, "running")
    at = changes.position(catalog.db.conn)
    with transaction(catalog.db) as conn:
        conn.execute("UPDATE waves SET state = 'held'")
    (change,) = changes.read_changes(catalog.db.conn, at, 10)
    assert change.table == "waves" and json.loads(change.row)["state"] == "held"
