"""Serving benchmark: the edge and center servers under HTTP load vs the raw model in-process.

    .venv/bin/python -m bench.tiers [--model sentiment|digits] [--duration SECONDS] [--quick]
        [--server-threads N] [--markdown PATH]

``--model digits``: the image model instead of the demo text release (``bench.tiers_digits``).
How it measures: docs/benchmark-methods.md, "Serving tiers".
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from rich.table import Table

from bench.harness import (
    MODEL,
    TEXTS,
    Cpu,
    Plan,
    Release,
    bench_parser,
    console,
    ensure_wrk,
    parse_bench_args,
    pull,
    review_texts,
    server,
    wrk,
)
from bench.kit import cores, machine, write_bodies, wrk_version
from bench.markdown import Shown
from bench.tier_runs import (
    BATCHING_OFF,
    BATCHING_ON,
    CONCURRENCY,
    EDGE_FLAGS,
    SATURATION,
    WORKERS,
    Run,
    interference_note,
    measure,
    ms,
    rotating_batches,
    time_batches,
)

RAW_BATCHES = (1, 8, 32)
LIMIT = 32  # the model's limit: its best in-process batch, "32 by length"
# (configuration, concurrency) -> the share of the limit the edge server must keep
GOALS = {("one process", SATURATION): 0.80, (f"--workers {WORKERS}", 8): 0.80,
         (f"--workers {WORKERS}", SATURATION): 0.90}
GOAL_BATCHING = 3.0


# --- results ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Raw:
    tier: str
    batch: int
    rows_per_s: float
    ms_per_batch: float
    padded_len: float  # token positions computed per row
    other_cores: float
    # split by length into calls as the batcher does (serving.runtime.batcher.plan)
    grouped: bool = False
    calls: float = 1.0  # model calls per batch

    @property
    def us_per_token(self) -> float:
        return 1000 * self.ms_per_batch / (self.batch * self.padded_len)

    @property
    def label(self) -> str:
        return f"{self.batch} by length" if self.grouped else str(self.batch)


# --- raw model, in-process -------------------------------------------------------------------

def raw_runs(tier: str, release: Release, texts: Sequence[str], seconds: float,
             sizes: Sequence[int] = RAW_BATCHES) -> list[Raw]:
    """Each batch size padded to its longest row, then (from 8 rows) split by length into
    calls as the server's batcher does: the same texts, in the same batches."""
    from serving.model.text import load_tokenizer, pad, token_rows, unpadded
    from serving.runtime.batcher import plan

    predict = load_predict(tier, release)
    tokenizer = unpadded(load_tokenizer(release.tokenizer, release.max_length))
    runs = []
    for size in sizes:
        for grouped in (False, True) if size > 1 else (False,):
            batches = []
            for texts_ in rotating_batches(texts, size):
                rows, _ = token_rows(tokenizer, texts_)
                groups = plan([len(r) for r in rows]) if grouped else [list(range(size))]
                batches.append([pad([rows[i] for i in g]) for g in groups])
            start, wall = Cpu.now(), time.perf_counter()
            done, elapsed = time_batches(lambda calls: [predict(c) for c in calls], batches,
                                         seconds)
            other = Cpu.now().cores_since(start, time.perf_counter() - wall).other_cores
            padded = sum(e.input_ids.size for b in batches for e in b) / (len(batches) * size)
            calls = sum(len(b) for b in batches) / len(batches)
            runs.append(Raw(tier, size, done * size / elapsed, 1000 * elapsed / done, padded,
                            other, grouped, calls))
    return runs


def raw_single(raws: Sequence[Raw]) -> Raw:
    return next(r for r in raws if r.tier == "edge" and r.batch == 1)


def load_predict(tier: str, release: Release) -> Callable[[Any], object]:
    """The tier's model as a plain runtime runs it: onnxruntime with all graph optimizations
    and every other option its default (intra-op threads, spinning: what the peers use), the
    center's TorchScript runtime (threads=0: the runtime default)."""
    if tier == "edge":
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        session = ort.InferenceSession(str(release.model_file), options,
                                       providers=["CPUExecutionProvider"])
        return lambda encoded: session.run(None, encoded.feeds())
    import torch

    from center.runtime import TorchScriptRuntime

    runtime = TorchScriptRuntime(release.model_file, torch.device("cpu"), "fp32", 0,
                                 ["input_ids", "attention_mask"])
    return lambda encoded: runtime.predict(encoded.feeds())


