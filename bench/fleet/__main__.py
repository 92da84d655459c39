"""Many subscribers on one registry: what one ``registry serve`` costs per connected node, and
where it falls short, at 100, 1,000 and 10,000 simulated nodes side by side.

    .venv/bin/python -m bench.fleet [--nodes N] [--rest SECONDS] [--json PATH]
        [--markdown PATH]

Each size gets a fresh registry home (v1 published) and a real ``registry serve``; the nodes
are simulated (``bench/fleet/sim.py``: real tokens, hellos, acks, reports and connections,
no model run) in worker processes beside it. About 2 minutes for 100 and 1,000 nodes, 5-8 for
10,000, on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from collections.abc import Sequence
from pathlib import Path

from rich.table import Table

from bench.fleet.measure import (
    GOAL_DIRECTIVE_S,
    GOAL_IDLE_KBIT_S,
    GOAL_RSS_MIB,
    PER_WORKER,
    SEGMENT_HEADERS,
    Options,
    SizeResult,
    Traffic,
    raise_nofile,
    run_size,
)
from bench.harness import console
from bench.kit import cores, machine, versions
from bench.markdown import Shown
from bench.rollout.measure import MODEL, Cli
from bench.synced import releases

SIZES = (100, 1_000, 10_000)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.fleet",
                                     description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--nodes", type=int, action="append", default=None, metavar="N",
                        help="fleet size (repeatable; default 100, 1000 and 10000)")
    parser.add_argument("--rest", type=float, default=30.0, metavar="SECONDS",
                        help="the window at rest (default 30)")
    parser.add_argument("--busy-every", type=int, default=2, metavar="K",
                        help="every K-th edge serves traffic and reports each interval; the "
                             "others are idle (default 2: half)")
    parser.add_argument("--centers", type=int, default=2,
                        help="simulated centers reporting capacity (default 2)")
    parser.add_argument("--wave", type=int, default=50,
                        help="edges that fetch the new release for real (default 50)")
    parser.add_argument("--wave-pace", type=float, default=25.0, metavar="PER_S",
                        help="fetches the wave begins per second (default 25)")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH")
    parser.add_argument("--from-json", type=Path, default=None, metavar="PATH",
                        help="print (and --markdown) an earlier run's --json; measure nothing")
    parser.add_argument("--markdown", type=Path, default=None, metavar="PATH")
    args = parser.parse_args(argv)
    args.nodes = sorted(set(args.nodes or SIZES))
    if min(args.nodes) <= args.centers or args.rest < 5:
        parser.error("--nodes must exceed --centers, --rest at least 5 s")
    return args


def fmt(value: float, digits: int = 2) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:,.{digits}f}"


def verdict(ok: bool) -> str:
    return "[green]met[/]" if ok else "[red]missed[/]"


def tables(results: list[SizeResult], info: dict[str, str], what: str,
           args: argparse.Namespace) -> list[Table | str]:
    out: list[Table | str] = []
    m = Table(title="Machine", show_header=False)
    for key, value in info.items():
        m.add_row(key, value)
    out.append(m)
    t = Table(title="One registry serve, N connected nodes (side by side, one run)")
    t.add_column("")
    for r in results:
        t.add_column(f"N = {r.nodes:,}", justify="right")

    def row(name: str, cell: object) -> None:
        t.add_row(name, *(str(cell(r)) if callable(cell) else str(cell) for r in results))

    row("nodes: edges (busy / idle) + centers; workers",
        lambda r: f"{r.edges:,} ({r.busy:,} / {r.edges - r.busy:,}) + {r.centers}; {r.workers}")
    row("connect storm: all connected and holding v1, s", lambda r: fmt(r.connect_s))
    row("  streams that failed and were opened again meanwhile",
        lambda r: f"{r.storm_failures:,}")
    row("  registry cores during the storm", lambda r: fmt(r.connect_registry_cores))
    row("streams held at rest", lambda r: f"{r.connected:,}")
    row("registry RSS at rest, MiB", lambda r: fmt(r.rss_mib, 0))
    row("  per node, KiB", lambda r: fmt(r.rss_mib * 1024 / r.nodes, 1))
    row(f"registry CPU at rest, cores ({args.rest:.0f} s window)",
        lambda r: fmt(r.rest_cores, 3))
    row("  other processes on the machine meanwhile, cores",
        lambda r: cores(r.rest_other_cores))
    row("simulated nodes: cores, RSS MiB (all workers)",
        lambda r: f"{fmt(r.sim_cores)}, {fmt(r.sim_rss_mib, 0)}")
    row("/metrics page: KiB, s to scrape",
        lambda r: f"{fmt(r.metrics_bytes / 1024, 0)}, {fmt(r.scrape_s)}")
    for kind in ("idle edge", "busy edge", "center"):
        row(f"{kind}: payload kbit/s up + down",
            lambda r, k=kind: (f"{fmt(r.traffic[k].up_bytes_s * 8 / 1000, 3)} + "
                               f"{fmt(r.traffic[k].down_bytes_s * 8 / 1000, 3)}")
            if k in r.traffic else "-")
        row(f"{kind}: with IPv4/TCP headers, kbit/s",
            lambda r, k=kind: fmt(r.traffic[k].wire_kbit_s, 3) if k in r.traffic else "-")
    row("publish command, s", lambda r: fmt(r.publish_s, 1))
    row("directive: p50 / p99 / max s after publish returned",
        lambda r: f"{fmt(r.directive_p50_s)} / {fmt(r.directive_p99_s)} / "
                  f"{fmt(r.directive_max_s)}")
    row("  the registry pushed it: first / last s (its log)",
        lambda r: f"{fmt(r.pushed_first_s)} / {fmt(r.pushed_last_s)}")
    row(f"  nodes holding it within {GOAL_DIRECTIVE_S:.0f} s",
        lambda r: f"{r.directive_within_goal:,} of {r.nodes:,}")
    row("all nodes acked ACTIVE, s after publish returned", lambda r: fmt(r.active_max_s))
    row("  registry cores, publish to all ACTIVE", lambda r: fmt(r.publish_registry_cores))
    row("download wave: nodes, MiB, s, MiB/s",
        lambda r: f"{r.wave}, {fmt(r.wave_bytes / 2**20, 1)}, {fmt(r.wave_s)}, "
                  f"{fmt(r.wave_mib_s, 1)}")
    row("  fetches broken / resumed at the partial file's offset / MiB not sent again",
        lambda r: f"{r.wave_interrupted} / {r.wave_resumed} / "
                  f"{fmt(r.wave_cut_bytes / 2**20, 1)}")
    row("registry database after stop: ACTIVE on v2 / ack records",
        lambda r: f"{r.recorded_active:,} / {r.recorded_acks:,}")
    row("reports sent / budgets received (whole run)",
        lambda r: f"{r.reports:,} / {r.budgets:,}")
    row("failures seen (last errors below)", lambda r: len(r.errors))
    t.caption = (f"Release: {what}. Nodes are simulated (bench/fleet/sim.py): each its own "
                 f"channel and TCP connection, token, hello, acks and reports; the model run "
                 f"is skipped. Only the wave's {args.wave} edges fetch the new release (at "
                 f"{args.wave_pace:g} fetches begun per second), every other one's first fetch of "
                 f"each artifact dropped half-way through its first chunk and resumed from "
                 f"the partial file's offset; the rest ack ACTIVE from a shared cache. Payload: "
                 f"TCP bytes_sent/bytes_received of each node's socket "
                 f"(ss -tinH) over the window; with headers: plus {SEGMENT_HEADERS} B "
                 f"(IPv4 + TCP with timestamps) per segment, loopback (no Ethernet framing). "
                 f"Up to {PER_WORKER:,} nodes per worker process.")
    out.append(t)
    g = Table(title="Goals")
    for column in ("goal", *(f"N = {r.nodes:,}" for r in results)):
        g.add_column(column, justify="left" if column == "goal" else "right")
    g.add_row(f"streams held by one registry process within {GOAL_RSS_MIB / 1024:.0f} GiB RSS",
              *(f"{verdict(r.connected == r.nodes and r.rss_mib <= GOAL_RSS_MIB)} "
                f"({r.connected:,}, {fmt(r.rss_mib, 0)} MiB)" for r in results))
    g.add_row(f"≤ {GOAL_IDLE_KBIT_S} kbit/s per idle edge (both ways, with headers)",
              *((f"{verdict(r.traffic['idle edge'].wire_kbit_s <= GOAL_IDLE_KBIT_S)} "
                 f"({fmt(r.traffic['idle edge'].wire_kbit_s, 3)}; payload "
                 f"{fmt(r.traffic['idle edge'].kbit_s, 3)})")
                if "idle edge" in r.traffic else "-" for r in results))
    g.add_row(f"every node holds the new directive ≤ {GOAL_DIRECTIVE_S:.0f} s after publish "
              f"returns",
              *(f"{verdict(r.directive_within_goal == r.nodes)} "
                f"(max {fmt(r.directive_max_s)} s)" for r in results))
    out.append(g)
    for r in results:
        out.append(
            f"N = {r.nodes:,}: the storm took {fmt(r.connect_s, 1)} s "
            f"({r.nodes / r.connect_s:,.0f} nodes/s), the registry at "
            f"{fmt(r.connect_registry_cores)} cores on the 2 it shares with the simulated nodes. "
            f"After publish returned, the registry's pushes of the new release ran from "
            f"{fmt(r.pushed_first_s)} to {fmt(r.pushed_last_s)} s (its log) and the last node "
            f"held its directive at {fmt(r.directive_max_s)} s. Up to the first push: the "
            f"registry noticing the commit and computing the push for every node "
            f"(Pusher.push_all); first to last: queueing each node's signed directive; "
            f"after that: delivery.")
        for error in r.errors[:3]:
            out.append(f"N = {r.nodes}: {error}")
    return out


def load(path: Path) -> tuple[dict[str, str], list[SizeResult]]:
    """An earlier run's machine and results (``--json``), to print again."""
    data = json.loads(path.read_text())
    results = []
    for size in data["sizes"]:
        size.pop("wave_mib_s", None)
        size["traffic"] = {k: Traffic(**{f: v for f, v in t.items()
                                        if f not in ("kbit_s", "wire_kbit_s")})
                           for k, t in size["traffic"].items()}
        results.append(SizeResult(**size))
    return data["machine"], results


def measure(args: argparse.Namespace) -> tuple[dict[str, str], list[SizeResult], str]:
    raise_nofile()
    options = Options(args.busy_every, 20.0, args.centers, 400.0, args.wave, args.wave_pace,
                      args.rest)
    results = []
    info = machine(grpcio=versions("grpcio"),
                   run=f"sizes {', '.join(map(str, args.nodes))}; rest window {args.rest:g} s")
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        work = Path(tmp)
        first, second, what = releases(work)
        info["release"] = what
        template = work / "template"
        console.log(f"publishing v1 ({what})")
        Cli(template).run("publish", str(first), "--name", MODEL, "--create", timeout=600)
        for n in args.nodes:
            results.append(run_size(n, options, template, second, work))
    return info, results, what


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.from_json is not None:
        info, results = load(args.from_json)
        what = info.get("release", "?")
    else:
        info, results, what = measure(args)
    show = Shown(console)
    for item in tables(results, info, what, args):
        show(item)
    if args.markdown is not None:
        show.write(args.markdown, "Many subscribers on one registry (bench.fleet)")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"machine": info,
                                         "sizes": [r.to_json() for r in results]}, indent=2))
        console.print(f"results written to {args.json}")


if __name__ == "__main__":
    main()
