"""The peer comparison's table, markdown and JSON (``python -m bench.peers``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from rich.table import Table

from bench.harness import (
    MODEL,
    TEXTS,
)
from bench.kit import BUSY_OTHERS, cores
from bench.peers.measure import (
    CHECK_PARALLEL,
    GOAL_FROM,
    GOAL_RATIO,
    MULTI_CONCURRENCY,
    MULTI_ROWS,
    WARMUP_CONCURRENCY,
    Agreement,
    Outcome,
    Verdict,
)
from bench.tiers import GOALS, Raw

# --- report ----------------------------------------------------------------------------------

def fmt(value: float, digits: int = 1) -> str:
    return "-" if math.isnan(value) else f"{value:.{digits}f}"


def results_table(outcomes: Sequence[Outcome], limit: Raw | None = None) -> Table:
    table = Table(title="Same load, same model: req/s, latency, errors, memory (first row: the "
                        "model's own limit, in-process)")
    columns = ("server", "conc", "rows/req", "req/s", "rows/s", "p50 ms", "p99 ms", "errors",
               "peak RSS MiB", "server cores", "others' cores")
    for column in columns:
        table.add_column(column, justify="left" if column == "server" else "right")
    if limit is not None:
        table.add_row(limit_label(limit), "-", str(limit.batch), "-", fmt(limit.rows_per_s),
                      "-", "-", "-", "-", "-", cores(limit.other_cores))
    for o in outcomes:
        for r in o.results:
            others = r.usage.other_cores
            table.add_row(o.spec.label, str(r.concurrency), str(r.rows), fmt(r.load.rps),
                          fmt(r.rows_per_s),
                          fmt(r.load.p50_ms, 2), fmt(r.load.p99_ms, 2), str(r.load.errors),
                          fmt(r.peak_rss_mib, 0), f"{r.usage.server_cores:.2f}",
                          cores(others))
    return table


def limit_label(limit: Raw) -> str:
    return f"the model's limit: onnxruntime in-process, batch {limit.label}"


@dataclass(frozen=True)
class Ratio:
    """One goal's measure at one concurrency: Tiered's req/s over a reference's."""

    what: str
    concurrency: int
    tiered_rps: float
    reference: str
    reference_rps: float
    tiered_p99_ms: float
    reference_p99_ms: float  # nan: the reference has none (the raw runtime)
    goal: float  # nan: shown, not judged

    @property
    def ratio(self) -> float:
        return self.tiered_rps / self.reference_rps if self.reference_rps else math.inf

    @property
    def verdict(self) -> str:
        if math.isnan(self.goal):
            return "-"
        p99_ok = math.isnan(self.reference_p99_ms) or self.tiered_p99_ms <= self.reference_p99_ms
        return "met" if self.ratio >= self.goal and p99_ok else "missed"


def ratios(outcomes: Sequence[Outcome], results: Sequence[Verdict],
           limit: Raw | None, limit_goals: bool = True) -> list[Ratio]:
    """The goals side by side: one Tiered process and ``--workers 2`` as a share of the model's
    limit (its best in-process batch; judged where ``bench.tiers.GOALS`` sets a goal, shown
    only without ``limit_goals``: those goals were set for the text demo model), Tiered vs the
    best peer with as many serving processes (at every concurrency >= GOAL_FROM, p99 no
    higher)."""
    labels = {o.spec.key: o.spec.label for o in outcomes}
    names = {1: "one process", 2: "--workers 2"}
    out = []
    if limit is not None:
        for o in outcomes:
            if o.spec.kind != "tiered":
                continue
            for r in o.results:
                if r.rows != 1 or r.concurrency < GOAL_FROM:
                    continue
                goal = GOALS.get((names.get(o.spec.serving, ""), r.concurrency), math.nan) \
                    if limit_goals else math.nan
                out.append(Ratio(f"{o.spec.label} vs the model's limit", r.concurrency,
                                 r.load.rps, f"onnxruntime in-process, batch {limit.label}",
                                 limit.rows_per_s, r.load.p99_ms, math.nan, goal))
    for result in results:
        for v in result.levels:
            out.append(Ratio(f"{labels[result.tiered]} vs best peer, same processes",
                             v.concurrency, v.tiered_rps, labels[v.best_peer], v.peer_rps,
                             v.tiered_p99_ms, v.peer_p99_ms, GOAL_RATIO))
    return out


