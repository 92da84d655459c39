"""The model-sync benchmark's tables, goals and JSON (``python -m bench.rollout``)."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from rich.table import Table

from bench.kit import BUSY_OTHERS, cores, machine, versions, wrk_version
from bench.loadgen import MIB
from bench.markdown import Shown
from bench.rollout.measure import (
    CONCURRENCY,
    GOAL_FANOUT_S,
    GOAL_PUSH_S,
    Fanout,
    Propagation,
    Results,
    Swap,
    fmt_s,
)

# --- report ----------------------------------------------------------------------------------


def mib(value: float) -> str:
    return f"{value / MIB:.2f}"


def verdict(ok: bool) -> str:
    return "[green]met[/]" if ok else "[red]missed[/]"


def machine_info(args: argparse.Namespace, wrk_path: str) -> dict[str, str]:
    return machine(grpcio=versions("grpcio"), wrk=wrk_version(wrk_path),
                   run=f"{args.subscribers} simulated subscribers, wrk {args.duration} s per "
                       f"run at concurrency {CONCURRENCY}{', --quick' if args.quick else ''}")


def machine_table(info: dict[str, str]) -> Table:
    table = Table(title="Machine", show_header=False)
    for key, value in info.items():
        table.add_row(key, value)
    return table


def propagation_table(rollouts: Sequence[Propagation]) -> Table:
    table = Table(title="1. Propagation: registry publish -> node serving, from the commit and "
                        "from the publish command's return")
    columns = ("rollout", "node", "publish\ns", "push after\ncommit s", "push after\nreturn s",
               "serving after\ncommit s", "serving after\nreturn s", "received\nMiB",
               "reused\nMiB", "tier size\nMiB", "registry\nstatus")
    for column in columns:
        table.add_column(column, justify="left" if column in columns[:2] else "right")
    for p in rollouts:
        for n in p.nodes:
            table.add_row(f"{p.kind} v{p.version}", n.tier, fmt_s(p.publish_s, 1),
                          fmt_s(n.push_commit_s, 3), fmt_s(n.push_s, 3),
                          fmt_s(n.serving_commit_s), fmt_s(n.serving_s), mib(n.received),
                          mib(n.reused), mib(n.artifact_bytes), n.status)
    nodes = ", ".join(f"{n.tier} = {n.node}" for n in rollouts[0].nodes)
    sent = ", ".join(f"{p.kind} {mib(p.registry_sent)} MiB" for p in rollouts)
    exits = ", ".join(f"{p.kind} {p.exit_s:.2f} s" for p in rollouts)
    others = ", ".join(f"{p.kind} {cores(p.other_cores)}" for p in rollouts)
    table.caption = (f"{nodes}. registry_sync_bytes_sent_total: {sent}. The publish command "
                     f"returned this long after its commit: {exits}. Cores used by other "
                     f"processes during publish + propagation: {others}")
    return table


def fanout_table(f: Fanout) -> Table:
    table = Table(title=f"2. Fan-out to {f.subscribers} simulated edges (own channel and store "
                        f"each); seconds after the trigger")
    columns = ("round", "verified", "pushed\nfirst/last", "all\nreceived", "all\nverified",
               "verified\np50", "verified\np99", "verified\nmax", "MiB per\nsubscriber",
               "total\nMiB", "MiB/s", "others'\ncores")
    for column in columns:
        table.add_column(column, justify="left" if column == "round" else "right")
    for r in f.rounds:
        per = mib(r.bytes_min) if r.bytes_min == r.bytes_max else \
            f"{mib(r.bytes_min)}-{mib(r.bytes_max)}"
        table.add_row(r.name, f"{r.verified}/{r.subscribers}",
                      f"{fmt_s(r.push_first_s)}/{fmt_s(r.push_last_s)}",
                      fmt_s(r.all_received_s), fmt_s(r.all_verified_s), fmt_s(r.verified_p50_s),
                      fmt_s(r.verified_p99_s), fmt_s(r.verified_max_s), per,
                      f"{r.total_bytes / MIB:.1f}", f"{r.mib_per_s:.1f}", cores(r.other_cores))
    rounds = "; ".join(
        f"{r.name} (v{r.version}): {r.trigger}"
        + (f", returned after {r.command_s:.2f} s" if r.command_s else "")
        + f"; artifact {mib(r.artifact_bytes)} MiB; registry sent {r.registry_sent / MIB:.1f} MiB"
        for r in f.rounds)
    table.caption = (f"{rounds}. Established TCP connections to the registry: {f.connections}; "
                     f"registry_sync_nodes_connected: {f.sessions:.0f}")
    return table


def swap_table(s: Swap) -> Table:
    table = Table(title=f"3. Edge under wrk (c={CONCURRENCY}): steady vs swap to v{s.new} by "
                        f"registry promote")
    for column in ("run", "requests", "req/s", "p50 ms", "p99 ms", "mean ms", "errors",
                   "answered by version", "others' cores"):
        table.add_column(column, justify="left" if column == "run" else "right")
    for r in (s.steady, s.swap):
        versions = ", ".join(f"v{v}: {n:.0f}" for v, n in sorted(r.by_version.items()))
        table.add_row(r.name, str(r.load.requests), f"{r.load.rps:.1f}", f"{r.load.p50_ms:.2f}",
                      f"{r.load.p99_ms:.2f}", f"{r.load.mean_ms:.2f}", str(r.load.errors),
                      versions, cores(r.other_cores))
    ratio = s.swap.load.p99_ms / s.steady.load.p99_ms if s.steady.load.p99_ms else math.nan
    p50 = s.swap.load.p50_ms / s.steady.load.p50_ms if s.steady.load.p50_ms else math.nan
    table.add_row("swap / steady", "", f"{s.swap.load.rps / s.steady.load.rps:.2f}x",
                  f"{p50:.2f}x", f"{ratio:.2f}x", "", "", "", "")
    table.caption = (f"setup: publish v{s.new} --canary nobody took {s.canary_publish_s:.1f} s; "
                     f"promote returned {s.promote_at_s:.2f} s into the "
                     f"{s.swap.load.seconds:.1f} s run; the edge served v{s.new} "
                     f"{fmt_s(s.switched_s)} s later, {fmt_s(s.switched_commit_s)} s after the "
                     f"commit (copy local bytes, install, load, warm, swap); swap inside the "
                     f"window: {'yes' if s.inside else 'NO'}")
    return table


def goals(rollouts: Sequence[Propagation], f: Fanout, s: Swap) -> list[tuple[str, bool]]:
    cold, warm = rollouts
    nodes = [n for p in rollouts for n in p.nodes]
    pushes = [x for n in nodes for x in (n.push_s, n.push_commit_s) if x is not None]
    measured = f.rounds[-1]
    worst_return = max((n.push_s for n in nodes if n.push_s is not None), default=math.nan)
    worst_commit = max((n.push_commit_s for n in nodes if n.push_commit_s is not None),
                       default=math.nan)
    return [
        (f"push < {GOAL_PUSH_S:.0f} s after publish, from its return (worst "
         f"{fmt_s(worst_return, 3)} s) and from its commit (worst {fmt_s(worst_commit, 3)} s)",
         len(pushes) == 2 * len(nodes) and max(pushes) < GOAL_PUSH_S),
        ("every node serving after each publish (seconds after the commit; cold: "
         + ", ".join(f"{n.tier} {fmt_s(n.serving_commit_s)}" for n in cold.nodes) + "; warm: "
         + ", ".join(f"{n.tier} {fmt_s(n.serving_commit_s)}" for n in warm.nodes) + ")",
         all(n.serving_s is not None for n in nodes)),
        ("cold: each node received its tier's artifacts once (received/size "
         + ", ".join(f"{n.tier} {n.received / n.artifact_bytes:.3f}" for n in cold.nodes) + ")",
         all(1.0 <= n.received / n.artifact_bytes <= 1.01 for n in cold.nodes)),
        ("warm: 0 bytes downloaded, the tier's artifacts reused from the local store",
         all(n.received == 0 and n.reused >= n.artifact_bytes for n in warm.nodes)),
        (f"fan-out: all {f.subscribers} verified within {GOAL_FANOUT_S:.0f} s of the rollback "
         f"returning ({measured.verified}/{f.subscribers} in "
         f"{fmt_s(measured.all_verified_s)} s)",
         measured.verified == f.subscribers and measured.all_verified_s <= GOAL_FANOUT_S),
        (f"swap: 0 failed requests (steady {s.steady.load.errors}, swap {s.swap.load.errors}) "
         f"and the edge switched v{s.old} -> v{s.new} inside the wrk window",
         s.steady.load.errors == 0 and s.swap.load.errors == 0 and s.inside),
    ]


def log_levels(path: Path) -> dict[str, int]:
    """Lines per level in a JSON log; lines that are not JSON count as ``other``."""
    levels: dict[str, int] = {}
    for line in path.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            entry = None
        level = str(entry.get("level")) if isinstance(entry, dict) else "other"
        levels[level] = levels.get(level, 0) + 1
    return levels


def log_line(logs: dict[str, dict[str, int]]) -> str:
    counts = []
    for name, levels in logs.items():
        other = f" (+{levels['other']} non-JSON)" if "other" in levels else ""
        counts.append(f"{name} {levels.get('warning', 0)}/{levels.get('error', 0)}{other}")
    bad = any(levels.get("error", 0) or levels.get("critical", 0) for levels in logs.values())
    colour = "red" if bad else "cyan"
    return f"  [{colour}]logs[/]  warnings/errors in the server logs: {', '.join(counts)}"


def report(info: dict[str, str], results: Results, show: Shown) -> None:
    rollouts, f, s = results.rollouts, results.fanout, results.swap
    show(machine_table(info))
    show(propagation_table(rollouts))
    show(fanout_table(f))
    for error in f.rounds[-1].errors[:5]:
        show(f"[red]{error}[/]")
    show(swap_table(s))
    show("[bold]Summary[/]")
    for text, ok in goals(rollouts, f, s):
        show(f"  {verdict(ok)}  {text}")
    ratio = s.swap.load.p99_ms / s.steady.load.p99_ms if s.steady.load.p99_ms else math.nan
    show(f"  [cyan]info[/]  edge p99 {s.steady.load.p99_ms:.2f} ms steady vs "
                  f"{s.swap.load.p99_ms:.2f} ms during the swap ({ratio:.2f}x); req/s "
                  f"{s.steady.load.rps:.1f} vs {s.swap.load.rps:.1f}")
    r = f.rounds[-1]
    show(f"  [cyan]info[/]  fan-out: the registry pushed to the {f.subscribers} "
                  f"subscribers over {fmt_s(r.push_last_s - r.push_first_s)} s (first to "
                  f"last push, from its log); {r.mib_per_s:.0f} MiB/s in aggregate")
    busy = max([p.other_cores for p in rollouts] + [x.other_cores for x in f.rounds]
               + [s.steady.other_cores, s.swap.other_cores])
    if busy > BUSY_OTHERS:
        show(f"  [red]note[/]  other processes used up to {busy:.2f} cores during a "
                      f"measurement (flagged in red): those figures are skewed")
    if results.logs:
        show(log_line(results.logs))


def write_json(path: Path, info: dict[str, str], results: Results) -> None:
    rollouts, f, s = results.rollouts, results.fanout, results.swap
    data = {"machine": info, "propagation": [asdict(p) for p in rollouts],
            "fanout": {**asdict(f), "rounds": [{**asdict(r), "mib_per_s": r.mib_per_s}
                                               for r in f.rounds]},
            "swap": {**asdict(s), "inside_window": s.inside}, "logs": results.logs,
            "goals": [{"goal": text, "met": ok} for text, ok in goals(rollouts, f, s)]}
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
