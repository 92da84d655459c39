"""A stolen edge token against a wave rollout's gate (issues 46 and 56), replayed over real
gRPC: a real ``registry serve`` steering a rollout over ten edges that ack and report on their
own Sync streams, one of them lying with all it has: ``audit_rows=10**12`` and whichever
agreement hurts most, silence, or a FAILED install. Before the gate bounded each node's word,
the liar inside the first wave passed a release trained on flipped labels through both gates,
and the liar outside it halted a good release; before gates failed closed, a silent liar
outside the wave passed a flipped release (its side short of quorum: "not measured"), and one
FAILED ack in the first wave halted a good one.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness.processes import RegistryProcess, start_registry
from registry.releases import waves
from sync.gen import sync_pb2 as pb
from tests.conftest import RegistryCli
from tests.integration.test_lying_node import SECRET, FakeNode
from tests.integration.test_sync import metric, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]
MODEL = "tiny"
EDGES = sorted((f"edge-{i}" for i in range(10)), key=lambda n: waves.position(MODEL, n))
INSIDE, OUTSIDE = EDGES[0], EDGES[-1]  # the first in the first wave; the last in the last
WAVES = ("--waves", "30%,100%", "--wave-bake-s", "1", "--wave-min-audit-rows", "100",
         "--wave-install-timeout-s", "30")  # 3 of 10 edges first: the least quorum
LIE = 10**12  # audited rows a liar claims
Says = Callable[[str, bool], tuple[float, int]]
"""(node id, whether it runs the rolling version) -> the agreement and audited rows it reports"""


@dataclass
class Fleet:
    cli: RegistryCli
    registry: RegistryProcess
    nodes: dict[str, FakeNode]
    says: Says
    failing: frozenset[str] = frozenset()  # ack FAILED every version above ``production``
    production: int = 1

    def rollout(self) -> dict[str, Any]:
        return dict(self.cli("rollout", "show", MODEL, "--json").json())


def drive(fleet: Fleet, stop: threading.Event) -> None:
    """Every edge acks the last release it was pushed, ACTIVE, and reports on it every 0.2 s:
    100 requests, and the audit ``fleet.says`` (version 1 is the previous one throughout)."""
    acked: dict[str, int] = {}
    while not stop.wait(0.2):
        for node_id, node in fleet.nodes.items():
            releases = [m.release for m in list(node.received) if m.HasField("release")]
            if not releases:
                continue
            version = releases[-1].version
            fails = node_id in fleet.failing and version > fleet.production
            if acked.get(node_id) != version:
                node.send(ack=pb.Ack(model=MODEL, version=version,
                                     state=pb.FAILED if fails else pb.ACTIVE,
                                     reason="bad artifact" if fails else ""))
                acked[node_id] = version
            if fails:
                continue
            agreement, rows = fleet.says(node_id, version != 1)
            node.send(report=pb.QualityReport(
                model=MODEL, version=version, window_s=1.0, requests=100, rows=100,
                p99_ms=20.0, audit_rows=rows, audit_agreement=agreement))


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, tiny_release: Path) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("lying-waves")
    cli = RegistryCli(root / "registry")
    cli("publish", tiny_release, "--name", MODEL)
    registry = start_registry(cli.home, root, SECRET, env={"REGISTRY_WAVE_TICK_S": "0.2"})
    nodes = {n: FakeNode(registry.target, n, "edge") for n in EDGES}
    fleet = Fleet(cli, registry, nodes, lambda node_id, new: (0.9, 300))
    stop = threading.Event()
    driver = threading.Thread(target=drive, args=(fleet, stop), daemon=True)
    driver.start()
    try:
        for node in nodes.values():
            node.release()
        yield fleet
    finally:
        stop.set()
        driver.join(10)
        for node in nodes.values():
            node.close()
        registry.stop()


def verdict(fleet: Fleet) -> dict[str, Any]:
    wait_for(lambda: fleet.rollout()["state"] not in ("running", "baking"), 60,
             "the rollout's verdict", poll=0.3)
    return fleet.rollout()


def test_a_liar_in_the_first_wave_cannot_pass_a_flipped_release(
        fleet: Fleet, tiny_release_flipped: Path) -> None:
    # the honest edges see the flipped release disagree with their center; the liar claims
    # a trillion perfectly agreeing rows for it, and as many disagreeing for the previous one
    fleet.says = lambda node_id, new: (((1.0 if new else 0.0), LIE) if node_id == INSIDE
                                       else ((0.3 if new else 0.9), 300))
    fleet.cli("publish", tiny_release_flipped, "--name", MODEL, *WAVES)
    rollout = verdict(fleet)
    assert rollout["state"] == "halted" and rollout["wave"] == 1, rollout
    assert "live audit agreement 0.300" in rollout["reason"]
    new = rollout["figures"]["wave 1"]["new"]
    assert new["audit_nodes"] == 3 and new["agreement"] == pytest.approx(0.3)
    (lie,) = [w for w in new["weights"] if w["node"] == INSIDE]
    assert lie["claimed"] == LIE and lie["counted"] == 300
    assert lie["weight"] == pytest.approx(1 / 3, abs=1e-3)
    assert fleet.cli("list", "--json").json()[0]["production"] == 1


def test_a_silent_liar_cannot_pass_a_flipped_release_it_holds_for_a_person(
        fleet: Fleet, tiny_release_flipped: Path) -> None:
    # only three edges outside the first wave audit (the least quorum), one of them the liar,
    # which says nothing (audit_rows=0): the previous version's side is one node short
    reporting = {OUTSIDE, *EDGES[3:5]}
    fleet.says = lambda node_id, new: (((0.3 if new else 0.9), 300) if new or node_id in
                                       reporting - {OUTSIDE} else (0.9, 0))
    time.sleep(1.0)  # every edge's last report says so before the rollout's first step
    created = fleet.cli("publish", tiny_release_flipped, "--name", MODEL, *WAVES,
                        "--json").json()
    bad = int(created["manifest"]["version"])
    rollout = verdict(fleet)
    assert rollout["state"] == "held" and rollout["held"] == "not-measured", rollout
    assert rollout["wave"] == 1
    assert rollout["reason"].startswith("agreement not measured (900 and 600 audited rows "
                                        "from 3 and 2 nodes"), rollout["reason"]
    wait_for(lambda: metric(fleet.registry.metrics_url, "registry_rollout_held", model=MODEL,
                            reason="not-measured") == 1.0, 10, "the hold on /metrics")
    assert metric(fleet.registry.metrics_url, "registry_rollout_state", model=MODEL,
                  state="held") == 1.0
    shown = fleet.cli("rollout", "show", MODEL).stdout
    assert "held at wave 1/2" in shown and "registry rollout resume tiny --reason" in shown
    assert "held (not-measured)" in fleet.cli("status").stdout
    refused = fleet.cli("rollout", "resume", MODEL, check=False)
    assert refused.code != 0 and "give --reason" in refused.stderr
    assert fleet.rollout()["state"] == "held"
    fleet.cli("rollout", "abort", MODEL, "--reason", "flipped labels, checked by hand")
    assert fleet.rollout()["state"] == "aborted"
    (abort,) = [r for r in fleet.cli("audit", "--model", MODEL, "--json").json()
                if r["action"] == "rollout-abort" and r["version"] == bad]
    assert json.loads(abort["payload"])["reason"] == "flipped labels, checked by hand"
    assert any(r["action"] == "rollout-hold" and r["version"] == bad
               for r in fleet.cli("audit", "--model", MODEL, "--json").json())
    wait_for(lambda: metric(fleet.registry.metrics_url, "registry_rollout_held", model=MODEL,
                            reason="not-measured") == 0.0, 10, "the hold cleared")
    assert fleet.cli("list", "--json").json()[0]["production"] == 1


def test_a_liar_outside_the_first_wave_cannot_halt_a_good_release(
        fleet: Fleet, tiny_release: Path) -> None:
    # the liar praises the previous version and, once it runs the new one, damns it
    fleet.says = lambda node_id, new: (((0.0 if new else 1.0), LIE) if node_id == OUTSIDE
                                       else (0.9, 300))
    created = fleet.cli("publish", tiny_release, "--name", MODEL, *WAVES, "--json").json()
    good = int(created["manifest"]["version"])
    rollout = verdict(fleet)
    assert rollout["state"] == "done", rollout  # both gates passed
    for gate in ("wave 1", "wave 2"):
        figures = rollout["figures"][gate]
        assert figures["agreement_drop"]["drop"] == pytest.approx(0.0), gate
    previous = rollout["figures"]["wave 1"]["previous"]
    (lie,) = [w for w in previous["weights"] if w["node"] == OUTSIDE]
    assert lie["claimed"] == LIE and previous["agreement"] == pytest.approx(0.9)
    assert fleet.cli("list", "--json").json()[0]["production"] == good


def test_one_failed_install_in_the_first_wave_cannot_halt_a_good_release(
        fleet: Fleet, tiny_release: Path) -> None:
    fleet.says = lambda node_id, new: (0.9, 300)
    fleet.production = int(fleet.cli("list", "--json").json()[0]["production"])
    fleet.failing = frozenset({INSIDE})
    try:
        created = fleet.cli("publish", tiny_release, "--name", MODEL, *WAVES, "--json").json()
        rollout = verdict(fleet)
    finally:
        fleet.failing = frozenset()
    assert rollout["state"] == "done", rollout
    first = rollout["figures"]["wave 1"]
    assert (first["nodes"], first["installed"], first["failed"]) == (3, 2, 1)
    assert fleet.cli("list", "--json").json()[0]["production"] == \
        int(created["manifest"]["version"])
