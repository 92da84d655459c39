"""Steering wave rollouts (``registry.releases.steering``) step by step, at exact times, as an
operator sees them: the lines ``registry serve`` logs at each step, the rollout's state, cutoff,
reason and figures (``registry rollout show``), each audited record (gate, halt, hold, promote,
pause, resume, abort) with its whole payload, and the refusals a person gets. Each bound is
tested on both sides: the pace of admissions, the install timeout, the bake and the extra bake
before a hold. The tests that kill `make mutate`'s mutants the older tests let through."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import pytest

from registry.errors import RegistryError
from registry.fleet import nodes as node_writes
from registry.releases import steering, waves
from registry.releases.catalog import Catalog
from registry.releases.plan import RolloutNode
from registry.releases.waves import WavePolicy
from registry.store import chain
from registry.store.db import connect
from registry.trust.anchor import audited
from tests.unit.registry.test_rollout import manifest
from tests.unit.registry.test_waves import CENTER, EDGES, MODEL, fleet, report, running

T0 = 1_800_000_000.0  # the publish; a whole number of seconds: exact sums below
ACTOR = "registry:waves"


class Roll:
    """Version 1 in production on EDGES, every edge reporting on it; version 2 published in
    waves at T0. ``tick`` is one step of ``registry serve``; ``ack`` is the nodes' answers."""

    def __init__(self, path: Path, policy: WavePolicy, monkeypatch: pytest.MonkeyPatch,
                 nodes: list[RolloutNode] = EDGES, baseline: bool = True) -> None:
        self.catalog = Catalog(connect(path), "tester")
        self.book = fleet(self.catalog, nodes)
        self.nodes = nodes
        self.version = 2
        self.catalog.create_version(manifest(seed=1))
        if baseline:
            self.ack(rows=300)
        with monkeypatch.context() as m:
            m.setattr(time, "time", lambda: T0)
            assert self.catalog.create_version(manifest(seed=2), rollout=policy) == 2

    def tick(self, at: float) -> list[str]:
        with audited(self.catalog.db, None) as conn:
            return steering.tick(conn, at, ACTOR)

    def steer(self, action: str, at: float, reason: str | None = None) -> waves.Rollout:
        with audited(self.catalog.db, None) as conn:
            return steering.steer(conn, MODEL, action, "ops@host", at, reason)

    @property
    def r(self) -> waves.Rollout:
        r = waves.latest(self.catalog.db.conn, MODEL)
        assert r is not None
        return r

    def wave(self) -> list[RolloutNode]:
        return [n for n in self.nodes if running(self.catalog, n) == self.version]

    def ack(self, rows: int = 300, agreement: float = 0.9, only: set[str] | None = None,
            failed: set[str] = frozenset(), drift: bool = False,  # type: ignore[assignment]
            p99: float = 20.0) -> None:
        """Each edge (of ``only``) acks what it is told to run and reports on it; the new
        version's nodes with ``agreement``, ``drift`` and ``p99``, the others 0.9 and 20 ms."""
        for node in self.nodes:
            if only is not None and node.node_id not in only:
                continue
            want = running(self.catalog, node)
            assert want is not None
            new = want == self.version
            if new and node.node_id in failed:
                self.book.write([node_writes.ack(node, MODEL, want, "FAILED", "bad artifact")])
                continue
            self.book.write([node_writes.ack(node, MODEL, want, "ACTIVE", ""),
                             node_writes.quality(node.node_id, MODEL, report(
                                 want, agreement if new else 0.9, rows,
                                 p99 if new else 20.0, drift and new))])

    def records(self, action: str) -> list[tuple[str, str | None, int | None, dict[str, Any]]]:
        return [(x.actor, x.model, x.version, json.loads(x.payload))
                for x in chain.records(self.catalog.db) if x.action == action]


def ranked(nodes: list[RolloutNode] = EDGES) -> list[RolloutNode]:
    return sorted(nodes, key=lambda n: waves.position(MODEL, n.node_id))


THREE_WAVES = WavePolicy((0.05, 0.25, 1.0), bake_s=10, install_timeout_s=60,
                         min_audit_rows=100)


