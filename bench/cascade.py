"""Cascade report: accuracy vs escalation on the test split, and the live cascade vs the center.

Run from the repository root (on a quiet 2-core machine about 75 s by default, 35 s with
``--quick``; the in-process pass over the test split takes 4-6x longer when other processes
load the cores)::

    .venv/bin/python -m bench.cascade [--json PATH] [--markdown PATH] [--plot PATH]
                                      [--duration SECONDS] [--quick]

Everything is measured on the production version of ``sentiment`` in ``var/registry`` (the demo
release), its edge and center artifacts pulled with ``registry pull`` into temporary stores,
and on the demo's **test** split (``examples.sentiment.data``, seed 7, 2,000 rows: not the
calibration split ``publish`` chose the threshold on).

1. **The curve.** The INT8 ONNX edge and the fp32 TorchScript center run over the 2,000 test
   texts with the publish pipeline's own tokenization, batching (32) and runners
   (``registry.validate``), so the confidences are those ``publish`` calibrated with (dynamic
   INT8 quantization scales activations per batch: other batching moves them slightly). Every
   distinct operating point (``registry.calibrate.cascade_curve``: escalate the k least
   confident rows) gives escalation rate and cascade accuracy; the release's calibrated
   threshold (manifest ``calibration.threshold``) is placed on it with the edge's own rule
   (escalate when max softmax < threshold). **Compute saved** at that point: center calls
   avoided (1 - escalation), and in model compute time from the in-process ms per row of both
   models at batch 32 (measured on the same pass; every request pays the edge, escalated ones
   the center too). The goal, reported and never asserted: cascade accuracy within 0.5 points
   of center-only while escalating <= 35% of requests.
2. **The plot** (``--plot``, default ``docs/cascade.png``, matplotlib's Agg backend): accuracy
   vs share of requests escalated, the calibrated point annotated, center-only and edge-only
   as dashed lines, the 0.5-point band under center-only shaded, the 35% goal as a vertical
   line, and the calibration split's curve from the manifest for comparison.
3. **Live.** A real ``center`` and a real ``edge`` (``--center-url`` that center,
   ``--cache-size 0``, the release's calibrated threshold) on free loopback ports
   (``tiered.processes.start_tier``). (a) The test texts one per V2 request (``tiered.demo``'s
   client, concurrency 8) through the edge (the cascade) and straight to the center (center
   only): accuracy and who answered. (b) ``wrk`` (``bench/v2_infer.lua``, one thread,
   concurrency 32, ``--duration`` seconds after a short warm-up, the test texts rotated, no
   threshold in the bodies) against each: requests/s, p50, p99, and for the cascade the share
   the edge escalated under load (its ``edge_rows_total`` by tier). Both servers run the whole
   time with the runtimes' default threads, so in the cascade edge and center share the cores
   (as ``tiered up`` runs them); the center-only run leaves the edge idle.

``--quick``: 300 rows for the live accuracy, 3 s wrk runs (the curve always uses all 2,000
rows). ``--markdown PATH`` writes a fragment for the docs (``## The cascade: accuracy vs
escalation``), ``--json PATH`` the raw numbers. Each figure comes with the cores other
processes used meanwhile (a shared machine skews timings; above 0.1 they are flagged). Servers
are stopped by PID in a ``finally`` (also on Ctrl-C or SIGTERM); stores, bodies and server logs
live in a temporary directory. wrk is installed with apt-get when missing (``bench/tiers.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
import numpy as np
from rich.console import Console
from rich.table import Table

from bench.harness import (
    CLOCK_TICKS,
    Load,
    Plan,
    Release,
    bench_parser,
    ensure_wrk,
    parse_bench_args,
    process_cpu_s,
    wrk,
)
from bench.kit import BUSY_OTHERS, cores, machine, write_bodies
from tiered.processes import TierProcess, start_tier

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BIN = Path(sys.executable).parent
MODEL = "sentiment"
SPLIT_SEED = 7
GOAL_TOLERANCE = 0.005  # accuracy (fraction) the cascade may lose against center-only
GOAL_ESCALATION = 0.35  # most share of requests the cascade may send to the center
SELECTED = (0.0, 0.10, 0.20, 0.35, 0.50, 1.0)  # escalation rates shown in the tables
LIVE_CONCURRENCY = 8  # the V2 client's requests in flight (as `tiered demo`)
WRK_CONCURRENCY = 32
QUICK_ROWS = 300
CALIBRATED = "calibrated threshold"
EDGE_FLAGS = ("--cache-size", "0")

console = Console(width=None if sys.stdout.isatty() else 132)


# --- the curve (pure) ------------------------------------------------------------------------

@dataclass(frozen=True)
class Point:
    """One operating point: escalate rows whose edge confidence is below ``threshold``."""

    threshold: float
    escalation: float
    accuracy: float

    def gap_points(self, center_accuracy: float) -> float:
        """Accuracy points behind center-only (positive: the cascade is worse)."""
        return 100 * (center_accuracy - self.accuracy)


@dataclass(frozen=True)
class Curve:
    """Every distinct operating point of the cascade on one labelled split, by escalation."""

    thresholds: np.ndarray
    escalation: np.ndarray
    accuracy: np.ndarray
    center_accuracy: float
    edge_accuracy: float
    rows: int

    @classmethod
    def of(cls, center_logits: np.ndarray, edge_logits: np.ndarray,
           labels: np.ndarray) -> Curve:
        from registry.calibrate import cascade_curve

        thresholds, rates, accuracy = cascade_curve(center_logits, edge_logits, labels)
        return cls(thresholds, rates, accuracy,
                   float((center_logits.argmax(1) == labels).mean()),
                   float((edge_logits.argmax(1) == labels).mean()), len(labels))

    def point(self, i: int) -> Point:
        return Point(float(self.thresholds[i]), float(self.escalation[i]),
                     float(self.accuracy[i]))

    def at_escalation(self, rate: float) -> Point:
        """The first operating point that escalates at least ``rate`` of the rows."""
        i = int(np.searchsorted(self.escalation, rate - 1e-12))
        return self.point(min(i, len(self.escalation) - 1))

    def _within(self, tolerance: float) -> np.ndarray:
        return np.asarray(self.accuracy >= self.center_accuracy - tolerance - 1e-12)

    def lowest_within(self, tolerance: float) -> Point:
        """The lowest escalation whose cascade accuracy is within ``tolerance`` of center-only
        (escalating everything is center-only, so there always is one)."""
        return self.point(int(np.argmax(self._within(tolerance))))

    def stays_within(self, tolerance: float) -> Point:
        """The lowest escalation from which the cascade stays within ``tolerance`` at every
        higher rate (``publish``'s rule without the bootstrap)."""
        within = self._within(tolerance)
        return self.point(int(np.argmax(np.logical_and.accumulate(within[::-1])[::-1])))


def merge_points(named: Sequence[tuple[str, Point]]) -> list[tuple[str, Point]]:
    """Named points by escalation; names of the same operating point joined with " = "."""
    merged: dict[tuple[float, float], tuple[list[str], Point]] = {}
    for name, point in named:
        names, _ = merged.setdefault((point.escalation, point.accuracy), ([], point))
        if name not in names:
            names.append(name)
    return [(" = ".join(names), point) for names, point in
            sorted(merged.values(), key=lambda item: item[1].escalation)]


def points(value: float) -> str:
    """Signed accuracy points, never "-0.00"."""
    return f"{round(value, 2) + 0.0:+.2f} pts"


def goal_met(point: Point, center_accuracy: float, tolerance: float = GOAL_TOLERANCE,
             max_escalation: float = GOAL_ESCALATION) -> bool:
    """Within ``tolerance`` (a fraction) of center-only while escalating <= ``max_escalation``."""
    return (point.accuracy >= center_accuracy - tolerance - 1e-12
            and point.escalation <= max_escalation + 1e-12)


@dataclass(frozen=True)
class Saved:
    """What the cascade saves against center-only, per request (escalation is a share)."""

    escalation: float
    center_ms_per_row: float
    edge_ms_per_row: float

    @property
    def center_calls_avoided(self) -> float:
        return 1 - self.escalation

    @property
    def center_ms_avoided(self) -> float:
        """Center compute not spent, per request."""
        return self.center_calls_avoided * self.center_ms_per_row

    @property
    def cascade_ms(self) -> float:
        """Model compute per request in the cascade: the edge always, the center when unsure."""
        return self.edge_ms_per_row + self.escalation * self.center_ms_per_row

    @property
    def net_saved(self) -> float:
        """Share of center-only model compute the cascade does not spend (edge included)."""
        return 1 - self.cascade_ms / self.center_ms_per_row


# --- setup -----------------------------------------------------------------------------------

def registry_cmd(home: Path, *args: str) -> str:
    result = subprocess.run([str(BIN / "registry"), "--home", str(home), *args],
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"registry {' '.join(args)} failed ({result.returncode}): "
                         f"{result.stderr.strip()}")
    return result.stdout


def production(home: Path) -> dict[str, Any]:
    """``registry show sentiment@production --json``: version and manifest."""
    shown: dict[str, Any] = json.loads(registry_cmd(home, "show", f"{MODEL}@production",
                                                    "--json"))
    if shown["manifest"]["calibration"].get("source") != "labelled":
        raise SystemExit(f"{MODEL} v{shown['version']} has no labelled calibration: nothing "
                         f"to compare the curve with")
    return shown


def pull(home: Path, version: int, tier: str, store: Path) -> Release:
    registry_cmd(home, "pull", f"{MODEL}@{version}", "--tier", tier, "--store", str(store))
    folder = store / MODEL / (store / MODEL / "CURRENT").read_text().strip()
    manifest = json.loads((folder / "release.json").read_text())
    return Release(store, folder, folder / manifest[tier]["file"],
                   folder / manifest["preprocessing"]["tokenizer"],
                   int(manifest["preprocessing"]["max_length"]))


def test_split() -> tuple[list[str], np.ndarray]:
    from examples.sentiment import data

    split = data.split(data.load_reviews(), seed=SPLIT_SEED).test
    return list(split.texts), np.asarray(split.labels)


# --- CPU accounting ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Meter:
    """CPU seconds: the machine's busy time, this process and its reaped children, servers."""

    wall: float
    machine_s: float
    own_s: float
    servers_s: float

    @classmethod
    def now(cls, pids: Sequence[int] = ()) -> Meter:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]
        ticks = [int(f) for f in fields]
        busy = (sum(ticks) - ticks[3] - ticks[4]) / CLOCK_TICKS  # minus idle and iowait
        t = os.times()
        own = t.user + t.system + t.children_user + t.children_system
        return cls(time.perf_counter(), busy, own, sum(process_cpu_s(p) for p in pids))

    def others_since(self, start: Meter) -> float:
        """Cores used by processes other than this one, its children and the servers."""
        other = ((self.machine_s - start.machine_s) - (self.own_s - start.own_s)
                 - (self.servers_s - start.servers_s))
        return max(0.0, other) / max(self.wall - start.wall, 1e-9)


