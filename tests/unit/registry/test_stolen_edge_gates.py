"""One stolen edge against a wave rollout's gates (issue 56): in a fleet of 9 edges and one of
3, in the first wave or outside it, silent (``audit_rows=0``), lying high (10**12 rows agreeing
perfectly), lying low (10**12 rows agreeing never) or acknowledging the install as FAILED. It
never passes a release trained on flipped labels (its rollout halts or holds, production stays)
and never halts a good one (it passes or holds). Small honest fleets (2 and 6 edges) roll a good
release all the way and stop a flipped one. Driven at the database, every step a tick of the
registry and every node's ack and report, as ``tests/unit/registry/test_waves.py`` does."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from registry.fleet import nodes as node_writes
from registry.fleet.nodes import NodeBook
from registry.releases import gate, steering, waves
from registry.releases.catalog import Catalog
from registry.releases.plan import RolloutNode
from registry.releases.waves import WavePolicy
from registry.store import chain
from registry.store.db import connect
from registry.trust.anchor import audited
from tests.unit.registry.test_rollout import manifest

MODEL = "m"
CENTER = RolloutNode("center-1", "center", "eu")
POLICY = WavePolicy((0.1, 0.5, 1.0), bake_s=10, install_timeout_s=60, min_audit_rows=100)
LIE = 10**12
GOOD, FLIPPED = 0.9, 0.3  # what an honest edge's audit agrees on with each release
MODES = ("silent", "high", "low", "failed")


@dataclass
class Run:
    rollout: waves.Rollout
    catalog: Catalog
    most: int  # the most edges that ran the new version at once
    edges: int


def ranked(n: int) -> list[RolloutNode]:
    nodes = [RolloutNode(f"edge-{i}", "edge", "eu") for i in range(n)]
    return sorted(nodes, key=lambda e: waves.position(MODEL, e.node_id))


def report(version: int, agreement: float, rows: int, p99: float = 20.0,
           drift: bool = False) -> dict[str, Any]:
    return {"model": MODEL, "version": version, "requests": 10**6, "audit_rows": rows,
            "audit_agreement": agreement, "p99_ms": p99, "drift": drift,
            "confidence_drift": False}


def running(catalog: Catalog, node: RolloutNode) -> int | None:
    return next((t.version for t in catalog.desired(node) if t.model == MODEL), None)


def roll(tmp_path: Path, n: int, flipped: bool, stolen: str | None = None,
         mode: str = "", policy: WavePolicy = POLICY) -> Run:
    """Version 1 in production on ``n`` edges that report on it; version 2 published in waves
    and stepped until done, halted, or held for good (three more bakes). ``stolen``: "in"
    (the first edge of the first wave) or "out" (the last of the last), behaving as ``mode``."""
    catalog = Catalog(connect(tmp_path / f"{n}-{flipped}-{stolen}-{mode}.sqlite3"), "tester")
    edges = ranked(n)
    liar = {"in": edges[0], "out": edges[-1]}.get(stolen or "")
    book = NodeBook(catalog.db)
    for node in [*edges, CENTER]:
        book.write([node_writes.hello(node, "peer", [])])
    catalog.create_version(manifest(seed=1))

    def step() -> int:
        on_new = 0
        for node in edges:
            want = running(catalog, node)
            assert want is not None
            on_new += want == 2
            if node == liar and mode == "failed" and want == 2:
                book.write([node_writes.ack(node, MODEL, want, "FAILED",
                                            f"version {want}: bad artifact")])
                continue
            honest = FLIPPED if flipped and want == 2 else GOOD
            said = report(want, honest, 300)
            if node == liar:
                said = {"silent": report(want, honest, 0), "high": report(want, 1.0, LIE),
                        "low": report(want, 0.0, LIE),
                        "drift": report(want, honest, 300, drift=want == 2),
                        "slow": report(want, honest, 300, p99=10_000.0 if want == 2 else 20.0),
                        }.get(mode, said)
            book.write([node_writes.ack(node, MODEL, want, "ACTIVE", ""),
                        node_writes.quality(node.node_id, MODEL, said)])
        return on_new

    step()  # every edge reports on version 1 before the rollout
    catalog.create_version(manifest(seed=2), rollout=policy)
    at, most, held_since = time.time(), 0, None
    for _ in range(60):
        at += policy.bake_s / 2 + 1
        with audited(catalog.db, None) as conn:
            steering.tick(conn, at, "registry:waves")
        most = max(most, step())
        r = waves.latest(catalog.db.conn, MODEL)
        assert r is not None
        if r.state in ("done", "halted"):
            return Run(r, catalog, most, n)
        if r.state == "held":
            held_since = held_since or at
            if at - held_since > 3 * policy.bake_s:
                return Run(r, catalog, most, n)
    raise AssertionError("no verdict")


def check(run: Run, state: str, flipped: bool) -> None:
    r = run.rollout
    assert r.state == state, (r.state, r.reason, r.figures.get(f"wave {r.wave + 1}"))
    if flipped:  # never production, never every edge
        assert run.catalog.alias(MODEL, "production") == 1
        assert run.most < run.edges
    if state == "held":
        assert r.figures["held"] in gate.HOLDS and r.reason
        assert run.catalog.alias(MODEL, "production") == 1
    halts = [x for x in chain.records(run.catalog.db) if x.action == "rollout-halt"]
    assert len(halts) == (state == "halted")


# The fleet of 9: waves of 3 (10% raised to the least a gate judges with a liar), 5 and 9.
# Whatever the stolen edge does, the gates see what the honest edges see.
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("stolen", ["in", "out"])
def test_nine_edges_one_stolen_a_flipped_release_halts_at_the_first_gate(
        tmp_path: Path, stolen: str, mode: str) -> None:
    run = roll(tmp_path, 9, True, stolen, mode)
    check(run, "halted", True)
    assert run.rollout.wave == 0 and run.most == 3
    assert "live audit agreement 0.300" in (run.rollout.reason or "")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("stolen", ["in", "out"])
def test_nine_edges_one_stolen_a_good_release_goes_all_the_way(
        tmp_path: Path, stolen: str, mode: str) -> None:
    run = roll(tmp_path, 9, False, stolen, mode)
    check(run, "done", False)
    assert run.catalog.alias(MODEL, "production") == 2


# The fleet of 3: a first wave of 2 (one edge stays on the previous version, too few to be
# measured alone: the gate compares with the whole fleet's figures from the rollout's start).
# A stolen edge in a wave of two can make its gate undecided: it holds, for a person.
THREE = {  # (stolen, mode) -> (flipped release, good release)
    ("in", "silent"): ("held", "held"),
    ("in", "high"): ("held", "done"),
    ("in", "low"): ("halted", "held"),
    ("in", "failed"): ("held", "held"),
    ("out", "silent"): ("halted", "done"),
    ("out", "high"): ("halted", "done"),
    ("out", "low"): ("halted", "done"),
    ("out", "failed"): ("halted", "done"),
}


@pytest.mark.parametrize(("stolen", "mode"), list(THREE))
@pytest.mark.parametrize("flipped", [True, False], ids=["flipped", "good"])
def test_three_edges_one_stolen_neither_passes_a_flipped_release_nor_halts_a_good_one(
        tmp_path: Path, stolen: str, mode: str, flipped: bool) -> None:
    state = THREE[(stolen, mode)][0 if flipped else 1]
    run = roll(tmp_path, 3, flipped, stolen, mode)
    check(run, state, flipped)
    if state == "held":  # its wave of two: one says nothing, or the two disagree
        assert run.rollout.wave == 0 and run.most == 2
        assert run.rollout.figures["held"] == (
            "not-measured" if mode in ("silent", "failed") else "undecided")


@pytest.mark.parametrize("n", [2, 6])
def test_a_small_honest_fleet_rolls_a_good_release_all_the_way_and_halts_a_flipped_one(
        tmp_path: Path, n: int) -> None:
    good = roll(tmp_path, n, False)
    check(good, "done", False)
    assert good.catalog.alias(MODEL, "production") == 2
    first = good.rollout.figures["wave 1"]
    assert first["agreement_drop"]["drop"] == pytest.approx(0.0)
    assert first["nodes"] == {2: 1, 6: 3}[n]  # 10% of 2 is one node; of 6, raised to three
    bad = roll(tmp_path, n, True)
    check(bad, "halted", True)
    assert bad.rollout.wave == 0 and bad.most == {2: 1, 6: 3}[n]


@pytest.mark.parametrize("mode", ["drift", "slow"])
@pytest.mark.parametrize("stolen", ["in", "out"])
@pytest.mark.parametrize("n", [3, 9])
def test_one_stolen_edge_claiming_drift_or_a_slow_p99_does_not_halt_a_good_release(
        tmp_path: Path, n: int, stolen: str, mode: str) -> None:
    """Drift alarms need two wave nodes; a side's p99 is judged in its best case (a side of
    two: the lower, so a liar's 10 s is not the wave's)."""
    run = roll(tmp_path, n, False, stolen, mode)
    check(run, "done", False)


def test_two_wave_nodes_in_drift_halt_a_release(tmp_path: Path) -> None:
    policy = WavePolicy((0.3, 1.0), bake_s=10, install_timeout_s=60, min_audit_rows=100)
    catalog = Catalog(connect(tmp_path / "drift.sqlite3"), "tester")
    edges = ranked(9)
    book = NodeBook(catalog.db)
    for node in [*edges, CENTER]:
        book.write([node_writes.hello(node, "peer", [])])
    catalog.create_version(manifest(seed=1))
    catalog.create_version(manifest(seed=2), rollout=policy)
    at = time.time()
    for _ in range(20):
        at += 6
        with audited(catalog.db, None) as conn:
            steering.tick(conn, at, "registry:waves")
        for i, node in enumerate(edges):
            want = running(catalog, node)
            assert want is not None
            book.write([node_writes.ack(node, MODEL, want, "ACTIVE", ""),
                        node_writes.quality(node.node_id, MODEL, report(
                            want, GOOD, 300, drift=want == 2 and i < 2))])
    r = waves.latest(catalog.db.conn, MODEL)
    assert r is not None and r.state == "halted" and r.wave == 0
    assert (r.reason or "").startswith("drift: 2 of 3 wave nodes report a drift alarm")


def test_one_failed_install_does_not_halt_a_wave_two_do(tmp_path: Path) -> None:
    """A wave of 3 of 9 (max_failures 10%): one node's FAILED is 33% of the wave but one node;
    two halt it, and so does a build every node fails. In a fleet of two (no liar tolerated)
    one failure halts."""
    edges = ranked(9)
    for failing, state in ((1, "done"), (2, "halted"), (3, "halted")):
        run = roll_failing(tmp_path, 9, {e.node_id for e in edges[:failing]})
        assert run.rollout.state == state, (failing, run.rollout.reason)
        if state == "halted":
            assert (run.rollout.reason or "").startswith(
                f"installs: {failing} of 3 connected wave nodes failed")
    run = roll_failing(tmp_path, 2, {ranked(2)[0].node_id})
    assert run.rollout.state == "halted" and run.rollout.wave == 0


def roll_failing(tmp_path: Path, n: int, failing: set[str]) -> Run:
    """A good release that the ``failing`` edges fail to install (the others honest)."""
    catalog = Catalog(connect(tmp_path / f"failing-{n}-{len(failing)}.sqlite3"), "tester")
    edges = ranked(n)
    book = NodeBook(catalog.db)
    for node in [*edges, CENTER]:
        book.write([node_writes.hello(node, "peer", [])])
    catalog.create_version(manifest(seed=1))
    catalog.create_version(manifest(seed=2), rollout=POLICY)
    at = time.time()
    for _ in range(60):
        at += 6
        with audited(catalog.db, None) as conn:
            steering.tick(conn, at, "registry:waves")
        for node in edges:
            want = running(catalog, node)
            assert want is not None
            if want == 2 and node.node_id in failing:
                book.write([node_writes.ack(node, MODEL, 2, "FAILED", "version 2: broken")])
                continue
            book.write([node_writes.ack(node, MODEL, want, "ACTIVE", ""),
                        node_writes.quality(node.node_id, MODEL, report(want, GOOD, 300))])
        r = waves.latest(catalog.db.conn, MODEL)
        assert r is not None
        if r.state in ("done", "halted"):
            return Run(r, catalog, 0, n)
    raise AssertionError("no verdict")
