"""Schema-driven fuzzing of both tiers' V2 API with Schemathesis.

    .venv/bin/python -m bench.fuzz [--examples N] [--seed S] [--markdown PATH]

The fuzzing is ``harness.fuzz`` (``tests/integration/test_fuzz.py`` runs it bounded); this
runs it longer on a fresh center and edge and prints the table. How it tests:
docs/benchmark-methods.md, "Fuzzing the V2 API".
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench.markdown import Shown
from harness.fuzz import Tally, fuzz_hostile, fuzz_tier
from harness.stores import fill_stores, tiers


def table(tallies: list[Tally], examples: int, seed_: int) -> Table:
    out = Table(title=f"Schemathesis fuzzing of the V2 API ({examples} positive + {examples} "
                      f"negative examples per operation at most, seed {seed_})")
    for header in ("tier", "operation", "cases", "2xx", "4xx", "5xx", "schema violations",
                   "seconds"):
        out.add_column(header, justify="left" if header in ("tier", "operation") else "right")
    for t in tallies:
        out.add_row(t.tier, t.operation, str(t.cases), str(t.ok), str(t.client_errors),
                    f"[red]{t.server_errors}[/red]" if t.server_errors else "0",
                    f"[red]{t.violations}[/red]" if t.violations else "0", f"{t.seconds:.1f}")
    cases = sum(t.cases for t in tallies)
    out.add_row("all", "", str(cases), str(sum(t.ok for t in tallies)),
                str(sum(t.client_errors for t in tallies)),
                str(sum(t.server_errors for t in tallies)),
                str(sum(t.violations for t in tallies)),
                f"{sum(t.seconds for t in tallies):.1f}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=200,
                        help="most cases generated per operation and mode (default 200)")
    parser.add_argument("--seed", type=int, default=7, help="generation seed (default 7)")
    parser.add_argument("--markdown", type=Path, help="also write the table as markdown here")
    args = parser.parse_args()
    from examples.sentiment.tiny import build_tiny_release  # torch: only when run

    console = Console(width=140)
    show = Shown(console)
    with tempfile.TemporaryDirectory(prefix="tiered-fuzz-") as tmp:
        root = Path(tmp)
        fill_stores(root, build_tiny_release(root / "release"))
        with tiers(root) as (center, edge):
            tallies = []
            for server in (center, edge):
                tallies += fuzz_tier(server.tier, server.url, args.examples, args.seed)
                tallies.append(fuzz_hostile(server.tier, server.url))
    show(table(tallies, args.examples, args.seed))
    failures = [f"{t.tier} {t.operation}: {f}" for t in tallies for f in t.failures]
    show(f"{len(failures)} failures shown" if failures else "No 5xx and no schema violation.")
    for failure in failures[:20]:
        show(failure)
    if args.markdown:
        show.write(args.markdown, "Fuzzing the V2 API (Schemathesis)")


if __name__ == "__main__":
    main()
