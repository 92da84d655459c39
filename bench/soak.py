"""Soak benchmark: steady load on an edge (escalating to a center) for N minutes, watching
memory, open file descriptors and latency minute by minute.

    .venv/bin/python -m bench.soak [--minutes 10] [--markdown docs/bench/soak.md]

How it measures: docs/benchmark-methods.md, "Soak".
"""

from __future__ import annotations

import argparse
import re
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
from rich.table import Table

from bench.harness import TEXTS, console, ensure_wrk, review_texts
from bench.kit import load_average, write_bodies
from bench.loadgen import Run, Sample, Wrk, growth, run_wrk, sample
from bench.markdown import Shown
from bench.synced import DEMO, Fleet, fleet, releases

MINUTE_S = 60
SAMPLE_S = 5.0
WARMUP_S = 10
PROCESSES = ("edge", "center", "registry")
ESCALATED = re.compile(r'^edge_rows_total\{[^}]*tier="center"[^}]*\}\s+(\S+)$')


@dataclass
class Minute:
    number: int
    run: Run
    escalated: float
    samples: dict[str, Sample]  # at the minute's end


class Sampler(threading.Thread):
    """Samples every process every ``SAMPLE_S`` seconds until ``stop``."""

    def __init__(self, pids: dict[str, int]) -> None:
        super().__init__(daemon=True)
        self.pids, self.latest = pids, {n: sample(p) for n, p in pids.items()}
        self.peak = dict(self.latest)
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(SAMPLE_S):
            self.take()

    def take(self) -> dict[str, Sample]:
        self.latest = {n: sample(p) for n, p in self.pids.items()}
        for name, s in self.latest.items():
            if s.rss > self.peak[name].rss:
                self.peak[name] = s
        return self.latest


def escalated_rows(edge_url: str) -> float:
    text = httpx.get(f"{edge_url}/metrics", timeout=10).text
    return sum(float(m[1]) for line in text.splitlines() if (m := ESCALATED.match(line)))


def soak(f: Fleet, minutes: int, concurrency: int, wrk: str, bodies: Path) -> list[Minute]:
    url = f.infer_url(f.edge)
    run_wrk(wrk, url, bodies, concurrency, WARMUP_S)
    sampler = Sampler({"edge": f.edge.pid, "center": f.center.pid, "registry": f.registry.pid})
    sampler.start()
    result: list[Minute] = []
    try:
        for number in range(1, minutes + 1):
            before = escalated_rows(f.edge.url)
            run = Wrk(wrk, url, bodies, concurrency, MINUTE_S).result()
            result.append(Minute(number, run, escalated_rows(f.edge.url) - before,
                                 sampler.take()))
            m = result[-1]
            console.log(f"minute {number}: {run.requests} requests, failed {run.errors}, p99 "
                        f"{run.latency.percentile_ms(99):.1f} ms, " + ", ".join(
                            f"{n} {m.samples[n].rss_mib:.1f} MiB/{m.samples[n].fds} fds"
                            for n in PROCESSES))
    finally:
        sampler.halt.set()
        sampler.join()
    return result


def minutes_table(result: Sequence[Minute], concurrency: int) -> Table:
    table = Table(title=f"Soak: wrk -t1 -c{concurrency} on the edge, per minute")
    for header in ("minute", "requests", "failed", "req/s", "p50 ms", "p99 ms",
                   "escalated rows", *(f"{n} {c}" for n in PROCESSES for c in ("RSS MiB", "fds"))):
        table.add_column(header, justify="right")
    for m in result:
        cells = [f"{m.samples[n].rss_mib:.1f}" if c == "rss" else str(m.samples[n].fds)
                 for n in PROCESSES for c in ("rss", "fds")]
        table.add_row(str(m.number), str(m.run.requests), str(m.run.errors), f"{m.run.rps:.0f}",
                      f"{m.run.latency.percentile_ms(50):.1f}",
                      f"{m.run.latency.percentile_ms(99):.1f}", f"{m.escalated:.0f}", *cells)
    return table


def delta_table(result: Sequence[Minute]) -> Table:
    first, last = result[0], result[-1]
    table = Table(title=f"First minute vs minute {last.number}")
    for header in ("process", "RSS first MiB", "RSS last MiB", "RSS growth", "fds first",
                   "fds last", "fds change"):
        table.add_column(header, justify="left" if header == "process" else "right")
    for n in PROCESSES:
        a, b = first.samples[n], last.samples[n]
        rise = growth(a.rss, b.rss)
        table.add_row(n, f"{a.rss_mib:.1f}", f"{b.rss_mib:.1f}",
                      ("[green]" if rise < 10 else "[red]") + f"{rise:+.1f}%[/]", str(a.fds),
                      str(b.fds), f"{b.fds - a.fds:+d}")
    p99s = [m.run.latency.percentile_ms(99) for m in (first, last)]
    table.caption = (f"edge p99 {p99s[0]:.1f} ms -> {p99s[1]:.1f} ms ({p99s[1] / p99s[0]:.2f}x); "
                     f"failed requests {sum(m.run.errors for m in result)} of "
                     f"{sum(m.run.requests for m in result)}")
    return table


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--minutes", type=int, default=10, help="minutes of load (default 10)")
    parser.add_argument("--concurrency", type=int, default=4,
                        help="wrk connections to the edge (default 4)")
    parser.add_argument("--release", type=Path, default=DEMO,
                        help="release folder (default var/demo/release; the tiny releases when "
                        "it is missing)")
    parser.add_argument("--markdown", type=Path, default=None, metavar="PATH",
                        help="also write the tables as a markdown fragment to PATH")
    args = parser.parse_args(argv)
    if args.minutes < 2:
        parser.error("--minutes must be >= 2 (the first minute is compared with the last)")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    wrk = ensure_wrk()
    with tempfile.TemporaryDirectory(prefix="bench-soak-") as tmp:
        work = Path(tmp)
        first, second, what = releases(work, args.release)
        bodies = write_bodies(review_texts(TEXTS), work / "bodies.jsonl")
        with fleet(work, first, second) as f:
            console.log(f"fleet up: {what}; {WARMUP_S} s warm-up, then {args.minutes} minutes")
            result = soak(f, args.minutes, args.concurrency, wrk, bodies)
    show = Shown(console)
    show(f"Release: {what}; load average at the end "
         f"{load_average()}.")
    show(minutes_table(result, args.concurrency))
    show(delta_table(result))
    if args.markdown is not None:
        show.write(args.markdown, f"Soak: {args.minutes} minutes of steady load on an edge")


if __name__ == "__main__":
    main()
