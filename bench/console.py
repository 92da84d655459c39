"""The fleet console's page time at fleet size: a real ``tiered console`` over a registry of N
simulated nodes (``harness.fleet_state``: a halted wave rollout, a node down, every node's
last quality report), each page fetched sequentially with its credential, p50/p99 client-side
over loopback (the server's whole work: the read-only snapshot, the SQL aggregates, the
template). No Alertmanager is given, so no alert query is in the figures.

    .venv/bin/python -m bench.console [--nodes 10000] [--requests 50]
        [--markdown docs/bench/console.md]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import httpx
from rich.table import Table

from bench.harness import console
from bench.kit import cpu, load_average, usable_cores
from bench.markdown import Shown
from harness import fleet_state
from harness.processes import start_console

PAGES = (("overview", "/console/"), ("node list, page 1", "/console/nodes"),
         ("node list, page 100", "/console/nodes?page=100"),
         ("node list, disconnected", "/console/nodes?state=disconnected"),
         ("node list, one site, page 20", "/console/nodes?site=eu&page=20"))


def timed(client: httpx.Client, path: str, requests: int) -> tuple[list[float], int]:
    """Seconds per request (after two warm-ups) and the body's size."""
    for _ in range(2):
        client.get(path).raise_for_status()
    spent, size = [], 0
    for _ in range(requests):
        start = time.perf_counter()
        answer = client.get(path)
        spent.append(time.perf_counter() - start)
        answer.raise_for_status()
        size = len(answer.content)
    return spent, size


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[98]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--markdown", type=Path, default=None)
    args = parser.parse_args()
    show = Shown(console)
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        started = time.perf_counter()
        fleet_state.build(work / "registry", args.nodes)
        built = time.perf_counter() - started
        server = start_console(work / "registry", work, work / "secret")
        secret = (work / "secret").read_text().strip()
        table = Table("page", "p50 ms", "p99 ms", "max ms", "bytes",
                      title=f"fleet console at {args.nodes:,} nodes, {args.requests} requests "
                            f"a page, one at a time")
        try:
            with httpx.Client(base_url=server.url, auth=("operator", secret),
                              timeout=60) as client:
                for name, path in PAGES:
                    spent, size = timed(client, path, args.requests)
                    table.add_row(name, f"{1000 * statistics.median(spent):.1f}",
                                  f"{1000 * p99(spent):.1f}", f"{1000 * max(spent):.1f}",
                                  f"{size:,}")
        finally:
            server.stop()
    show(table)
    show(f"CPU: {cpu()}; cores {usable_cores()}; load average {load_average()}; the "
         f"registry of {args.nodes:,} nodes was written in {built:.1f} s")
    if args.markdown:
        show.write(args.markdown, "Fleet console page time (`python -m bench.console`)")


if __name__ == "__main__":
    main()