def ratios_table(found: Sequence[Ratio]) -> Table:
    table = Table(title="Goals, one run: Tiered vs the model's limit (a share: ratio < 1) and "
                        "vs the best peer")
    for column in ("measure", "conc", "Tiered req/s", "reference", "ref req/s", "ratio",
                   "Tiered p99 ms", "ref p99 ms", "goal", "verdict"):
        table.add_column(column, justify="left" if column in ("measure", "reference")
                         else "right")
    for r in found:
        table.add_row(r.what, str(r.concurrency), fmt(r.tiered_rps), r.reference,
                      fmt(r.reference_rps), f"{r.ratio:.2f}x", fmt(r.tiered_p99_ms, 2),
                      fmt(r.reference_p99_ms, 2), goal_text(r.goal), r.verdict)
    return table


def goal_text(goal: float) -> str:
    return "-" if math.isnan(goal) else f">= {goal:.0%}" if goal < 1 else f">= {goal:g}x"


def ratios_markdown(found: Sequence[Ratio]) -> list[str]:
    lines = ["| measure | concurrency | Tiered req/s | reference | reference req/s | ratio | "
             "Tiered p99 ms | reference p99 ms | goal | verdict |",
             "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in found:
        lines.append(f"| {r.what} | {r.concurrency} | {fmt(r.tiered_rps)} | {r.reference} | "
                     f"{fmt(r.reference_rps)} | {r.ratio:.2f}x | {fmt(r.tiered_p99_ms, 2)} | "
                     f"{fmt(r.reference_p99_ms, 2)} | {goal_text(r.goal)} | "
                     f"{'**' + r.verdict + '**' if r.verdict != '-' else '-'} |")
    return [*lines, ""]


@dataclass(frozen=True)
class Context:
    """Everything the report says besides the numbers."""

    date: str
    machine: str
    commit: str
    duration: int
    warmup: int
    wrk: str
    release: str
    settings: dict[str, str]
    versions: dict[str, dict[str, str]]
    venvs: dict[str, str]
    alone: dict[str, Agreement]  # answers vs the Tiered edge's, one request in flight
    agreement: dict[str, Agreement]  # CHECK_PARALLEL requests in flight
    # the model's own words (empty: the text demo release's)
    heading: str = "Tiered edge vs MLServer and KServe"
    load: str = ""  # the "Load:" item
    model: str = ""  # the "Model:" item
    unit: str = "texts"  # what one row is
    limit: Raw | None = None  # the model's best in-process batch on this CPU


def markdown(context: Context, outcomes: Sequence[Outcome], results: Sequence[Verdict],
             found: Sequence[Ratio] = ()) -> str:
    labels = {o.spec.key: o.spec.label for o in outcomes}
    lines = [f"## {context.heading}", "",
             f"Measured {context.date} on {context.machine}, git {context.commit}; "
             f"{context.wrk}, {context.duration} s per run after a {context.warmup} s warm-up "
             f"at concurrency {WARMUP_CONCURRENCY}, load generator and server on the same "
             f"machine.", "", "Settings:", ""]
    lines += [f"- **{labels.get(k, k)}**: {v}" for k, v in context.settings.items()]
    lines += [context.load or
              f"- Load: {TEXTS} test-split review texts rotated, one per request, the same V2 "
              f"JSON bodies for every server (BYTES input `text` of shape [1], "
              f"`\"parameters\": {{\"threshold\": 0}}`, which the peers ignore); then "
              f"{MULTI_ROWS} texts per request (shape [{MULTI_ROWS}]) at concurrency "
              f"{MULTI_CONCURRENCY}.",
              context.model or
              f"- Model: demo release `{MODEL}` {context.release}, INT8 ONNX, onnxruntime CPU "
              f"with the edge's session options (graph optimizations all, default intra-op "
              f"threads) in every server."]
    def agreeing(found: dict[str, Agreement]) -> str:
        return "; ".join(f"{labels[k]} {a.same_label}/{a.rows} same label, max |Δp| "
                         f"{a.max_abs_diff:.2g}" for k, a in found.items())

    alone = next(iter(context.alone.values())).rows if context.alone else 0
    rows = next(iter(context.agreement.values())).rows if context.agreement else 0
    unit = context.unit
    lines += [f"- Answers vs the Tiered edge's: the first {alone} {unit} one request at a time "
              f"(a batch of 1 everywhere): {agreeing(context.alone)}. The first {rows} {unit} "
              f"with {CHECK_PARALLEL} requests in flight (batching servers batch them, and "
              f"dynamic INT8 quantization depends on the batch-mates): "
              f"{agreeing(context.agreement)}.", "",
              "| server | concurrency | rows/req | req/s | rows/s | p50 ms | p99 ms | errors | "
              "peak RSS MiB | others' cores |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    if context.limit is not None:
        lines.append(f"| {limit_label(context.limit)} | - | {context.limit.batch} | - | "
                     f"{fmt(context.limit.rows_per_s)} | - | - | - | - | "
                     f"{cores(context.limit.other_cores, False)} |")
    for o in outcomes:
        for r in o.results:
            lines.append(f"| {o.spec.label} | {r.concurrency} | {r.rows} | {fmt(r.load.rps)} "
                         f"| {fmt(r.rows_per_s)} | "
                         f"{fmt(r.load.p50_ms, 2)} | {fmt(r.load.p99_ms, 2)} | {r.load.errors} "
                         f"| {fmt(r.peak_rss_mib, 0)} | {cores(r.usage.other_cores, False)} |")
    busy = max((r.usage.other_cores for o in outcomes for r in o.results), default=0.0)
    lines.append("")
    if found:
        lines += [f"Goals, measured in this run (the model's limit: the same {unit} through "
                  "onnxruntime in-process in its best batch, before the servers started):",
                  "", *ratios_markdown(found)]
    for result in results:
        lines += [result.line(labels), ""]
    lines += [f"{line}\n" for line in multi_lines(outcomes, unit)]
    if busy > BUSY_OTHERS:
        lines += [f"Other processes used up to {busy:.2f} cores during a run: the machine was "
                  f"shared and the rows marked (busy) are skewed.", ""]
    return "\n".join(lines)


def multi_lines(outcomes: Sequence[Outcome], unit: str = "texts") -> list[str]:
    """Rows/s with MULTI_ROWS rows (``unit``) per request: each Tiered configuration's against
    the best peer's."""
    runs = {o.spec.key: r for o in outcomes for r in o.results if r.rows == MULTI_ROWS}
    labels = {o.spec.key: o.spec.label for o in outcomes}
    peers = [r for o in outcomes if o.spec.kind != "tiered" and o.spec.key in runs
             for r in [runs[o.spec.key]]]
    if not peers:
        return []
    best = max(peers, key=lambda r: r.rows_per_s)
    return [f"{MULTI_ROWS} {unit} per request, {MULTI_CONCURRENCY} requests in flight: "
            f"{labels[o.spec.key]} {mine.rows_per_s:.0f} rows/s (p99 {mine.load.p99_ms:.1f} "
            f"ms) vs {labels[best.server]} {best.rows_per_s:.0f} rows/s (p99 "
            f"{best.load.p99_ms:.1f} ms): {mine.rows_per_s / best.rows_per_s:.2f}x"
            for o in outcomes if o.spec.kind == "tiered" and o.spec.key in runs
            for mine in [runs[o.spec.key]]]


def as_json(context: Context, outcomes: Sequence[Outcome],
            results: Sequence[Verdict]) -> dict[str, Any]:
    return {
        "context": {**asdict(context),
                    **{name: {k: {**asdict(a), "share": a.share} for k, a in found.items()}
                       for name, found in (("alone", context.alone),
                                           ("agreement", context.agreement))}},
        "servers": [{"key": o.spec.key, "label": o.spec.label, "kind": o.spec.kind,
                     "processes": o.spec.processes,
                     **({"parallel_workers": o.spec.workers} if o.spec.kind == "mlserver"
                        else {})} for o in outcomes],
        "runs": [{"server": r.server, "concurrency": r.concurrency, "rows": r.rows,
                  "rps": r.load.rps, "rows_per_s": r.rows_per_s,
                  **asdict(r.load), "peak_rss_mib": r.peak_rss_mib, **asdict(r.usage)}
                 for o in outcomes for r in o.results],
        "goals": [{"tiered": result.tiered, "ratio": GOAL_RATIO,
                   "from_concurrency": GOAL_FROM, "met": result.met,
                   "assessed": result.assessed, "tiered_errors": result.tiered_errors,
                   "levels": [{**asdict(v), "ratio": v.ratio, "met": v.met}
                              for v in result.levels]} for result in results],
    }
