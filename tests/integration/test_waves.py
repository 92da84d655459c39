"""Wave rollouts end to end: a real ``registry serve``, a center, two real edges answering live
traffic with every row they keep audited, and twenty simulated edges, all on their own sync
streams. A release trained on flipped labels halts at the first gate by itself, its wave's
nodes go back to the previous version, and no request fails; a good release then passes
every gate unattended and becomes production. The tests share one fleet, in file order."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from examples.sentiment import data
from harness.monitoring import Monitoring, watching
from harness.processes import RegistryProcess, start_registry, start_tier
from registry.releases import waves
from tests.conftest import RegistryCli
from tests.integration.test_sync import metric, served, wait_for
from tests.servers import BIN, Server
from tests.streams import Acking

pytestmark = [pytest.mark.integration, pytest.mark.slow]
TOKEN = "test-token-0123456789"
MODEL = "tiny"
SIMS = [f"sim-{i:02d}" for i in range(20)]
REGISTRY_ENV = {"REGISTRY_REPORT_INTERVAL_S": "1", "REGISTRY_WAVE_TICK_S": "0.5"}
SYNC = ("--sync-backoff-max-s", "1", "--poll-interval-s", "0.2")
# 22 edges: waves of 3, 11 and 22. The gate's p99 bound is wide here: one real edge per side,
# a 2-core machine shared with everything else (the p99 gate has its own unit test). One real
# edge per side is also all that audits: agreement is judged on one node's word here (the
# default quorum of 3 nodes, against a lying one, has its own tests: test_lying_waves.py).
WAVES = ("--waves", "10%,50%,100%", "--wave-bake-s", "6", "--wave-min-audit-rows", "40",
         "--wave-min-audit-nodes", "1", "--wave-install-timeout-s", "60",
         "--wave-max-p99-ratio", "10")
BATCH = 8  # texts per request


def first_and_last(sims: list[str]) -> tuple[str, str]:
    """Node ids for the two real edges: one ranked before every simulated edge (in the first
    wave), one after all of them (in the last)."""
    low = min(waves.position(MODEL, s) for s in sims)
    high = max(waves.position(MODEL, s) for s in sims)
    first = next(f"edge-a{i}" for i in range(100_000) if waves.position(MODEL, f"edge-a{i}") < low)
    last = next(f"edge-b{i}" for i in range(100_000)
                if waves.position(MODEL, f"edge-b{i}") > high)
    return first, last


@dataclass
class Fleet:
    cli: RegistryCli
    registry: RegistryProcess
    center: Server
    first: Server  # a real edge in the first wave
    last: Server  # a real edge in the last wave
    sims: list[Acking]
    failed: list[str] = field(default_factory=list)  # requests that did not get a 200
    answered: dict[int, int] = field(default_factory=dict)  # model version -> rows

    def rollout(self) -> dict[str, Any]:
        return dict(self.cli("rollout", "show", MODEL, "--json").json())


@contextmanager
def traffic(fleet: Fleet) -> Iterator[None]:
    """Real review snippets (not the calibration rows), BATCH per request, to both real edges
    until exit; every answer's status is checked."""
    texts = data.split(data.load_reviews(), seed=7).val.texts[200:1200]
    stop = threading.Event()

    def send(edge: Server) -> None:
        i = 0
        with httpx.Client(timeout=10) as client:
            while not stop.is_set():
                batch = [texts[(i + k) % len(texts)] for k in range(BATCH)]
                i += BATCH
                body = {"inputs": [{"name": "text", "shape": [BATCH], "datatype": "BYTES",
                                    "data": batch}]}
                try:
                    response = client.post(f"{edge.url}/v2/models/{MODEL}/infer", json=body)
                except httpx.HTTPError as exc:
                    fleet.failed.append(f"{edge.node_id}: {exc!r}")
                    continue
                if response.status_code != 200:
                    fleet.failed.append(f"{edge.node_id}: {response.status_code} "
                                        f"{response.text[:200]}")
                else:
                    version = int(response.json()["model_version"])
                    fleet.answered[version] = fleet.answered.get(version, 0) + BATCH
                stop.wait(0.03)

    threads = [threading.Thread(target=send, args=(e,), daemon=True)
               for e in (fleet.first, fleet.last)]
    for t in threads:
        t.start()
    try:
        yield
    finally:
        stop.set()
        for t in threads:
            t.join(15)


