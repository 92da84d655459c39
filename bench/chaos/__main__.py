"""``python -m bench.chaos``: the chaos report on the demo release (see bench/chaos/__init__)."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from rich.console import Console

from bench.markdown import Shown
from harness.chaos.replay import Plan
from harness.chaos.run import session, tables
from tiered.cli import LOOPBACK_ENTRY


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__)
    parser.add_argument("--requests", type=int, default=3000, help="requests recorded and "
                        "replayed (default 3000)")
    parser.add_argument("--concurrency", type=int, default=8, help="replay clients (default 8)")
    parser.add_argument("--release", type=Path, default=Path("var/demo/release"),
                        help="release folder published first and again during the run")
    parser.add_argument("--model", default="sentiment", help="model name (default sentiment)")
    parser.add_argument("--root", type=Path, default=Path("var/bench/chaos"),
                        help="scratch folder, emptied first (default var/bench/chaos)")
    parser.add_argument("--markdown", type=Path, default=None, help="also write the tables here")
    args = parser.parse_args()
    if not (args.release / "tiered.json").is_file():
        parser.error(f"{args.release} is not a release folder (make demo builds it)")
    shutil.rmtree(args.root, ignore_errors=True)
    args.root.mkdir(parents=True)
    show = Shown(Console())
    plan = Plan(concurrency=args.concurrency)
    # nginx as `tiered up` runs it: the center and the registry's metrics behind the entry too
    outcome = session(args.root.resolve(), args.release.resolve(), args.release.resolve(),
                      args.model, args.requests, plan, nginx_flags=LOOPBACK_ENTRY)
    for table in tables(outcome):
        show(table)
    show(f"Faults: {plan.drop_rate:.0%} of connections dropped mid-request (half after part of "
         f"the body, half after the whole request without reading the answer), "
         f"{plan.corrupt_rate:.0%} of bodies corrupted (truncated JSON, broken UTF-8, wrong "
         f"datatype, a 512 KiB string), an edge SIGKILLed every {plan.edge_kill_every} requests "
         f"(in turn, once the previous one is back), the center at {plan.center_kill_at:.0%} of "
         f"the run, registry serve twice during a publish of the same release at "
         f"{plan.publish_at:.0%}. `tiered up`'s supervisor restarts what was killed; nginx "
         f"runs as `tiered up` runs it ({' '.join(LOOPBACK_ENTRY)}).")
    if args.markdown:
        show.write(args.markdown, "Chaos replay")


if __name__ == "__main__":
    main()
