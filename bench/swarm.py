"""Tiered on a Docker Swarm of five ``dockerd`` nodes (``deploy/swarm/stack.yml``), each node a
network namespace with its own address (``tiered.swarm.Cluster``): a manager and a second node
at the center site, a gateway and an edge host at site eu, one host at site us. The images come
from the private engine of ``scripts/docker_here.sh`` by ``docker save | docker load``: no
registry is asked for anything. With clients at both edge sites sending through their site's
entry the whole time (retrying a failure once), it measures:

- the deploy: ``docker stack deploy`` until every service is healthy and both entries answer;
- a ``registry publish`` (run in the registry's container) until every node of the swarm
  serves it;
- a rolling update of the edge image (start-first, one edge at a time): requests failed;
- eu's edge host lost (its daemon, PID 1 of the node, killed): how soon eu's clients are
  answered by us's edges (the entry's failover), and how soon Swarm has the edges running on
  eu's spare node and serving eu again;
- the center's node drained: the center moved to the other center node, the standby registry
  (pinned to its node) waiting; escalation back.

Root only; ~10 min warm.

    python -m bench.swarm --markdown docs/bench/swarm.md

The swarm, the stack and each step are ``harness.swarm``; the swarm test (``make swarm-test``)
runs the same through it and asserts what each step must keep.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from bench.kit import machine_line
from bench.markdown import Shown
from harness.sites import Traffic
from harness.swarm import EDGES, SwarmRun, running, setup_table, table


def scenario(run: SwarmRun) -> dict[str, Any]:
    """Every step in turn with the traffic running; then the convergence check."""
    run.figures["deploy_s"] = round(run.deploy(), 1)
    run.traffic = Traffic({s: run.entry(s) for s in EDGES}).start()
    time.sleep(3)
    run.rollout()
    run.rolling_update()
    run.node_lost()
    run.drain()
    run.traffic.stop()
    return run.converged()


@click.command()
@click.option("--root", type=click.Path(path_type=Path), default=Path("var/bench-swarm"),
              show_default=True)
@click.option("--prefix", default="10.81", show_default=True,
              help="The /16 the nodes get addresses in.")
@click.option("--markdown", type=click.Path(path_type=Path), default=None)
def main(root: Path, prefix: str, markdown: Path | None) -> None:
    from examples.sentiment.tiny import build_tiny_release

    if os.geteuid() != 0:
        raise click.ClickException("the swarm's nodes need root (network namespaces, dockerd)")
    console = Console(highlight=False)
    show = Shown(console)
    root = root.resolve()
    shutil.rmtree(root, ignore_errors=True)
    release = build_tiny_release(root / "release-a")
    release_b = build_tiny_release(root / "release-b", seed=1)
    with running(root / "swarm", release, release_b, prefix) as run:
        done = scenario(run)
    show(setup_table(run))
    show(table(run))
    show(f"After all four: every node on version {run.published}; `registry audit --verify` "
         f"exit {done['audit_rc']}.")
    show(machine_line())
    if markdown:
        show.write(markdown, "Tiered on Docker Swarm (bench/swarm.py)")


if __name__ == "__main__":
    main()