def edge(root: Path, registry: RegistryProcess, center: Server, node_id: str) -> Server:
    # floor tolerance 0: the floor is the calibrated threshold; every row the edge keeps is
    # audited against the center (the gate's live agreement)
    return start_tier("edge", root / node_id, root, "--registry", registry.target, *SYNC,
                      "--center-url", center.url, "--cache-size", "0", "--floor-tolerance", "0",
                      "--audit-share", "1", env={"PATH": str(BIN)}, registry_secret=TOKEN,
                      node_id=node_id, until="live")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, tiny_release: Path) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("waves")
    cli = RegistryCli(root / "registry")
    cli("publish", tiny_release, "--name", MODEL)
    # the calibrated threshold, not the centers' spare capacity: at this test's light load
    # the controller would escalate every row, and the audit sees only rows the edge keeps
    cli("cascade", MODEL, "--mode", "static")
    registry = start_registry(cli.home, root, TOKEN, env=REGISTRY_ENV)
    servers: list[Server] = []
    sims: list[Acking] = []
    try:
        center = start_tier("center", root / "center", root, "--registry", registry.target,
                            *SYNC, env={"PATH": str(BIN)}, registry_secret=TOKEN, until="live")
        servers.append(center)
        first_id, last_id = first_and_last(SIMS)
        servers += [edge(root, registry, center, first_id), edge(root, registry, center, last_id)]
        sims = [Acking(registry.target, TOKEN, s) for s in SIMS]
        wait_for(lambda: all(served(s) == 1 for s in servers) and
                 all(s.versions.get(MODEL) == 1 for s in sims), 90, "the fleet on version 1")
        yield Fleet(cli, registry, center, servers[1], servers[2], sims)
    finally:
        for sim in sims:
            sim.close()
        for server in reversed(servers):
            server.stop()
        registry.stop()


@pytest.fixture(scope="module")
def chain(fleet: Fleet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Monitoring]:
    """Prometheus with the repository's rules scraping the registry, Alertmanager with the
    shipped receiver config, and a webhook at its end."""
    with watching(tmp_path_factory.mktemp("alerts")) as found:
        found.targets("registry", [{
            "targets": [f"127.0.0.1:{fleet.registry.metrics_port}"],
            "labels": {"node": "registry", "tier": "registry", "region": "local"}}])
        yield found


def audited_rows(fleet: Fleet, node: Server, version: int) -> int:
    rows = {r["node"]: r for r in fleet.cli("status", "--json").json() if r["model"] == MODEL}
    row = rows.get(node.node_id, {})
    return int(row.get("audit_rows") or 0) if row.get("version") == version else 0


