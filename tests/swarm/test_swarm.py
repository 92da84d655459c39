"""Tiered on a real Docker Swarm: five ``dockerd`` nodes, each in its own network namespace
(a manager and a second node at the center site, a gateway and an edge host at site eu, one
host at site us), the images delivered with ``docker save | docker load``, the stack of
``deploy/swarm/stack.yml`` deployed with its secrets as Docker secrets, clients at both edge
sites through their site's entry (retrying a failure once), while a release is published, the
edge image is rolled, eu's edge host is lost and the center's node is drained
(``harness/swarm.py`` drives them).

``make swarm-test`` (root; ~10 min warm, plus the images' build when cold; not in ``make
test``). The tests share one swarm and run in file order.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.sites import Event
from harness.swarm import EDGES, STACK_NAME, SwarmRun, running, setup_table, table
from tiered import netns

pytestmark = [pytest.mark.swarm, pytest.mark.integration, pytest.mark.slow,
              pytest.mark.timeout(3600)]
ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "docker_here.sh"
PREFIX = "10.82"  # not bench.swarm's 10.81: the benchmark may run beside the test


def _script(*args: str, timeout: float = 1800) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DOCKER_", "COMPOSE_"))}
    done = subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)
    assert done.returncode == 0, f"{args}: {done.stdout[-2000:]}\n{done.stderr[-3000:]}"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, tiny_release: Path,
        tiny_release_b: Path) -> Iterator[SwarmRun]:
    why = netns.available()
    if why:
        pytest.fail(f"the swarm test needs network namespaces: {why}")
    pidfile = ROOT / "var" / "docker" / "dockerd.pid"
    already = pidfile.is_file() and Path(f"/proc/{pidfile.read_text().strip()}").exists()
    _script("start")  # the engine the images are built in and saved from
    started = None if already else int(pidfile.read_text())
    try:
        _script("bases")
        _script("build")
        with running(tmp_path_factory.mktemp("swarm"), tiny_release, tiny_release_b,
                     PREFIX) as swarm:
            yield swarm
            from rich.console import Console

            console = Console(width=160)
            console.print(setup_table(swarm))
            if swarm.events:
                console.print(table(swarm))
    finally:
        if started is not None:
            _script("stop", timeout=300)


def no_failures(event: Event) -> None:
    assert event.answers, f"no request was answered during {event.name}"
    assert not event.failed, [(a.site, a.status, a.error) for a in event.failed[:5]]


def test_the_stack_deploys_and_every_site_answers_from_its_own_edges(run: SwarmRun) -> None:
    run.figures["deploy_s"] = round(run.deploy(), 1)
    print(f"deploy: {run.figures}")
    placed = {name: run.cluster.node_of(run.service(name)) for name in
              ("registry", "registry-standby", "center-1", "consul-1", "consul-2", "consul-3",
               "entry-eu", "edge-eu-1", "edge-eu-2", "entry-us", "edge-us-1")}
    assert placed == {"registry": "center-1", "registry-standby": "center-2",
                      "center-1": "center-2", "consul-1": "center-1", "consul-2": "center-1",
                      "consul-3": "center-1", "entry-eu": "eu-gw", "edge-eu-1": "eu-1",
                      "edge-eu-2": "eu-1", "entry-us": "us-1", "edge-us-1": "us-1"}, placed
    for site, edges in EDGES.items():
        assert run.answers_from(site, edges), site
    # every node of the stack synced over TLS and is ACTIVE on the first release
    assert run.all_on(1), run.status()
    replication = json.loads(run.registry("replication", "--json"))
    assert replication["role"] == "primary" and replication["standbys"], replication


def test_credentials_are_docker_secrets_never_environment(run: SwarmRun) -> None:
    """No token, key or bundle in any service's spec (what `docker service inspect` shows
    anyone with access to the manager); each mounted read-only, owner-only, for the image's
    user."""
    values = [p.read_text().strip() for p in run.secrets.iterdir()
              if p.is_file() and (p.name.endswith(("-token", ".key", ".bundle"))
                                  or p.name.startswith("consul-"))]
    assert len(values) >= 12
    specs = run.cluster.manager.docker("service", "inspect", *(
        run.service(name) for name in run.cluster.services(STACK_NAME)))
    for value in values:
        for line in value.splitlines():
            if len(line) > 20 and "-----" not in line:
                assert line not in specs
    argv, cid = run.container("edge-eu-1")
    mode = subprocess.run([*argv, "exec", cid, "stat", "-c", "%a %u", "/run/secrets/bundle"],
                          capture_output=True, text=True, check=True).stdout.split()
    assert mode == ["400", "10001"], mode
    env = subprocess.run([*argv, "exec", cid, "env"], capture_output=True, text=True,
                         check=True).stdout
    assert not any(line.split("\n")[0] in env for line in values if len(line) > 20)


def test_start_traffic(run: SwarmRun) -> None:
    from harness.sites import Traffic

    run.traffic = Traffic({s: run.entry(s) for s in EDGES}).start()


def test_a_publish_reaches_every_node_of_the_swarm(run: SwarmRun) -> None:
    event = run.rollout()
    no_failures(event)
    print(f"publish -> every node serving it: {event.recovery_s} s")
    assert run.all_on(event.facts["version"])


def test_a_rolling_update_of_the_edge_image_fails_no_request(run: SwarmRun) -> None:
    event = run.rolling_update()
    print(f"rolling update: {event.recovery_s} s, {len(event.answers)} answered, "
          f"{len(event.failed)} failed, {event.retried} retried")
    no_failures(event)
    assert set(event.facts["images"].values()) == {"tiered/edge:0.1.0-next"}, event.facts


def test_an_edge_host_lost_fails_its_site_over_and_swarm_reschedules_its_edges(
        run: SwarmRun) -> None:
    event = run.node_lost()
    print(f"edge host lost: {event.facts}; failover {event.failover_s} s, back on eu's "
          f"edges after {event.recovery_s} s")
    no_failures(event)
    assert event.facts["answered_by_during"], "nothing answered eu's clients from us"
    assert set(event.facts["answered_by_during"]) <= set(EDGES["us"])
    assert event.failover_s is not None
    # the rescheduled edges started from empty stores and synced the release again
    assert run.all_on(run.published), run.status()


def test_a_drained_node_s_center_moves_and_the_pinned_standby_waits(run: SwarmRun) -> None:
    event = run.drain()
    print(f"drain: {event.facts}; escalation back after {event.recovery_s} s")
    no_failures(event)
    assert event.facts["center_on"] == "center-1"
    assert event.facts["standby_while_drained"] == "0/1"  # pinned: it waits for its node


def test_after_everything_every_node_is_on_the_last_release_and_the_audit_holds(
        run: SwarmRun) -> None:
    assert run.traffic is not None
    run.traffic.stop()
    done = run.converged()
    assert done["audit_rc"] == 0, done["audit"]
    assert not [a for a in run.traffic.answers if a.status != 200]


def test_closing_leaves_no_daemon_namespace_or_mount(run: SwarmRun) -> None:
    engines = list(run.cluster.engines.values())
    pids = [e.daemon_pid() for e in engines]
    namespaces = [e.host.netns for e in engines]
    run.cluster.close()
    assert all(p is None or not Path(f"/proc/{p}").exists() for p in pids)
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not [n for n in namespaces if n in listed]
    mounts = Path("/proc/mounts").read_text()
    assert str(run.cluster.state) not in mounts
    assert not [e for e in engines if e.exec_root.exists()]
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            assert str(run.cluster.state) not in cmdline, cmdline

