"""The cascade benchmark's measurements: the curve on the test split from in-process logits,
the plot, and the live cascade vs center only under wrk. How and why: docs/benchmark-methods.md,
"The cascade".
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.cascade.curve import GOAL_ESCALATION, GOAL_TOLERANCE, Curve, Point, points
from bench.harness import BIN, MODEL, SPLIT_SEED, Cpu, Plan, Release, console, wrk
from harness.load import Load, process_cpu_s
from harness.processes import TierProcess, start_tier

SELECTED = (0.0, 0.10, 0.20, 0.35, 0.50, 1.0)  # escalation rates shown in the tables
LIVE_CONCURRENCY = 8  # the V2 client's requests in flight (as `tiered demo`)
WRK_CONCURRENCY = 32
QUICK_ROWS = 300
CALIBRATED = "calibrated threshold"
EDGE_FLAGS = ("--cache-size", "0")

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
        base = Cpu.now()
        return cls(time.perf_counter(), base.machine_s, base.own_s,
                   sum(process_cpu_s(p) for p in pids))

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
    """Both models over the texts with the runner and batch size ``registry publish`` validates
    with (``serving.model.runner``)."""
    from serving.model import torchscript
    from serving.model.runner import (
        BATCH,
        Inputs,
        onnx_session,
        run_onnx,
        run_torchscript,
        text_inputs,
    )

    inputs = text_inputs(center.tokenizer, center.max_length, texts)
    warm = Inputs(inputs.batches[:1], inputs.kind)
    module = torchscript.load(center.model_file).eval()
    session = onnx_session(edge.model_file)

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
