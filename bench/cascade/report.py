"""The cascade benchmark's tables, verdict, markdown and JSON (``python -m bench.cascade``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.table import Table

from bench.cascade.curve import (
    GOAL_ESCALATION,
    GOAL_TOLERANCE,
    Curve,
    Point,
    Saved,
    goal_met,
    merge_points,
    points,
)
from bench.cascade.measure import (
    CALIBRATED,
    LIVE_CONCURRENCY,
    SELECTED,
    WRK_CONCURRENCY,
    Live,
    Offline,
)
from bench.harness import (
    MODEL,
    console,
)
from bench.kit import BUSY_OTHERS, cores

# --- report ----------------------------------------------------------------------------------

def pct(x: float) -> str:
    return f"{x:.2%}"


@dataclass(frozen=True)
class Report:
    version: int
    machine: dict[str, str]
    curve: Curve
    calibrated: Point
    manifest_calibration: dict[str, Any]
    lowest: Point
    stays: Point
    saved: Saved
    offline: Offline
    live: Live | None
    duration: int
    plot: Path | None

    @property
    def verdict(self) -> bool:
        return goal_met(self.calibrated, self.curve.center_accuracy)

    def rows(self) -> list[tuple[str, Point]]:
        """The curve points shown in the tables, by escalation, the calibrated one included."""
        named = [(f"{r:.0%} escalated", self.curve.at_escalation(r)) for r in SELECTED]
        named[0] = ("edge only", named[0][1])
        named[-1] = ("center only", named[-1][1])
        named += [(CALIBRATED, self.calibrated),
                  (f"first within {100 * GOAL_TOLERANCE:.1f} points", self.lowest)]
        return merge_points(named)


def verdict_line(r: Report, rich: bool = True) -> str:
    c, gap = r.calibrated, r.calibrated.gap_points(r.curve.center_accuracy)
    met = r.verdict
    word = ("[green]met[/]" if met else "[red]missed[/]") if rich else ("**met**" if met
                                                                          else "**missed**")
    why = []
    if gap > 100 * GOAL_TOLERANCE + 1e-9:
        why.append(f"{gap:.2f} points behind center-only")
    if c.escalation > GOAL_ESCALATION + 1e-12:
        why.append(f"escalates {c.escalation:.1%}")
    return (f"Goal: cascade within {100 * GOAL_TOLERANCE:.1f} points of center-only while "
            f"escalating <= {GOAL_ESCALATION:.0%}. At the calibrated threshold "
            f"{c.threshold:.4f} on the test split: {c.escalation:.1%} escalated, accuracy "
            f"{c.accuracy:.2%} vs center-only {r.curve.center_accuracy:.2%} "
            f"({points(-gap)}): {word}" + (f" ({'; '.join(why)})" if why else "") + ". "
            f"Lowest escalation within {100 * GOAL_TOLERANCE:.1f} points on test: "
            f"{r.lowest.escalation:.1%} (threshold {r.lowest.threshold:.4f}, accuracy "
            f"{r.lowest.accuracy:.2%}), "
            f"{'within' if r.lowest.escalation <= GOAL_ESCALATION + 1e-12 else 'beyond'} the "
            f"{GOAL_ESCALATION:.0%} goal; staying within from {r.stays.escalation:.1%} "
            f"(threshold {r.stays.threshold:.4f}).")


def saved_line(r: Report) -> str:
    s = r.saved
    return (f"Compute saved at the calibrated threshold: {s.center_calls_avoided:.1%} of "
            f"center calls avoided. In-process model compute per row at batch 32 (test split): "
            f"center fp32 {s.center_ms_per_row:.2f} ms, edge INT8 {s.edge_ms_per_row:.2f} ms "
            f"({s.center_ms_per_row / s.edge_ms_per_row:.1f}x); per request the cascade spends "
            f"{s.cascade_ms:.2f} ms (edge always + center for {s.escalation:.1%}) against "
            f"{s.center_ms_per_row:.2f} ms center-only: {s.center_ms_avoided:.2f} ms of center "
            f"compute avoided, {s.net_saved:.1%} less model compute in all.")


def curve_table(r: Report) -> Table:
    table = Table(title=f"{MODEL} v{r.version}: cascade on the test split ({r.curve.rows:,} "
                        f"rows; edge confidence < threshold -> center)")
    for column in ("operating point", "threshold", "escalated", "cascade accuracy",
                   "vs center-only"):
        table.add_column(column, justify="left" if column == "operating point" else "right")
    for name, p in r.rows():
        bold = CALIBRATED in name
        cells = [name, f"{p.threshold:.4f}", f"{p.escalation:.1%}", pct(p.accuracy),
                 points(-p.gap_points(r.curve.center_accuracy))]
        table.add_row(*([f"[bold]{c}[/]" for c in cells] if bold else cells))
    return table


def live_rows(r: Report, rich: bool) -> list[tuple[str, str, str, str]]:
    assert r.live is not None
    lv = r.live
    a, b = lv.cascade, lv.center
    x, y = lv.cascade_load, lv.center_load

    def ratio(p: float, q: float) -> str:
        return f"{p / q:.2f}x" if q else "-"

    return [
        (f"accuracy ({a.rows:,} test texts, 1 per request, {LIVE_CONCURRENCY} in flight)",
         pct(a.accuracy), pct(b.accuracy), points(100 * (a.accuracy - b.accuracy))),
        ("answered at the edge / escalated to the center",
         f"{1 - a.escalated:.1%} / {a.escalated:.1%}", "0% / 100%", "-"),
        ("same rows offline (batch 32): escalated, accuracy",
         f"{lv.offline_escalation:.1%}, {pct(lv.offline_accuracy)}", "-", "-"),
        ("failed requests", str(a.failed), str(b.failed), "-"),
        (f"wrk c={WRK_CONCURRENCY}, {r.duration} s: requests/s", f"{x.load.rps:.1f}",
         f"{y.load.rps:.1f}", ratio(x.load.rps, y.load.rps)),
        ("wrk p50 latency (ms)", f"{x.load.p50_ms:.1f}", f"{y.load.p50_ms:.1f}",
         ratio(x.load.p50_ms, y.load.p50_ms)),
        ("wrk p99 latency (ms)", f"{x.load.p99_ms:.1f}", f"{y.load.p99_ms:.1f}",
         ratio(x.load.p99_ms, y.load.p99_ms)),
        ("wrk errors", str(x.load.errors), str(y.load.errors), "-"),
        ("escalated / degraded under wrk", f"{x.escalated or 0:.1%} / {x.degraded or 0:.1%}",
         "-", "-"),
        ("others' cores (accuracy run; wrk run)",
         f"{cores(a.other_cores, rich)}; {cores(x.other_cores, rich)}",
         f"{cores(b.other_cores, rich)}; {cores(y.other_cores, rich)}", "-"),
    ]


def live_table(r: Report) -> Table:
    table = Table(title="Live: cascade (edge -> center) vs center only")
    for column in ("measure", "cascade", "center only", "cascade/center"):
        table.add_column(column, justify="left" if column == "measure" else "right")
    for row in live_rows(r, rich=True):
        table.add_row(*row)
    return table


def show(r: Report) -> None:
    m = r.machine
    console.print(f"[dim]{m['date']} · {m['cpu']} · {m['cores']} cores · onnxruntime/torch "
                  f"{m['onnxruntime / torch']} · commit {m['git commit']} · load average "
                  f"{m['load average']}[/]")
    console.print(curve_table(r))
    cal = r.manifest_calibration
    console.print(f"Calibrated by publish on the calibration split ({cal['rows']:,} rows): "
                  f"threshold {cal['threshold']:.4f}, escalation {cal['escalation_rate']:.1%}, "
                  f"cascade {cal['cascade_accuracy']:.2%} vs center {cal['center_accuracy']:.2%}"
                  f" (edge {cal['edge_accuracy']:.2%}).")
    console.print(verdict_line(r))
    console.print(saved_line(r))
    if r.offline.other_cores > BUSY_OTHERS:
        console.print(f"[red]Other processes used {r.offline.other_cores:.2f} cores during the "
                      f"in-process timing: the ms per row are skewed.[/]")
    if r.plot is not None:
        console.print(f"plot: {r.plot} ({r.plot.stat().st_size / 1024:.0f} KiB)")
    if r.live is not None:
        console.print(live_table(r))


def markdown(r: Report, image: str) -> str:
    m, cal = r.machine, r.manifest_calibration
    out = ["## The cascade: accuracy vs escalation", "",
           f"Measured by `python -m bench.cascade` on {m['date']}: {m['cpu']}, {m['cores']} "
           f"cores, onnxruntime / torch {m['onnxruntime / torch']}, commit {m['git commit']}, "
           f"load average {m['load average']} (a shared machine: timings move from run to "
           f"run).", "",
           f"Release `{MODEL}` v{r.version} from `var/registry`: the INT8 ONNX edge and the fp32 "
           f"TorchScript center over the {r.curve.rows:,}-row **test** split with the publish "
           f"pipeline's runners at batch 32; rows whose edge confidence (max softmax) is below "
           f"the threshold go to the center. The threshold was calibrated by `publish` on the "
           f"calibration split ({cal['rows']:,} rows: escalation {cal['escalation_rate']:.1%}, "
           f"cascade {cal['cascade_accuracy']:.2%} vs center {cal['center_accuracy']:.2%}).", "",
           "| operating point | threshold | escalated | cascade accuracy | vs center-only |",
           "|---|---|---|---|---|"]
    for name, p in r.rows():
        cells = [name, f"{p.threshold:.4f}", f"{p.escalation:.1%}", pct(p.accuracy),
                 points(-p.gap_points(r.curve.center_accuracy))]
        if CALIBRATED in name:
            cells = [f"**{c}**" for c in cells]
        out.append("| " + " | ".join(cells) + " |")
    out += ["", verdict_line(r, rich=False), "", saved_line(r), "",
            f"![Cascade accuracy vs share of requests escalated on the test split, the "
            f"calibrated threshold marked]({image})", ""]
    if r.live is not None:
        out += ["### Live: cascade through the edge vs the center alone", "",
                f"A real `center` and a real `edge` (`--center-url` that center, `--cache-size "
                f"0`, calibrated threshold) on loopback, the runtimes' default threads, both "
                f"on the same cores. Accuracy: the test texts through `tiered.demo`'s V2 client; "
                f"load: `wrk -t1 -c{WRK_CONCURRENCY}` with `bench/v2_infer.lua` for "
                f"{r.duration} s, the test texts rotated.", "",
                "| measure | cascade | center only | cascade/center |", "|---|---|---|---|"]
        out += ["| " + " | ".join(row) + " |" for row in live_rows(r, rich=False)]
        out.append("")
    return "\n".join(out)


def as_json(r: Report) -> dict[str, Any]:
    s = r.saved
    return {
        "model": MODEL, "version": r.version, "split": "test", "machine": r.machine,
        "goal": {"tolerance": GOAL_TOLERANCE, "max_escalation": GOAL_ESCALATION,
                 "met": r.verdict},
        "center_accuracy": r.curve.center_accuracy, "edge_accuracy": r.curve.edge_accuracy,
        "rows": r.curve.rows,
        "calibrated": {**asdict(r.calibrated),
                       "gap_points": r.calibrated.gap_points(r.curve.center_accuracy)},
        "manifest_calibration": {k: v for k, v in r.manifest_calibration.items()
                                 if k != "curve"},
        "lowest_within": asdict(r.lowest), "stays_within": asdict(r.stays),
        "selected": [{"name": name, **asdict(p)} for name, p in r.rows()],
        "compute": {"center_ms_per_row": s.center_ms_per_row,
                    "edge_ms_per_row": s.edge_ms_per_row,
                    "center_calls_avoided": s.center_calls_avoided,
                    "center_ms_avoided_per_request": s.center_ms_avoided,
                    "cascade_ms_per_request": s.cascade_ms, "net_saved": s.net_saved,
                    "other_cores": r.offline.other_cores},
        "curve": {"threshold": [round(float(v), 6) for v in r.curve.thresholds],
                  "escalation": [round(float(v), 6) for v in r.curve.escalation],
                  "accuracy": [round(float(v), 6) for v in r.curve.accuracy]},
        "live": None if r.live is None else {
            "cascade": {**asdict(r.live.cascade), "escalated": r.live.cascade.escalated},
            "center": asdict(r.live.center),
            "cascade_load": {**asdict(r.live.cascade_load), "rps": r.live.cascade_load.load.rps},
            "center_load": {**asdict(r.live.center_load), "rps": r.live.center_load.load.rps},
            "offline_escalation": r.live.offline_escalation,
            "offline_accuracy": r.live.offline_accuracy,
            "wrk": {"concurrency": WRK_CONCURRENCY, "seconds": r.duration},
        },
    }