# --- servers under wrk -----------------------------------------------------------------------

def check_answers(url: str, bodies: Path) -> None:
    """One real request: 200, and the edge answered it alone (nothing escalated)."""
    body = bodies.read_text().splitlines()[0]
    response = httpx.post(f"{url}/v2/models/{MODEL}/infer", content=body, timeout=30,
                          headers={"Content-Type": "application/json"})
    if response.status_code != 200:
        raise RuntimeError(f"{url}: {response.status_code} {response.text[:500]}")
    if response.json().get("parameters", {}).get("escalated", 0):
        raise RuntimeError(f"{url}: the edge escalated with threshold 0: {response.text[:500]}")


def server_runs(plan: Plan, tier: str, store: Path, batching: str,
                levels: Sequence[int], workers: int = 1) -> list[Run]:
    flags = (*(EDGE_FLAGS if tier == "edge" else ()), "--threads", str(plan.threads),
             *(BATCHING_ON if batching.startswith("on") else BATCHING_OFF),
             *(("--workers", str(workers)) if workers > 1 else ()))
    with server(tier, store, plan.logs, *flags) as handle:
        check_answers(handle.url, plan.bodies)
        wrk(plan, handle.url, SATURATION, plan.warmup)
        return [measure(plan, handle, tier, batching, c) for c in levels]


# --- report ----------------------------------------------------------------------------------

def machine_table(wrk: str, duration: int, threads: int) -> Table:
    table = Table(title="Machine", show_header=False)
    rows = machine(wrk=wrk_version(wrk),
                   load=f"wrk -t1, {duration} s per run, {TEXTS} test texts rotated, 1 per req",
                   server_flags=f"--threads {threads} (0 = runtime default); edge --cache-size 0")
    for key, value in rows.items():
        table.add_row(key, value)
    return table


def raw_table(raws: Sequence[Raw]) -> Table:
    table = Table(title="Raw model in-process (no HTTP): padded to the batch's longest row, or "
                        "split by length into calls (the batcher's plan)")
    for column in ("tier", "batch", "calls", "rows/s", "ms/batch", "ms/row", "padded len",
                   "µs/token", "others' cores"):
        table.add_column(column, justify="left" if column == "tier" else "right")
    for r in raws:
        table.add_row(r.tier, r.label, f"{r.calls:.1f}", f"{r.rows_per_s:.1f}",
                      ms(r.ms_per_batch), ms(r.ms_per_batch / r.batch), f"{r.padded_len:.1f}",
                      f"{r.us_per_token:.1f}", cores(r.other_cores))
    return table


def runs_table(title: str, runs: Sequence[Run]) -> Table:
    table = Table(title=title)
    columns = ("tier", "batch", "conc", "req/s", "p50 ms", "p99 ms", "errors", "rows/call",
               "tokens useful", "compute ms/row", "server cores", "others' cores")
    for column in columns:
        table.add_column(column, justify="left" if column in columns[:2] else "right")
    for r in runs:
        useful = r.server.useful_share
        table.add_row(r.tier, r.batching, str(r.concurrency), f"{r.load.rps:.1f}",
                      ms(r.load.p50_ms), ms(r.load.p99_ms), str(r.load.errors),
                      ms(r.server.mean_batch), "-" if math.isnan(useful) else f"{useful:.0%}",
                      ms(r.server.compute_ms_per_row),
                      f"{r.usage.server_cores:.2f}", cores(r.usage.other_cores))
    return table


def verdict(ratio: float, goal: float) -> str:
    return "[green]met[/]" if ratio >= goal else "[red]missed[/]"


def limit_of(raws: Sequence[Raw]) -> Raw:
    """The model's limit on this CPU: the edge's best in-process batch."""
    return max((r for r in raws if r.tier == "edge"), key=lambda r: r.rows_per_s)