def test_a_worse_release_halts_at_the_first_gate_and_its_wave_goes_back(
        fleet: Fleet, tiny_release_flipped: Path, chain: Monitoring) -> None:
    with traffic(fleet):
        wait_for(lambda: audited_rows(fleet, fleet.last, 1) >= 40, 60,
                 "the previous version's live audit")
        created = fleet.cli("publish", tiny_release_flipped, "--name", MODEL, *WAVES,
                            "--json").json()
        bad = int(created["manifest"]["version"])
        wait_for(lambda: fleet.rollout()["state"] not in ("running", "baking"), 120,
                 "the first gate's verdict", poll=0.5)
        halted = time.monotonic()
        rollout = fleet.rollout()
        wait_for(lambda: served(fleet.first) == 1, 30, "the wave's real edge back on 1")
        back = [s for s in fleet.sims if waves.position(MODEL, s.node_id) < rollout["cutoff"]]
        wait_for(lambda: all(s.versions[MODEL] == 1 for s in back), 30, "the wave's sims back")
    assert rollout["state"] == "halted", rollout
    assert rollout["wave"] == 1 and rollout["nodes"]["wave"] == 3
    assert "live audit agreement" in rollout["reason"], rollout["reason"]
    figures = rollout["figures"]["wave 1"]
    assert figures["new"]["agreement"] < figures["previous"]["agreement"] - 0.02
    assert fleet.answered.get(bad, 0) > 0  # the wave's edge did serve it, measured live
    assert served(fleet.last) == 1 and served(fleet.center) == 1  # never got it
    assert fleet.failed == []
    (halt,) = [r for r in fleet.cli("audit", "--model", MODEL, "--json").json()
               if r["action"] == "rollout-halt"]
    payload = json.loads(halt["payload"])
    assert halt["actor"] == "registry:waves" and halt["version"] == bad
    assert payload["back_to"] == 1 and "agreement" in payload["reason"]
    assert payload["figures"]["new"]["audit_rows"] >= 40
    assert fleet.cli("status").stdout.count("halted") >= 1
    state = lambda name: metric(fleet.registry.metrics_url, "registry_rollout_state",  # noqa: E731
                                model=MODEL, state=name)
    wait_for(lambda: state("halted") == 1.0, 10, "the halt on /metrics")
    assert state("running") == 0.0
    assert metric(fleet.registry.metrics_url, "registry_rollout_wave", model=MODEL) == 1.0
    assert fleet.cli("list", "--json").json()[0]["production"] == 1
    # the operator is paged: the real chain, the shipped routing, from the halt to the webhook
    hit = chain.webhook.wait("TieredRolloutHalted", halted, 120, model=MODEL)
    print(f"\nrollout halted: TieredRolloutHalted at the webhook after {hit.at - halted:.0f} s")
    assert hit.alert["labels"]["severity"] and "runbook" in hit.alert["annotations"]


def test_a_good_release_passes_every_gate_unattended(fleet: Fleet, tiny_release: Path) -> None:
    with traffic(fleet):
        created = fleet.cli("publish", tiny_release, "--name", MODEL, *WAVES, "--json").json()
        good = int(created["manifest"]["version"])
        wait_for(lambda: fleet.rollout()["state"] not in ("running", "baking"), 240,
                 "every wave's gate", poll=0.5)
        rollout = fleet.rollout()
        assert rollout["state"] == "done", rollout
        wait_for(lambda: all(served(s) == good for s in (fleet.first, fleet.last, fleet.center))
                 and all(s.versions[MODEL] == good for s in fleet.sims), 60,
                 "every node on the new version")
    assert fleet.failed == []
    gates = [json.loads(r["payload"]) for r in fleet.cli("audit", "--model", MODEL,
                                                         "--json").json()
             if r["action"] == "rollout-gate" and r["version"] == good]
    assert [g["wave"] for g in gates] == [1, 2, 3]
    assert gates[0]["figures"]["agreement_drop"]["drop"] < 0.05
    assert fleet.cli("list", "--json").json()[0]["production"] == good
    wait_for(lambda: metric(fleet.registry.metrics_url, "registry_rollout_state", model=MODEL,
                            state="done") == 1.0, 10, "done on /metrics")
    assert metric(fleet.registry.metrics_url, "registry_rollout_state", model=MODEL,
                  state="halted") == 0.0


def test_a_bad_wave_policy_is_refused_before_anything_is_built(registry_cli: RegistryCli,
                                                              tiny_release: Path) -> None:
    for flags, said in ((("--waves", "10%,50%"), "last wave must be 100%"),
                        (("--waves", "10,100"), "invalid wave '10'"),
                        (("--wave-bake-s", "5"), "--wave-bake-s applies to --waves only"),
                        (("--waves", "10%,100%", "--canary", "edge-1"), "exclude each other"),
                        (("--waves", "100%", "--wave-max-failures", "2"), "")):
        result = registry_cli("publish", tiny_release, "--name", MODEL, *flags, check=False)
        assert result.code != 0, flags
        assert said in result.stderr, (flags, result.stderr)
    assert registry_cli("list", "--json").json() == []  # nothing recorded
    registry_cli("publish", tiny_release, "--name", MODEL)
    result = registry_cli("rollout", "show", MODEL, check=False)
    assert result.code == 1 and "never been rolled out in waves" in result.stderr
    result = registry_cli("rollout", "pause", MODEL, check=False)
    assert result.code != 0 and "no unfinished wave rollout" in result.stderr