# --- part 1: the curve on the test split -----------------------------------------------------

@dataclass(frozen=True)
class Offline:
    center: np.ndarray  # logits [rows, labels]
    edge: np.ndarray
    center_ms_per_row: float
    edge_ms_per_row: float
    other_cores: float


def offline_logits(edge: Release, center: Release, texts: list[str]) -> Offline:
    """Both models over the texts with ``registry publish``'s runners and batch size."""
    from registry.validate import (
        BATCH,
        Inputs,
        load_torchscript,
        onnx_session,
        run_onnx,
        run_torchscript,
        text_inputs,
    )

    inputs = text_inputs(center.tokenizer, center.max_length, texts)
    warm = Inputs(inputs.batches[:1], inputs.kind)
    module = load_torchscript(center.model_file, "center")
    session = onnx_session(edge.model_file, "edge")

    def timed(run: Callable[[Any], np.ndarray]) -> tuple[np.ndarray, float]:
        run(warm)
        started = time.perf_counter()
        out = run(inputs)
        return out, 1000 * (time.perf_counter() - started) / len(texts)

    meter = Meter.now()
    center_logits, center_ms = timed(lambda i: run_torchscript(module, i, "center"))
    edge_logits, edge_ms = timed(lambda i: run_onnx(session, i, "edge"))
    others = Meter.now().others_since(meter)
    console.log(f"test split: {len(texts)} rows at batch {BATCH}: center fp32 "
                f"{center_ms:.2f} ms/row, edge INT8 {edge_ms:.2f} ms/row (others used "
                f"{others:.2f} cores)")
    return Offline(center_logits, edge_logits, center_ms, edge_ms, others)