def limit_now(release: Release, texts: Sequence[str], seconds: float) -> float:
    """The limit ("32 by length") measured again, next to a server's runs: the machine's speed
    drifts (by a quarter over minutes on a shared 2-core VM), so each share is taken against
    the limit measured around its own runs."""
    return next(r.rows_per_s for r in raw_runs("edge", release, texts, seconds, (LIMIT,))
                if r.grouped)


@dataclass(frozen=True)
class Measured:
    """One edge configuration's runs and the limit measured before and after them."""

    name: str
    runs: list[Run]
    limits: tuple[float, float]

    @property
    def limit(self) -> float:
        return sum(self.limits) / 2


def measured(name: str, release: Release, texts: Sequence[str], seconds: float,
             runs: Callable[[], list[Run]]) -> Measured:
    before = limit_now(release, texts, seconds)
    done = runs()
    return Measured(name, done, (before, limit_now(release, texts, seconds)))


def share_table(configs: Sequence[Measured], single: Raw) -> Table:
    """Every edge server row as a share of the model's limit measured around it; the goals
    (``GOALS``) judged where they apply."""
    table = Table(title=f"Edge server as a share of the model's limit (its best in-process "
                        f"batch, {LIMIT} by length, measured before and after each "
                        f"configuration's runs; same texts, same run)")
    for column in ("edge server", "conc", "req/s", "limit rows/s (before, after)",
                   "share of limit", "p50 ms", "p99 ms", "vs raw 1-row", "goal", "verdict"):
        table.add_column(column, justify="left" if column == "edge server" else "right")
    for config in configs:
        for r in config.runs:
            share = r.load.rps / config.limit
            goal = GOALS.get((config.name, r.concurrency))
            table.add_row(config.name, str(r.concurrency), f"{r.load.rps:.1f}",
                          f"{config.limit:.0f} ({config.limits[0]:.0f}, "
                          f"{config.limits[1]:.0f})", f"{share:.0%}", ms(r.load.p50_ms),
                          ms(r.load.p99_ms), f"{r.load.rps / single.rows_per_s:.2f}x",
                          "-" if goal is None else f">= {goal:.0%}",
                          "-" if goal is None else verdict(share, goal))
    return table


def share_line(configs: Sequence[Measured]) -> str:
    judged = [(c, r, GOALS[(c.name, r.concurrency)]) for c in configs for r in c.runs
              if (c.name, r.concurrency) in GOALS]
    met = [r.load.rps / c.limit >= goal for c, r, goal in judged]
    parts = [f"{c.name} c={r.concurrency}: {r.load.rps / c.limit:.0%} (goal {goal:.0%})"
             for c, r, goal in judged]
    return (f"Share of the limit: {'; '.join(parts)}: "
            f"{'[green]all met[/]' if all(met) else f'[red]{met.count(False)} missed[/]'}")


def batching_table(on: Sequence[Run], off: Sequence[Run]) -> Table:
    table = Table(title=f"Adaptive batching at concurrency {SATURATION}: on (32 rows, 5 ms) "
                        f"vs off (1 row)")
    for column in ("tier", "req/s on", "req/s off", "on/off", "p99 on ms", "p99 off ms",
                   f"goal >= {GOAL_BATCHING:.0f}x"):
        table.add_column(column, justify="left" if column == "tier" else "right")
    for a, b in zip(on, off, strict=True):
        ratio = a.load.rps / b.load.rps if b.load.rps else math.nan
        table.add_row(a.tier, f"{a.load.rps:.1f}", f"{b.load.rps:.1f}", f"{ratio:.2f}x",
                      ms(a.load.p99_ms), ms(b.load.p99_ms), verdict(ratio, GOAL_BATCHING))
    return table


