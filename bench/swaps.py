"""Hot-swap benchmark: 50 consecutive model swaps on a running edge and center under load.

    .venv/bin/python -m bench.swaps [--swaps 50] [--window 3] [--markdown docs/bench/swaps.md]

About 3.5 minutes. How it measures: docs/benchmark-methods.md, "Hot swaps".
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.table import Table

from bench.harness import TEXTS, console, ensure_wrk, review_texts
from bench.kit import load_average, write_bodies
from bench.loadgen import Histogram, Run, Sample, Wrk, growth, sample
from bench.markdown import Shown
from bench.synced import DEMO, Fleet, fleet, releases, wait_serving

SWAP_AT_S = 0.5
TIERS = ("edge", "center")
FIRST, LAST = 10, 10
RSS_FROM = 5  # RSS growth is measured from this swap on


@dataclass
class Swap:
    number: int
    version: int
    took: dict[str, float]  # tier -> seconds from the commit to serving
    runs: dict[str, Run]
    samples: dict[str, Sample]


def one_swap(f: Fleet, number: int, args: argparse.Namespace, wrk: str, bodies: Path) -> Swap:
    loads = {n.tier: Wrk(wrk, f.infer_url(n), bodies, args.concurrency, args.window)
             for n in f.nodes}
    time.sleep(SWAP_AT_S)
    version = f.republish(1 if number % 2 else 2)  # alternate the two releases' artifacts
    took = wait_serving(f.nodes, version)
    runs = {tier: load.result() for tier, load in loads.items()}
    samples = {n.tier: sample(n.pid) for n in f.nodes}
    return Swap(number, version, took, runs, samples)


def run(args: argparse.Namespace, wrk: str, work: Path) -> tuple[str, list[Swap]]:
    first, second, what = releases(work, args.release)
    bodies = write_bodies(review_texts(TEXTS), work / "bodies.jsonl")
    with fleet(work, first, second) as f:
        console.log(f"fleet up: {what}; warming up for {args.window} s")
        warm = [Wrk(wrk, f.infer_url(n), bodies, args.concurrency, args.window)
                for n in f.nodes]
        for load in warm:
            load.result()
        swaps: list[Swap] = []
        for number in range(1, args.swaps + 1):
            swaps.append(one_swap(f, number, args, wrk, bodies))
            s = swaps[-1]
            console.log(f"swap {number:2}: v{s.version}  " + "  ".join(
                f"{t} {s.took[t]:.2f} s, p99 {s.runs[t].latency.percentile_ms(99):.1f} ms, "
                f"failed {s.runs[t].errors}, RSS {s.samples[t].rss_mib:.0f} MiB" for t in TIERS))
        check_alternation(swaps)
    return what, swaps


def check_alternation(swaps: Sequence[Swap]) -> None:
    versions = [s.version for s in swaps]
    if versions != list(range(versions[0], versions[0] + len(versions))):
        raise RuntimeError(f"the swaps did not each move to a new version: {versions}")


def p99(swaps: Sequence[Swap], tier: str) -> float:
    return Histogram.merged(s.runs[tier].latency for s in swaps).percentile_ms(99)


def summary_table(swaps: Sequence[Swap], window: float) -> Table:
    n = len(swaps)
    table = Table(title=f"{n} hot swaps under load ({window:.0f} s wrk window per swap)")
    for header in ("tier", "swaps", "requests", "failed", f"RSS after swap {RSS_FROM} MiB",
                   f"RSS after swap {n} MiB", "RSS growth", f"p99 first {FIRST} ms",
                   f"p99 last {LAST} ms", "p99 last/first", "swap p50 s", "swap max s"):
        table.add_column(header, justify="left" if header == "tier" else "right")
    for tier in TIERS:
        early = swaps[min(RSS_FROM, n) - 1].samples[tier].rss_mib
        late = swaps[-1].samples[tier].rss_mib
        first, last = p99(swaps[:FIRST], tier), p99(swaps[-LAST:], tier)
        took = [s.took[tier] for s in swaps]
        rise = growth(early, late)
        table.add_row(tier, str(n), str(sum(s.runs[tier].requests for s in swaps)),
                      str(sum(s.runs[tier].errors for s in swaps)), f"{early:.1f}",
                      f"{late:.1f}", ("[green]" if rise < 10 else "[red]") + f"{rise:+.1f}%[/]",
                      f"{first:.1f}", f"{last:.1f}", f"{last / first:.2f}",
                      f"{statistics.median(took):.2f}", f"{max(took):.2f}")
    return table


def trend_table(swaps: Sequence[Swap]) -> Table:
    table = Table(title="Trend (every 5th swap; p99 over the 5 swaps' windows)")
    for header in ("swap", "version", *(f"{t} {c}" for t in TIERS
                                        for c in ("RSS MiB", "fds", "p99 ms", "swap s"))):
        table.add_column(header, justify="right")
    for end in range(5, len(swaps) + 1, 5):
        s, block = swaps[end - 1], swaps[end - 5:end]
        cells = []
        for t in TIERS:
            cells += [f"{s.samples[t].rss_mib:.1f}", str(s.samples[t].fds),
                      f"{p99(block, t):.1f}", f"{max(b.took[t] for b in block):.2f}"]
        table.add_row(str(end), str(s.version), *cells)
    return table


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--swaps", type=int, default=50, help="consecutive swaps (default 50)")
    parser.add_argument("--window", type=float, default=3.0,
                        help="seconds of wrk load around each swap (default 3)")
    parser.add_argument("--concurrency", type=int, default=4,
                        help="wrk connections per tier (default 4)")
    parser.add_argument("--release", type=Path, default=DEMO,
                        help="release folder published twice (default var/demo/release; the "
                        "tiny releases when it is missing)")
    parser.add_argument("--markdown", type=Path, default=None, metavar="PATH",
                        help="also write the tables as a markdown fragment to PATH")
    args = parser.parse_args(argv)
    if args.swaps < FIRST + LAST or args.window < SWAP_AT_S + 1:
        parser.error(f"--swaps must be >= {FIRST + LAST} and --window >= {SWAP_AT_S + 1}")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    wrk = ensure_wrk()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-swaps-") as tmp:
        what, swaps = run(args, wrk, Path(tmp))
    show = Shown(console)
    show(f"Release: {what}. {len(swaps)} swaps, each a new version alternating the two "
         f"releases' artifacts; wrk -t1 -c{args.concurrency} on the edge and on the center; "
         f"load average {load_average()}; "
         f"{time.monotonic() - started:.0f} s in all.")
    show(summary_table(swaps, args.window))
    show(trend_table(swaps))
    if args.markdown is not None:
        show.write(args.markdown, "Hot swaps: memory, failures and latency over 50 swaps")


if __name__ == "__main__":
    main()