def calibrated_on(offline: Offline, labels: np.ndarray, threshold: float) -> Point:
    """The release's threshold on these rows, with the edge's rule (confidence < threshold)."""
    from examples.sentiment.report import cascade_at

    rate, accuracy = cascade_at(offline.center, offline.edge, labels, threshold)
    return Point(threshold, rate, accuracy)


# --- part 2: the plot ------------------------------------------------------------------------

def plot(path: Path, curve: Curve, calibrated: Point, lowest: Point,
         manifest_curve: Sequence[Point], title: str) -> int:
    """Write the PNG (1000 px wide); returns its size in bytes."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 5.6), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    center, edge = 100 * curve.center_accuracy, 100 * curve.edge_accuracy
    tol = 100 * GOAL_TOLERANCE
    ax.axhspan(center - tol, center, color="tab:green", alpha=0.12, lw=0,
               label=f"within {tol:.1f} points of center-only")
    ax.axhline(center, color="tab:green", ls="--", lw=1.4,
               label=f"center only (fp32): {center:.2f}%")
    ax.axhline(edge, color="tab:red", ls="--", lw=1.4, label=f"edge only (INT8): {edge:.2f}%")
    ax.axvline(100 * GOAL_ESCALATION, color="0.35", ls="-.", lw=1.2,
               label=f"goal: escalate <= {GOAL_ESCALATION:.0%}")
    if manifest_curve:
        ax.plot([100 * p.escalation for p in manifest_curve],
                [100 * p.accuracy for p in manifest_curve], color="0.6", lw=1, ls=":",
                label="calibration split (manifest curve, for comparison)")
    ax.plot(100 * curve.escalation, 100 * curve.accuracy, color="tab:blue", lw=1.6,
            label=f"cascade on the test split ({curve.rows:,} rows)")
    if abs(lowest.escalation - calibrated.escalation) > 1e-9:
        ax.plot([100 * lowest.escalation], [100 * lowest.accuracy], "o", mfc="white",
                mec="tab:blue", ms=7, zorder=5,
                label=f"first point within {tol:.1f} points on test: "
                      f"{lowest.escalation:.1%} escalated")
    x, y = 100 * calibrated.escalation, 100 * calibrated.accuracy
    ax.plot([x], [y], "o", color="black", ms=8, zorder=6)
    ax.annotate(f"calibrated threshold {calibrated.threshold:.3f}\n"
                f"escalates {calibrated.escalation:.1%} of test rows\n"
                f"accuracy {y:.2f}% ({points(-calibrated.gap_points(curve.center_accuracy))})",
                xy=(x, y), xytext=(200, -14), textcoords="offset points", va="top",
                fontsize=10, arrowprops={"arrowstyle": "->", "color": "black"},
                bbox={"boxstyle": "round,pad=0.3", "fc": "white", "ec": "0.6"})
    values = [*(100 * curve.accuracy), *(100 * p.accuracy for p in manifest_curve)]
    ax.set_ylim(min(values) - 0.4, max(values) + 0.4)
    ax.set_xlim(0, 100)
    ax.set_xlabel("share of requests escalated to the center (%)", fontsize=11)
    ax.set_ylabel("accuracy (%)", fontsize=11)
    ax.set_title(title, fontsize=12)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=9, framealpha=0.9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=100, pil_kwargs={"optimize": True})
    return path.stat().st_size


# --- part 3: live cascade vs center only -----------------------------------------------------

def child_pids() -> set[int]:
    me, found = os.getpid(), set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == me:
                found.add(int(entry.name))
    return found


@contextmanager
def tier(name: str, store: Path, logs: Path, *flags: str) -> Iterator[TierProcess]:
    """A running ``center``/``edge`` on a free loopback port, stopped by PID afterwards.

    ``start_tier`` stops what it started when the server is not ready in time, but not when
    interrupted (Ctrl-C) while waiting: then the new child is found by its parent PID (this
    process) and stopped here."""
    before = child_pids()
    try:
        process = start_tier(name, store, logs, *flags, timeout=120)
    except BaseException:
        for pid in child_pids() - before:
            stop_pid(pid)
        raise
    try:
        yield process
    finally:
        process.stop()


def stop_pid(pid: int) -> None:
    """SIGTERM one child, SIGKILL after 20 s; reaped either way."""
    try:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return
            time.sleep(0.1)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


def check_cascade(edge_url: str) -> None:
    """One request with threshold 1 (escalate everything) must come back from the center."""
    body = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES",
                        "data": ["A tedious slog."]}], "parameters": {"threshold": 1}}
    response = httpx.post(f"{edge_url}/v2/models/{MODEL}/infer", json=body, timeout=30)
    if response.status_code != 200:
        raise RuntimeError(f"{edge_url}: {response.status_code} {response.text[:500]}")
    parameters = response.json().get("parameters", {})
    if parameters.get("escalated") != 1 or parameters.get("degraded"):
        raise RuntimeError(f"the edge did not reach the center: {response.text[:500]}")


@dataclass(frozen=True)
class Accuracy:
    """The test texts one per V2 request through one entry point."""

    rows: int
    failed: int
    accuracy: float
    by_tier: dict[str, int]
    p50_ms: float
    p99_ms: float
    req_per_s: float
    other_cores: float

    @property
    def escalated(self) -> float:
        answered = sum(self.by_tier.values())
        return self.by_tier.get("center", 0) / answered if answered else 0.0


def live_accuracy(url: str, rows: int, pids: Sequence[int]) -> Accuracy:
    from tiered.demo import run

    meter = Meter.now(pids)
    outcome = asyncio.run(run(url, MODEL, rows, LIVE_CONCURRENCY))
    others = Meter.now(pids).others_since(meter)
    return Accuracy(outcome.sent, outcome.failed, outcome.accuracy,
                    dict(outcome.rows_by_tier), outcome.percentile(50), outcome.percentile(99),
                    outcome.answered / outcome.seconds if outcome.seconds else 0.0, others)


TIER_ROWS = re.compile(r'^edge_rows_total\{[^}]*tier="([^"]+)"[^}]*\}\s+(\S+)$')


def edge_rows(url: str) -> dict[str, float]:
    """The edge's cumulative rows answered, by tier (edge, center, edge-degraded)."""
    totals: dict[str, float] = {}
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if (match := TIER_ROWS.match(line)) is not None:
            totals[match[1]] = totals.get(match[1], 0.0) + float(match[2])
    return totals