def cost_table(edge: tuple[Run, Run], center: tuple[Run, Run], raws: Sequence[Raw]) -> Table:
    """``edge``/``center``: the concurrency-1 runs with batching (off, on)."""
    table = Table(title="Cost per request at concurrency 1: INT8 edge vs fp32 center")
    for column in ("measure", "edge INT8", "center fp32", "center/edge"):
        table.add_column(column, justify="left" if column == "measure" else "right")
    raw = {r.tier: r.ms_per_batch for r in raws if r.batch == 1}
    (e_off, e_on), (c_off, c_on) = edge, center
    rows = [("server p50 latency, batching off (ms)", e_off.load.p50_ms, c_off.load.p50_ms),
            ("server mean latency, batching off (ms)", e_off.load.mean_ms, c_off.load.mean_ms),
            ("server p50 latency, batching on: + up to 5 ms wait (ms)", e_on.load.p50_ms,
             c_on.load.p50_ms),
            ("server model compute per row, batching off (ms)",
             e_off.server.compute_ms_per_row, c_off.server.compute_ms_per_row),
            ("in-process model, one row (ms)", raw["edge"], raw["center"])]
    for name, e, c in rows:
        table.add_row(name, ms(e), ms(c), f"{c / e:.2f}x")
    return table


# --- main ------------------------------------------------------------------------------------

def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = bench_parser(__doc__, "3 s runs, 1 s raw timing and warm-up (a smoke run, ~1 min)")
    parser.add_argument("--server-threads", type=int, default=0,
                        help="--threads for both servers (default 0: the runtime's default)")
    parser.add_argument("--model", choices=(MODEL, "digits"), default=MODEL,
                        help=f"the text demo release ({MODEL}, from --registry; default) or the "
                             f"image one (digits: built when missing, published into a "
                             f"temporary registry)")
    return parse_bench_args(parser, argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.model != MODEL:
        from bench.tiers_digits import run

        run(args)
        return
    show = Shown(console)
    wrk_path = ensure_wrk()
    raw_seconds, warmup = (1.0, 1) if args.quick else (3.0, 2)
    show(machine_table(wrk_path, args.duration, args.server_threads))
    texts = review_texts(TEXTS)
    with tempfile.TemporaryDirectory(prefix="bench-serving-") as tmp:
        work = Path(tmp)
        edge, center = (pull(args.registry, t, work / t) for t in ("edge", "center"))
        bodies = write_bodies(texts, work / "bodies.jsonl", threshold=0)
        console.log(f"{MODEL}: edge version {edge.folder.name} ({edge.model_file.name}), "
                    f"center version {center.folder.name} ({center.model_file.name})")
        console.log("raw in-process timing")
        raws = [*raw_runs("edge", edge, texts, raw_seconds),
                *raw_runs("center", center, texts, raw_seconds)]
        plan = Plan(wrk_path, work, bodies, args.duration, warmup, args.server_threads)
        configs = [
            measured("one process", edge, texts, raw_seconds,
                     lambda: server_runs(plan, "edge", edge.store, "on", CONCURRENCY)),
            measured(f"--workers {WORKERS}", edge, texts, raw_seconds,
                     lambda: server_runs(plan, "edge", edge.store, f"on, {WORKERS} workers",
                                         CONCURRENCY, WORKERS))]
        edge_on, edge_workers = configs[0].runs, configs[1].runs
        edge_off = server_runs(plan, "edge", edge.store, "off", (1, SATURATION))
        center_on = server_runs(plan, "center", center.store, "on", (1, SATURATION))
        center_off = server_runs(plan, "center", center.store, "off", (1, SATURATION))
    show(raw_table(raws))
    show(runs_table("Edge server under wrk (batching on; one process, and --workers "
                    f"{WORKERS})", [*edge_on, *edge_workers]))
    show(share_table(configs, raw_single(raws)))
    show(share_line(configs))
    show(batching_table([edge_on[-1], center_on[-1]], [edge_off[-1], center_off[-1]]))
    show(cost_table((edge_off[0], edge_on[0]), (center_off[0], center_on[0]), raws))
    everything = [*edge_on, *edge_workers, *edge_off, *center_on, *center_off]
    show(runs_table("All server runs", everything))
    show(interference_note(raws, everything))
    if args.markdown:
        show.write(args.markdown, "Serving: edge and center under wrk vs the raw runtimes")


if __name__ == "__main__":
    main()
