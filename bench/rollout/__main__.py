"""Model-sync benchmark: rollout latency, bytes on the wire, fan-out, and edge p99 during a swap.

    .venv/bin/python -m bench.rollout [--subscribers N] [--duration SECONDS] [--quick]
        [--json PATH] [--markdown PATH]

About 1.5 minutes on a quiet 2-core machine. How it measures: docs/benchmark-methods.md,
"Model sync (rollout)".
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from bench.harness import (
    TEXTS,
    Plan,
    console,
    ensure_wrk,
    review_texts,
)
from bench.kit import write_bodies
from bench.markdown import Shown
from bench.rollout.measure import (
    EDGE_FLAGS,
    RELEASE,
    SYNC_FLAGS,
    TOKEN,
    Cli,
    Results,
    fanout,
    propagate,
    start_node,
    swap,
)
from bench.rollout.report import log_levels, machine_info, report, write_json
from harness.processes import (
    RegistryProcess,
    TierProcess,
    start_registry,
)

# --- main ------------------------------------------------------------------------------------

@contextlib.contextmanager
def stopping(processes: list[TierProcess | RegistryProcess]) -> Iterator[None]:
    """Stop (by PID) every process appended to ``processes``, last started first."""
    try:
        yield
    finally:
        for process in reversed(processes):
            try:
                process.stop()
            except Exception as exc:  # keep stopping the others
                console.print(f"[red]could not stop {process.name} (pid {process.pid}): "
                              f"{exc}[/]")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.rollout",
                                     description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--subscribers", type=int, default=None,
                        help="simulated subscribers in the fan-out (default 50; 20 with --quick)")
    parser.add_argument("--duration", type=int, default=10,
                        help="seconds per measured wrk run (default 10; at most 5 with --quick)")
    parser.add_argument("--quick", action="store_true",
                        help="fewer subscribers, shorter wrk runs (under 2 minutes)")
    parser.add_argument("--release", type=Path, default=RELEASE,
                        help="release folder to publish (default var/demo/release)")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH",
                        help="also write the results as JSON to PATH")
    parser.add_argument("--markdown", type=Path, default=None, metavar="PATH",
                        help="also write the tables as a markdown fragment to PATH")
    args = parser.parse_args(argv)
    if args.subscribers is None:
        args.subscribers = 20 if args.quick else 50
    if args.quick:
        args.duration = min(args.duration, 5)
    if args.subscribers < 1 or args.duration < 3:
        parser.error("--subscribers must be >= 1 and --duration >= 3 seconds")
    if not (args.release / "tiered.json").is_file():
        parser.error(f"{args.release} is not a release folder (no tiered.json)")
    return args


def run(args: argparse.Namespace, wrk_path: str, work: Path,
        processes: list[TierProcess | RegistryProcess]) -> Results:
    """Parts 1, 3 and 2, in that order; every process started is appended to ``processes``."""
    texts = review_texts(TEXTS)
    cli = Cli(work / "registry")
    registry = start_registry(cli.home, work, TOKEN)
    processes.append(registry)
    flags = ("--registry", registry.target, *SYNC_FLAGS)
    center = start_node("center", work / "center", work, *flags)
    processes.append(center)
    edge = start_node("edge", work / "edge", work, *flags, *EDGE_FLAGS, "--center-url",
                      center.url)
    processes.append(edge)
    rollouts = [propagate(kind, cli, registry, [center, edge], version, args.release)
                for version, kind in ((1, "cold"), (2, "warm"))]
    center.stop()  # part 3 measures the edge's own swap (docs/benchmark-methods.md)
    plan = Plan(wrk_path, work, write_bodies(texts, work / "bodies.jsonl", threshold=0),
                args.duration, 1 if args.quick else 2, 0)
    swapped = swap(plan, cli, edge, registry, args.release)
    edge.stop()  # part 2: only the simulated subscribers talk to the registry
    sims = work / "sims"
    try:
        fanned = asyncio.run(fanout(cli, registry, args.subscribers, sims, swapped.new))
    finally:
        shutil.rmtree(sims, ignore_errors=True)  # N x 17 MiB
    return Results(rollouts, fanned, swapped)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    wrk_path = ensure_wrk()
    info = machine_info(args, wrk_path)
    processes: list[TierProcess | RegistryProcess] = []
    with tempfile.TemporaryDirectory(prefix="bench-sync-") as tmp:
        with stopping(processes):
            results = run(args, wrk_path, Path(tmp), processes)
        results.logs = {p.name: log_levels(p.log) for p in processes}
    show = Shown(console)
    report(info, results, show)
    if args.markdown is not None:
        show.write(args.markdown, "Model sync: propagation, fan-out, swap under load")
    if args.json is not None:
        write_json(args.json, info, results)
        console.print(f"results written to {args.json}")


if __name__ == "__main__":
    main()