@dataclass(frozen=True)
class Throughput:
    load: Load
    other_cores: float
    escalated: float | None  # share of rows the edge sent to the center (cascade only)
    degraded: float | None


def throughput(plan: Plan, url: str, pids: Sequence[int], edge_url: str | None) -> Throughput:
    wrk(plan, url, WRK_CONCURRENCY, plan.warmup)
    before = edge_rows(edge_url) if edge_url else {}
    meter = Meter.now(pids)
    load = wrk(plan, url, WRK_CONCURRENCY, plan.seconds)
    others = Meter.now(pids).others_since(meter)
    escalated = degraded = None
    if edge_url:
        after = edge_rows(edge_url)
        delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
        total = sum(delta.values())
        escalated = delta.get("center", 0.0) / total if total else 0.0
        degraded = delta.get("edge-degraded", 0.0) / total if total else 0.0
    return Throughput(load, others, escalated, degraded)


@dataclass(frozen=True)
class Live:
    cascade: Accuracy
    center: Accuracy
    cascade_load: Throughput
    center_load: Throughput
    offline_escalation: float  # the same rows offline (batch 32), for comparison
    offline_accuracy: float


def live(work: Path, edge: Release, center: Release, rows: int,
         plan: Plan, offline: Offline, labels: np.ndarray, threshold: float) -> Live:
    with ExitStack() as stack:
        c = stack.enter_context(tier("center", center.store, work))
        e = stack.enter_context(tier("edge", edge.store, work, "--center-url", c.url,
                                     *EDGE_FLAGS))
        pids = (c.pid, e.pid)
        check_cascade(e.url)
        console.log(f"center {c.url} (pid {c.pid}), edge {e.url} (pid {e.pid}) ready")
        cascade = live_accuracy(e.url, rows, pids)
        console.log(f"cascade: {cascade.rows} rows, accuracy {cascade.accuracy:.2%}, "
                    f"escalated {cascade.escalated:.1%}, failed {cascade.failed}")
        center_only = live_accuracy(c.url, rows, pids)
        console.log(f"center only: {center_only.rows} rows, accuracy "
                    f"{center_only.accuracy:.2%}, failed {center_only.failed}")
        center_load = throughput(plan, c.url, pids, None)
        console.log(f"wrk center only: {center_load.load.rps:.1f} req/s, p99 "
                    f"{center_load.load.p99_ms:.1f} ms")
        cascade_load = throughput(plan, e.url, pids, e.url)
        console.log(f"wrk cascade: {cascade_load.load.rps:.1f} req/s, p99 "
                    f"{cascade_load.load.p99_ms:.1f} ms, escalated "
                    f"{cascade_load.escalated or 0:.1%}")
    sub = Offline(offline.center[:rows], offline.edge[:rows], 0, 0, 0)
    point = calibrated_on(sub, labels[:rows], threshold)
    return Live(cascade, center_only, cascade_load, center_load, point.escalation,
                point.accuracy)


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


