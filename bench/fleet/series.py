"""The registry's /metrics with the per-node series on and off (``REGISTRY_NODE_SERIES``): the
page's size and samples, and what a real Prometheus holds after scraping it and how long its
scrapes take.

    .venv/bin/python -m bench.fleet.series [--nodes N] [--registry-nodes N] [--markdown PATH]

In-process (``--nodes``, default 10,000): ``SyncMetrics`` fed every node's report (edges over
4 regions, a tenth on a canary version, 2 centers) each 10 s report interval by a thread, as
the registry's event loop would be fed, served by its own /metrics server. Through a real
``registry serve`` (``--registry-nodes``, default 1,000; 0 skips): bench.fleet's simulated
nodes, every edge reporting, one region. Prometheus is Debian's ``/usr/bin/prometheus``
scraping every 5 s, read after 3 good scrapes. About 1-2 minutes per row on 2 cores (3-4
for 10,000 nodes through registry serve).
"""

from __future__ import annotations

import argparse
import math
import tempfile
from collections.abc import Sequence
from pathlib import Path

from rich.table import Table

from bench.fleet.measure import raise_nofile
from bench.fleet.series_measure import Row, in_process, through_registry
from bench.harness import console
from bench.kit import machine
from bench.markdown import Shown
from bench.rollout.measure import MODEL, Cli
from bench.synced import releases


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.fleet.series",
                                     description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--nodes", type=int, default=10_000,
                        help="simulated nodes fed in-process (default 10000; 0 skips)")
    parser.add_argument("--registry-nodes", type=int, default=1_000,
                        help="simulated nodes on a real registry serve (default 1000; 0 skips)")
    parser.add_argument("--markdown", type=Path, default=None, metavar="PATH")
    return parser.parse_args(argv)


def table(rows: list[Row]) -> Table:
    t = Table(title="The registry's /metrics, per-node series on and off")
    for column in ("fed by", "nodes", "per-node series", "page KiB", "samples (of them "
                   "fleet)", "make / fetch page, s", "report, µs", "Prometheus series",
                   "TSDB head series", "scrape s (last / max)", "scrapes failed"):
        t.add_column(column, justify="left" if column == "fed by" else "right")
    for r in rows:
        t.add_row(r.how, f"{r.nodes:,}", "on" if r.node_series else "off",
                  f"{r.page_bytes / 1024:,.1f}", f"{r.samples:,} ({r.fleet_samples:,})",
                  f"{r.make_s:.3f}", "-" if math.isnan(r.report_us) else f"{r.report_us:.1f}",
                  f"{r.prometheus_series:,.0f}", f"{r.head_series:,}",
                  f"{r.scrape_s:.3f} / {r.scrape_max_s:.3f}", f"{r.failed} of {r.scrapes}")
    return t


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    raise_nofile()
    info = machine(run=f"in-process {args.nodes:,} nodes; registry serve "
                       f"{args.registry_nodes:,} nodes")
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="bench-series-") as tmp:
        work = Path(tmp)
        for on in (True, False):
            if args.nodes:
                console.log(f"in-process, {args.nodes:,} nodes, node series {on}")
                rows.append(in_process(args.nodes, on, work / f"prom-{on}"))
        if args.registry_nodes:
            first, _, what = releases(work)
            info["release"] = what
            template = work / "template"
            Cli(template).run("publish", str(first), "--name", MODEL, "--create", timeout=600)
            for on in (True, False):
                console.log(f"registry serve, {args.registry_nodes:,} nodes, node series {on}")
                rows.append(through_registry(args.registry_nodes, on, template, work))
    show = Shown(console)
    m = Table(title="Machine", show_header=False)
    for key, value in info.items():
        m.add_row(key, value)
    show(m)
    show(table(rows))
    show("Samples: as prometheus_client's parser reads the page. Prometheus series: "
         "count({job=\"registry\"}) after 3 scrapes 5 s apart, the page's samples and the 5 "
         "series Prometheus adds per target (up, scrape_*); the TSDB head holds nothing "
         "else. A failed scrape: up 0, the 5 s scrape timeout passed. "
         "In-process: make = SyncMetrics.exposition() (median of 5); report = "
         "SyncMetrics.report per report of the second interval (replacing each node's "
         "first). Registry serve: fetch = one GET of /metrics.")
    if args.markdown is not None:
        show.write(args.markdown, "The registry's /metrics at scale (bench.fleet.series)")


if __name__ == "__main__":
    main()
