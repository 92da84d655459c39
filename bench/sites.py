"""Sites under partitions: the three-site topology of ``tiered sites`` (a center site with three
Consul servers, the registry and the center; two edge sites with two edges and an nginx entry
each; every host its own network namespace and address) with clients at both edge sites
sending through their site's entry the whole time, retrying a failed request once, while:

1. an edge site is cut from the center site;
2. an edge site is cut from the registry during a rollout (its download resumes on heal);
   then small releases cross its 2 Mbit/s link, fetched whole and by chunks (2b);
3. an edge site is cut from the Consul servers;
4. a whole edge site's edges go down;
5. the Consul leader is killed; then the center host;
6. the registry group (a primary and a standby on two center-site hosts): the primary's host
   killed (a), the two registry hosts cut from each other (b), the primary cut from Consul
   (c: fenced, the standby takes over, no split brain).

It prints, per partition, the requests answered and failed, the slowest answer, how long the
fleet took to recover after the heal, and then the escalation latency across a site link with
and without 20 ms added each way (a delay proxy: this kernel has no ``netem``). Root only.

    python -m bench.sites --markdown docs/bench/sites.md

The topology, the traffic and each partition are ``harness.sites``; the sites test (``make
sites-test``) runs the same through it and asserts what each partition must keep.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from bench.kit import machine_line
from bench.markdown import Shown
from harness.sites import Run, Traffic, running, table


def partitions(run: Run) -> dict[str, Any]:
    """Partitions 1-5 in turn with the traffic running, then the convergence check."""
    run.traffic = Traffic({s: run.sites.entry(s) for s in run.sites.edge_sites}).start()
    time.sleep(3)
    run.site_from_center()
    run.registry_during_rollout()
    run.small_changes_on_a_thin_link()
    run.site_from_consul()
    run.site_down()
    run.consul_leader()
    run.center_host()
    run.registry_host()
    run.registries_partitioned()
    run.primary_from_consul()
    time.sleep(2)
    run.traffic.stop()
    return run.converged()


def latency_table(latency: dict[str, Any]) -> Table:
    out = Table(title="Escalation across the site link (edge at eu -> center at core, "
                      "2 rows, HTTPS, kept-alive connection)")
    for column in ("link", "p50 (ms)", "p99 (ms)"):
        out.add_column(column)
    for label, figures in latency.items():
        out.add_row(label, f"{figures['p50_ms']:.1f}", f"{figures['p99_ms']:.1f}")
    return out


@click.command()
@click.option("--root", type=click.Path(path_type=Path), default=Path("var/bench-sites"),
              show_default=True)
@click.option("--prefix", default="10.77", show_default=True,
              help="The /16 the hosts get addresses in.")
@click.option("--markdown", type=click.Path(path_type=Path), default=None)
def main(root: Path, prefix: str, markdown: Path | None) -> None:
    from examples.sentiment.tiny import build_tiny_release

    console = Console(highlight=False)
    show = Shown(console)
    root = root.resolve()
    subprocess.run(["rm", "-rf", str(root)], check=True)
    release = build_tiny_release(root / "release-a")
    release_b = build_tiny_release(root / "release-b", seed=1)
    with running(root / "fleet", release, release_b, prefix) as run:
        converged = partitions(run)
        latency = run.escalation_latency()
    show(table(run))
    show(latency_table(latency))
    show(f"After all five: every node on version {converged['latest']} "
         f"({converged['versions']}); `registry audit --verify` exit {converged['audit_rc']}.")
    show(machine_line())
    if markdown:
        show.write(markdown, "Sites under partitions (bench/sites.py)")


if __name__ == "__main__":
    main()