# --- main ------------------------------------------------------------------------------------

def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = bench_parser(__doc__, f"{QUICK_ROWS} rows for the live accuracy, 3 s wrk runs")
    parser.add_argument("--json", type=Path, help="write the raw numbers here")
    parser.add_argument("--plot", type=Path, default=ROOT / "docs" / "cascade.png",
                        help="PNG to write (default docs/cascade.png)")
    parser.add_argument("--no-live", action="store_true",
                        help="only the curve and the plot (no servers, no wrk)")
    return parse_bench_args(parser, argv)


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds through the finally blocks that stop servers


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    wrk_path = None if args.no_live else ensure_wrk()
    shown = production(args.registry)
    version, calibration = int(shown["version"]), dict(shown["manifest"]["calibration"])
    texts, labels = test_split()
    with tempfile.TemporaryDirectory(prefix="bench-cascade-") as tmp:
        work = Path(tmp)
        edge, center = (pull(args.registry, version, t, work / t) for t in ("edge", "center"))
        console.log(f"{MODEL} v{version} pulled: edge {edge.model_file.name}, center "
                    f"{center.model_file.name}; calibrated threshold "
                    f"{calibration['threshold']:.4f}")
        offline = offline_logits(edge, center, texts)
        curve = Curve.of(offline.center, offline.edge, labels)
        calibrated = calibrated_on(offline, labels, float(calibration["threshold"]))
        manifest_curve = [Point(p["threshold"], p["escalation_rate"], p["cascade_accuracy"])
                          for p in calibration.get("curve", [])]
        size = plot(args.plot, curve, calibrated, curve.lowest_within(GOAL_TOLERANCE),
                    manifest_curve, f"{MODEL} v{version}: INT8 edge -> fp32 center cascade, "
                                    f"test split ({curve.rows:,} rows)")
        console.log(f"plot written: {args.plot} ({size / 1024:.0f} KiB)")
        result = None
        if wrk_path is not None:
            rows = QUICK_ROWS if args.quick else len(texts)
            plan = Plan(wrk_path, work, write_bodies(texts, work / "bodies.jsonl",
                                                     outputs=("label", "tier")),
                        args.duration, 1 if args.quick else 2, 0)
            result = live(work, edge, center, rows, plan, offline, labels,
                          float(calibration["threshold"]))
    report = Report(version, machine(), curve, calibrated, calibration,
                    curve.lowest_within(GOAL_TOLERANCE), curve.stays_within(GOAL_TOLERANCE),
                    Saved(calibrated.escalation, offline.center_ms_per_row,
                          offline.edge_ms_per_row),
                    offline, result, args.duration, args.plot)
    show(report)
    if args.json:
        args.json.write_text(json.dumps(as_json(report), indent=2) + "\n")
    if args.markdown:
        docs = ROOT / "docs"
        image = (os.path.relpath(args.plot.resolve(), docs)
                 if args.plot.resolve().is_relative_to(docs) else str(args.plot))
        args.markdown.write_text(markdown(report, image))


if __name__ == "__main__":
    main()