def test_a_good_release_step_by_step_logs_audits_and_keeps_the_latest_measured_baseline(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    roll = Roll(tmp_path / "r.sqlite3", THREE_WAVES, monkeypatch)
    name = "m version 2, wave {}/3"
    assert roll.tick(T0) == [f"{name.format(1)}: 3 of 3 nodes admitted"]
    order = ranked()
    assert {n.node_id for n in roll.wave()} == {n.node_id for n in order[:3]}
    r = roll.r
    assert r.cutoff == math.nextafter(waves.position(MODEL, order[2].node_id), 2.0)
    start = r.figures["baseline"]  # the whole fleet on version 1, before anyone moved
    assert start["from"] == "start" and start["measured"] is True
    assert start["agreement"] == pytest.approx(0.9) and start["audit_nodes"] == 20
    assert roll.tick(T0 + 1) == []  # nobody answered yet: the install goes on
    roll.ack()
    assert roll.tick(T0 + 1) == [f"{name.format(1)}: installed on 3 of 3 nodes; baking 10s"]
    assert (roll.r.state, roll.r.installed_at) == ("baking", T0 + 1)
    assert roll.tick(T0 + 10.9) == []  # baking
    assert roll.tick(T0 + 11) == [f"{name.format(1)}: gate passed; wave 2 begins"]
    r = roll.r
    assert (r.state, r.wave, r.wave_started, r.installed_at, r.reason) == \
        ("running", 1, T0 + 11, None, None)
    assert roll.records("rollout-gate") == [
        (ACTOR, MODEL, 2, {"wave": 1, "share": 0.05, "figures": r.figures["wave 1"],
                           "passed": True})]
    assert r.figures["wave 1"]["installed"] == 3
    # the others measured at the gate replace the start's figures as the baseline
    assert r.figures["baseline"] == r.figures["wave 1"]["previous"]
    assert "from" not in r.figures["baseline"]
    assert roll.tick(T0 + 11) == [f"{name.format(2)}: 5 of 5 nodes admitted"]
    roll.ack()
    assert roll.tick(T0 + 12) == [f"{name.format(2)}: installed on 5 of 5 nodes; baking 10s"]
    assert roll.tick(T0 + 22) == [f"{name.format(2)}: gate passed; wave 3 begins"]
    r = roll.r
    assert r.figures["baseline"] == r.figures["wave 2"]["previous"]
    assert roll.records("rollout-gate")[-1][3]["share"] == 0.25
    assert roll.tick(T0 + 22) == [f"{name.format(3)}: 20 of 20 nodes admitted"]
    assert roll.r.cutoff == 1.0  # whoever joins later gets it too
    roll.ack()
    assert roll.tick(T0 + 23) == [f"{name.format(3)}: installed on 20 of 20 nodes; baking 10s"]
    assert running(roll.catalog, CENTER) == 1  # the centers move last
    assert roll.tick(T0 + 33) == [f"{name.format(3)}: gate passed; production is version 2"]
    r = roll.r
    assert (r.state, r.reason) == ("done", "every wave passed its gate")
    # the last wave leaves nobody outside: it was judged against the last measured figures,
    # which stay the baseline
    assert r.figures["wave 3"]["previous"] == r.figures["wave 2"]["previous"]
    assert r.figures["baseline"] == r.figures["wave 2"]["previous"]
    assert set(r.figures) == {"baseline", "wave 1", "wave 2", "wave 3"}
    assert roll.records("promote") == [(ACTOR, MODEL, 2, {"from": 1, "to": 2, "by": "waves"})]
    assert roll.catalog.alias(MODEL, "production") == 2
    assert running(roll.catalog, CENTER) == 2
    assert [(x["alias"], x["version"], json.loads(x["targets"]))
            for x in roll.catalog.rollouts(MODEL)][-1] == ("production", 2, ["*"])
    assert roll.tick(T0 + 100) == []  # done: nothing more to step


def test_without_figures_of_the_previous_version_there_is_no_start_baseline(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    roll = Roll(tmp_path / "r.sqlite3", THREE_WAVES, monkeypatch, baseline=False)
    roll.tick(T0)
    assert "baseline" not in roll.r.figures


def test_a_gate_failing_on_two_counts_halts_with_both_audited_and_resumes_the_same_wave(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    policy = WavePolicy((0.25, 1.0), pace=600, bake_s=10, install_timeout_s=60,
                        min_audit_rows=100)
    roll = Roll(tmp_path / "r.sqlite3", policy, monkeypatch)
    roll.tick(T0 + 1)  # 600 a minute: the whole wave of 5 in one step
    assert len(roll.wave()) == 5
    roll.ack(drift=True, p99=100.0)
    roll.tick(T0 + 2)
    lines = roll.tick(T0 + 12)
    r = roll.r
    assert r.state == "halted" and r.wave == 0
    assert (r.reason or "").startswith("drift: 5 of 5 wave nodes report a drift alarm")
    assert "; latency: median p99 100.0 ms against 20.0 ms" in (r.reason or "")
    assert lines == [f"m version 2, wave 1/2: gate failed, halted; nodes go back to version 1: "
                     f"{r.reason}"]
    assert roll.records("rollout-halt") == [
        (ACTOR, MODEL, 2, {"wave": 1, "share": 0.25, "figures": r.figures["wave 1"],
                           "reason": r.reason, "back_to": 1})]
    assert roll.wave() == []
    r = roll.steer("resume", T0 + 100)
    assert (r.state, r.wave, r.wave_started, r.installed_at) == ("running", 0, T0 + 100, None)
    assert r.admitted_at == T0 + 100 - 0.1  # one node's worth earlier at 600 a minute
    assert roll.records("rollout-resume") == [("ops@host", MODEL, 2, {"wave": 1,
                                                                      "was": "halted"})]
    assert len(roll.wave()) == 5  # the same wave again, its gate judged afresh


def test_a_gate_that_cannot_judge_waits_exactly_one_more_bake_then_holds_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    policy = WavePolicy((0.25, 1.0), bake_s=10, install_timeout_s=60, min_audit_rows=100)
    roll = Roll(tmp_path / "r.sqlite3", policy, monkeypatch, baseline=False)
    roll.tick(T0)
    roll.ack(rows=0)
    roll.tick(T0 + 1)
    assert roll.tick(T0 + 11) == []  # baked, not measured: one more bake
    assert roll.tick(T0 + 20.9) == [] and roll.r.state == "baking"
    lines = roll.tick(T0 + 21)  # exactly two bakes after the install
    r = roll.r
    assert r.state == "held" and r.figures["held"] == "not-measured"
    assert (r.reason or "").startswith("agreement not measured (0 and 0 audited rows")
    assert lines == [f"m version 2, wave 1/2: gate held (not-measured): {r.reason}; "
                     f"`registry rollout resume m --reason ...` passes it, `abort` ends it"]
    assert roll.records("rollout-hold") == [
        (ACTOR, MODEL, 2, {"wave": 1, "share": 0.25, "hold": "not-measured",
                           "reason": r.reason, "figures": r.figures["wave 1"]})]
    assert roll.tick(T0 + 50) == [] and len(roll.records("rollout-hold")) == 1  # once
    with pytest.raises(RegistryError) as refused:
        roll.steer("pause", T0 + 50)
    assert str(refused.value) == ("m's rollout of version 2 is held; only a running one can "
                                  "be paused")
    with pytest.raises(RegistryError) as refused:
        roll.steer("resume", T0 + 50)
    assert str(refused.value) == (f"m's rollout of version 2 is held at wave 1 ({r.reason}); "
                                  f"resuming passes its gate: give --reason saying why")
    held_because = r.reason
    r = roll.steer("resume", T0 + 60, "checked by hand")
    assert (r.state, r.wave, r.wave_started, r.reason) == ("running", 1, T0 + 60, None)
    assert "held" not in r.figures and r.figures["wave 1"]["nodes"] == 5
    assert roll.records("rollout-resume") == [
        ("ops@host", MODEL, 2, {"wave": 1, "was": "held", "reason": "checked by hand",
                                "hold": "not-measured", "held_because": held_because,
                                "passed": True})]


def first_wave_installing(tmp_path: Path,
                          monkeypatch: pytest.MonkeyPatch) -> tuple[Roll, list[str]]:
    """A rollout of two waves (a quarter, then all) whose first wave is installing: its nodes."""
    policy = WavePolicy((0.25, 1.0), bake_s=10, install_timeout_s=60, min_audit_rows=100)
    roll = Roll(tmp_path / "r.sqlite3", policy, monkeypatch)
    roll.tick(T0)
    return roll, [n.node_id for n in roll.wave()]


def test_the_install_waits_for_connected_wave_nodes_until_the_timeout_exactly(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    roll, wave = first_wave_installing(tmp_path, monkeypatch)
    failed, gone, silent = wave[0], wave[1], wave[2]
    roll.book.write([node_writes.goodbye(gone)])  # disconnected: not waited for
    roll.ack(only={n for n in wave if n not in (gone, silent)}, failed={failed})
    assert roll.tick(T0 + 59.9) == []  # one connected node has not answered
    assert roll.tick(T0 + 60) == ["m version 2, wave 1/2: installed on 2 of 5 nodes (1 failed, "
                                  "1 disconnected, 1 not answered within 60s); baking 10s"]
    assert (roll.r.state, roll.r.installed_at) == ("baking", T0 + 60)


def test_a_failed_install_is_an_answer_not_a_wait(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    roll, wave = first_wave_installing(tmp_path, monkeypatch)
    roll.ack(failed={wave[0]})
    roll.tick(T0 + 1)
    assert (roll.r.state, roll.r.installed_at) == ("baking", T0 + 1)


def test_the_pace_admits_one_node_per_interval_exactly_and_the_last_wave_too(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    roll = Roll(tmp_path / "r.sqlite3", WavePolicy((1.0,), pace=1, bake_s=10),
                monkeypatch)
    order = ranked()
    assert roll.tick(T0 + 30) == ["m version 2, wave 1/1: 1 of 20 nodes admitted"]
    assert roll.r.admitted_at == T0  # the next is due a minute after the first was
    assert roll.r.cutoff == math.nextafter(waves.position(MODEL, order[0].node_id), 2.0)
    start = roll.r.figures["baseline"]
    assert (start["from"], start["audit_nodes"]) == ("start", 20)
    roll.ack()  # the first node now reports on version 2
    assert roll.tick(T0 + 59.9) == []
    assert roll.tick(T0 + 60) == ["m version 2, wave 1/1: 2 of 20 nodes admitted"]
    assert roll.r.figures["baseline"] == start  # taken once, before anyone moved
    assert roll.tick(T0 + 60 * 4 + 30) == ["m version 2, wave 1/1: 5 of 20 nodes admitted"]
    assert roll.r.admitted_at == T0 + 60 * 4
    assert {n.node_id for n in roll.wave()} == {n.node_id for n in order[:5]}
    assert roll.r.cutoff < 1.0
    assert roll.tick(T0 + 60 * 19) == ["m version 2, wave 1/1: 20 of 20 nodes admitted"]
    assert roll.r.cutoff == 1.0


def test_an_edgeless_fleets_last_wave_covers_whoever_joins_later(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    roll = Roll(tmp_path / "r.sqlite3", WavePolicy((1.0,), bake_s=10), monkeypatch, nodes=[])
    assert roll.tick(T0) == ["m version 2, wave 1/1: installed on 0 of 0 nodes; baking 10s"]
    assert roll.r.cutoff == 1.0
    late = RolloutNode("late-1", "edge", "eu")
    roll.book.write([node_writes.hello(late, "peer", [])])
    assert running(roll.catalog, late) == 2


def test_one_step_moves_every_models_rollout_and_says_so_for_each(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    roll = Roll(tmp_path / "r.sqlite3", THREE_WAVES, monkeypatch)
    roll.catalog.create_version(manifest("other", seed=1))
    roll.catalog.create_version(manifest("other", seed=2), rollout=THREE_WAVES)
    assert roll.tick(T0) == ["m version 2, wave 1/3: 3 of 3 nodes admitted",
                             "other version 2, wave 1/3: 3 of 3 nodes admitted"]


@pytest.mark.parametrize(("share", "total", "least", "nodes"), [
    (0.05, 20, 1, 1), (0.05, 20, 3, 3), (0.15, 20, 1, 3), (0.16, 20, 1, 4), (0.25, 20, 1, 5),
    (0.5, 3, 1, 2), (0.5, 2, 3, 2), (1.0, 20, 1, 20), (1.0, 0, 1, 0)])
def test_a_waves_size_is_its_share_rounded_up_at_least_the_least(
        share: float, total: int, least: int, nodes: int) -> None:
    assert steering.target(share, total, least) == nodes


def test_pause_resume_and_abort_by_hand_audit_who_why_and_what_it_was(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    policy = WavePolicy((0.25, 1.0), pace=6, bake_s=10, install_timeout_s=60,
                        min_audit_rows=100)
    roll = Roll(tmp_path / "r.sqlite3", policy, monkeypatch)
    roll.tick(T0)
    with pytest.raises(RegistryError) as refused:
        roll.steer("resume", T0)
    assert str(refused.value) == "m's rollout of version 2 is running, not paused, held or halted"
    assert roll.steer("pause", T0).state == "paused"
    r = roll.steer("resume", T0 + 5, "capacity is back")
    assert (r.state, r.wave_started, r.admitted_at) == ("running", T0 + 5, T0 + 5 - 10)
    roll.tick(T0 + 60)
    roll.ack()
    roll.tick(T0 + 61)
    assert roll.r.state == "baking"
    assert roll.steer("pause", T0 + 62).state == "paused"  # a baking one may be paused too
    assert roll.steer("resume", T0 + 63).state == "running"
    r = roll.steer("abort", T0 + 64)
    assert (r.state, r.reason) == ("aborted", "aborted by ops@host")
    assert [(x.action, x.actor, x.model, x.version, json.loads(x.payload))
            for x in chain.records(roll.catalog.db) if x.actor == "ops@host"] == [
        ("rollout-pause", "ops@host", MODEL, 2, {"wave": 1, "was": "running"}),
        ("rollout-resume", "ops@host", MODEL, 2, {"wave": 1, "was": "paused",
                                                  "reason": "capacity is back"}),
        ("rollout-pause", "ops@host", MODEL, 2, {"wave": 1, "was": "baking"}),
        ("rollout-resume", "ops@host", MODEL, 2, {"wave": 1, "was": "paused"}),
        ("rollout-abort", "ops@host", MODEL, 2, {"wave": 1, "was": "running"})]


def test_a_persons_reason_is_refused_with_the_whole_explanation() -> None:
    for bad, said in (("  ", "--reason is empty: say why"),
                      ("x" * 501, "--reason is 501 characters; at most 500"),
                      ("ok\x07", "--reason must be printable text (no control characters)")):
        with pytest.raises(RegistryError) as refused:
            steering.check_reason(bad)
        assert str(refused.value) == said



def held_not_measured(roll: Roll) -> str:
    """Step a first wave of two to a hold: one of its nodes says nothing; its id."""
    roll.tick(T0)
    wave = sorted(n.node_id for n in roll.wave())
    assert len(wave) == 2
    roll.ack(only={wave[0]})
    roll.ack(only={wave[1]}, rows=0)
    roll.tick(T0 + 1)
    roll.tick(T0 + 21)
    assert (roll.r.state, roll.r.figures["held"]) == ("held", "not-measured")
    return wave[1]


THREE_EDGES = [RolloutNode(f"edge-{i}", "edge", "eu") for i in range(3)]
FIRST_OF_TWO = WavePolicy((0.1, 0.5, 1.0), bake_s=10, install_timeout_s=60, min_audit_rows=100)


@pytest.mark.parametrize("at", [T0 + 22, T0 + 15], ids=["later", "clock-set-back"])
def test_a_held_gate_whose_reason_changes_is_held_and_audited_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, at: float) -> None:
    """Three edges, a first wave of two: one of them says nothing (not measured), then claims
    a trillion rows agreeing never (undecided: it may be the one lying). A held gate is judged
    at every step, even one whose clock was set back before the second bake's end."""
    roll = Roll(tmp_path / "r.sqlite3", FIRST_OF_TWO, monkeypatch, nodes=THREE_EDGES)
    quiet = held_not_measured(roll)
    roll.book.write([node_writes.quality(quiet, MODEL, {**report(2, 0.0, 10**12),
                                                        "requests": 10**6})])
    lines = roll.tick(at)
    r = roll.r
    assert (r.state, r.figures["held"]) == ("held", "undecided")
    assert (r.reason or "").startswith("agreement undecided: live audit agreement")
    assert lines == [f"m version 2, wave 1/3: gate held (undecided): {r.reason}; "
                     f"`registry rollout resume m --reason ...` passes it, `abort` ends it"]
    assert [x[3]["hold"] for x in roll.records("rollout-hold")] == ["not-measured",
                                                                   "undecided"]


def test_a_person_steers_the_named_models_rollout_not_anothers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    roll = Roll(tmp_path / "r.sqlite3", THREE_WAVES, monkeypatch)
    roll.catalog.create_version(manifest("other", seed=1))
    roll.catalog.create_version(manifest("other", seed=2), rollout=THREE_WAVES)
    roll.tick(T0)
    assert roll.steer("pause", T0 + 1).model == MODEL
    other = waves.latest(roll.catalog.db.conn, "other")
    assert other is not None and other.state == "running"
    assert (roll.r.model, roll.r.state) == (MODEL, "paused")


def test_an_unknown_action_changes_and_audits_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    roll = Roll(tmp_path / "r.sqlite3", THREE_WAVES, monkeypatch)
    roll.tick(T0)
    before = list(chain.records(roll.catalog.db))
    with pytest.raises(ValueError, match=r"^restart$"):
        roll.steer("restart", T0 + 1)
    assert roll.r.state == "running" and list(chain.records(roll.catalog.db)) == before
