"""Cascade controller benchmark: a traffic ramp to ~3x what the center absorbs at the
calibrated threshold and back, static threshold vs the controller; then the live audit's
accuracy estimate against the labels, its false alarms on clean traffic and its drift alarm.

    .venv/bin/python -m bench.control [--phase-s 15] [--center-cpu 0.2] [--quick]
        [--registry var/registry] [--markdown PATH] [--plot PNG] [--json PATH]

A real ``registry serve``, one center and two edges on loopback, syncing the demo release; the
center is held to ``--center-cpu`` of one core (a cgroup, as root) so that, as in a real
deployment, it has its own fixed compute instead of sharing the edges' cores. About 7 minutes
on a quiet 2-core machine. How it measures: docs/benchmark-methods.md, "The cascade
controller".
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
import numpy as np
from rich.table import Table

from bench.cascade.measure import production, test_split
from bench.harness import BIN, MODEL, ROOT, console
from bench.kit import machine
from bench.markdown import Shown
from harness.processes import RegistryProcess, TierProcess, start_registry, start_tier

TOKEN = "bench-control-token-0123456789"
PHASES = (0.5, 1.5, 3.0, 1.5, 0.5)  # x the rows/s the center absorbs at the calibrated threshold
MAX_IN_FLIGHT = 256  # the load generator's bound; requests beyond it are counted, not sent
CENTER_TIMEOUT_S = 2.0
P99_BOUND_MS = 1000.0  # "bounded": every phase's p99 within half the escalation timeout
CGROUPS = (Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup"))
CHECK_EVERY = 100  # clean requests between drift checks (false-alarm count)


# --- setup -----------------------------------------------------------------------------------

def copy_home(src: Path, dst: Path) -> None:
    """The registry home, its blobs hard-linked (the bench's registry writes node rows)."""
    def link(a: str, b: str) -> None:
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)

    shutil.copytree(src, dst, copy_function=link,
                    ignore=shutil.ignore_patterns("*.sqlite3-wal", "*.sqlite3-shm"))
    for name in ("registry.sqlite3",):  # the database itself is copied, never linked
        (dst / name).unlink()
        shutil.copy2(src / name, dst / name)


@contextlib.contextmanager
def cpu_cap(pid: int, share: float) -> Iterator[str]:
    """Hold process ``pid`` to ``share`` of one core with a cgroup (v1 ``cpu`` or v2); yields
    what was done, in words (no cap where cgroups cannot be written)."""
    period = 20_000
    for root in CGROUPS:
        group = root / f"tiered-bench-{os.getpid()}"
        try:
            if root.name == "cpu" and (root / "cpu.cfs_quota_us").exists():
                group.mkdir()
                (group / "cpu.cfs_period_us").write_text(str(period))
                (group / "cpu.cfs_quota_us").write_text(str(int(period * share)))
            elif (root / "cgroup.controllers").exists():
                group.mkdir()
                (group / "cpu.max").write_text(f"{int(period * share)} {period}")
            else:
                continue
            (group / "cgroup.procs").write_text(str(pid))
        except OSError as exc:
            with contextlib.suppress(OSError):
                group.rmdir()
            console.print(f"[yellow]could not cap the center with {root}: {exc}[/]")
            continue
        try:
            yield f"{share:.0%} of one core (cgroup {group})"
        finally:
            with contextlib.suppress(OSError):
                (root / "cgroup.procs").write_text(str(pid))  # still running: move it back
            for _ in range(50):
                try:
                    group.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)
        return
    yield "not capped (no writable cgroup: run as root)"


@dataclass
class Fleet:
    registry: RegistryProcess
    center: TierProcess
    edges: list[TierProcess]
    cap: str

    @property
    def processes(self) -> list[TierProcess | RegistryProcess]:
        return [*self.edges, self.center, self.registry]


def serves(process: TierProcess) -> bool:
    try:
        return httpx.get(f"{process.url}/v2/models/{MODEL}/ready", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


@contextlib.contextmanager
def fleet(home: Path, work: Path, center_cpu: float | None, *edge_flags: str) -> Iterator[Fleet]:
    """``registry serve`` on a copy of ``home``, a capped center and two edges syncing the
    production release into empty stores; everything stopped by PID on exit."""
    work.mkdir(parents=True)
    copy_home(home, work / "registry")
    env = {"PATH": str(BIN), "HOME": str(work)}
    started: list[TierProcess | RegistryProcess] = []
    try:
        registry = start_registry(work / "registry", work, TOKEN,
                                  env={"REGISTRY_REPORT_INTERVAL_S": "1"})
        started.append(registry)
        sync = ("--registry", registry.target, "--sync-backoff-max-s", "1")
        center = start_tier("center", work / "center", work, *sync, "--threads", "1",
                            until="live", env=env, registry_secret=TOKEN, timeout=120)
        started.append(center)
        with (cpu_cap(center.pid, center_cpu) if center_cpu is not None
              else contextlib.nullcontext("not capped")) as cap:
            edges = []
            for region in ("eu", "us"):
                edges.append(start_tier(
                    "edge", work / f"edge-{region}", work, *sync, "--region", region,
                    "--center-url", center.url, "--cache-size", "0", "--center-timeout-s",
                    str(CENTER_TIMEOUT_S), *edge_flags, until="live", env=env,
                    registry_secret=TOKEN, timeout=120))
                started.append(edges[-1])
            deadline = time.monotonic() + 180
            while not all(serves(p) for p in (center, *edges)):
                if time.monotonic() > deadline:
                    raise SystemExit("the fleet did not install the release within 180 s")
                time.sleep(0.5)
            yield Fleet(registry, center, edges, cap)
    finally:
        for process in reversed(started):
            process.stop()


# --- load ------------------------------------------------------------------------------------

@dataclass
class Answer:
    t: float  # sent, seconds since the run started
    phase: int
    latency_ms: float
    ok: bool
    tier: str = ""
    correct: bool = False


@dataclass
class Traffic:
    texts: list[str]
    labels: list[str]  # each text's label name
    answers: list[Answer] = field(default_factory=list)
    unsent: int = 0
    thresholds: list[tuple[float, float, float]] = field(default_factory=list)  # t, thr, budget
    center_503: list[float] = field(default_factory=list)  # per phase


def body(text: str) -> bytes:
    return json.dumps({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES",
                                   "data": [text]}]}).encode()


async def send(client: httpx.AsyncClient, url: str, traffic: Traffic, index: int, t: float,
               phase: int) -> Answer:
    started = time.perf_counter()
    try:
        response = await client.post(f"{url}/v2/models/{MODEL}/infer", content=body(
            traffic.texts[index]), headers={"content-type": "application/json"})
        latency = (time.perf_counter() - started) * 1000
        if response.status_code != 200:
            return Answer(t, phase, latency, False)
        outputs = {o["name"]: o["data"] for o in response.json()["outputs"]}
        return Answer(t, phase, latency, True, outputs["tier"][0],
                      outputs["label"][0] == traffic.labels[index])
    except httpx.HTTPError:
        return Answer(t, phase, (time.perf_counter() - started) * 1000, False)


def metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        match = re.fullmatch(rf"{name}(?:{{(.*)}})? (\S+)", line)
        if match and all(f'{k}="{v}"' in (match.group(1) or "") for k, v in labels.items()):
            total += float(match.group(2))
    return total


async def watch(client: httpx.AsyncClient, f: Fleet, traffic: Traffic, t0: float) -> None:
    """Once a second: the first edge's threshold and budget."""
    while True:
        with contextlib.suppress(httpx.HTTPError):
            text = (await client.get(f"{f.edges[0].url}/metrics")).text
            traffic.thresholds.append((
                time.perf_counter() - t0,
                metric(text, "edge_cascade_threshold", model=MODEL),
                metric(text, "edge_cascade_budget_rows_per_second", model=MODEL)))
        await asyncio.sleep(1)


async def center_503s(client: httpx.AsyncClient, f: Fleet) -> float:
    text = (await client.get(f"{f.center.url}/metrics")).text
    return metric(text, "center_request_failure_total", reason="Overloaded")


async def ramp(f: Fleet, traffic: Traffic, rates: list[float], phase_s: float) -> None:
    """Open loop: requests started at each phase's rate whatever the answers take, spread over
    the edges in turn, the test texts in turn."""
    loop = asyncio.get_running_loop()
    in_flight: set[asyncio.Task[Answer]] = set()
    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(
            max_connections=MAX_IN_FLIGHT, max_keepalive_connections=MAX_IN_FLIGHT)) as client:
        t0 = time.perf_counter()
        watcher = loop.create_task(watch(client, f, traffic, t0))
        before = await center_503s(client, f)
        i = 0
        for phase, rate in enumerate(rates):
            start = time.perf_counter()
            sent = 0
            while True:
                due = start + sent / rate
                if due >= start + phase_s:
                    break
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
                if len(in_flight) >= MAX_IN_FLIGHT:
                    traffic.unsent += 1
                else:
                    task = loop.create_task(send(client, f.edges[i % len(f.edges)].url,
                                                 traffic, i % len(traffic.texts),
                                                 due - t0, phase))
                    in_flight.add(task)
                    task.add_done_callback(in_flight.discard)
                    task.add_done_callback(lambda done: traffic.answers.append(done.result()))
                sent += 1
                i += 1
            await asyncio.gather(*in_flight)  # the phase's answers, then its 503s
            now = await center_503s(client, f)
            traffic.center_503.append(now - before)
            before = now
        watcher.cancel()


# --- part 1: the ramp ------------------------------------------------------------------------

@dataclass
class Phase:
    load: float  # x what the center absorbs at the calibrated threshold
    offered: float  # requests (rows) per second sent
    answered: int
    failed: int
    center_503: float
    escalated: float
    shed: float
    degraded: float
    p50_ms: float
    p99_ms: float
    accuracy: float
    threshold: float  # mean of the first edge's, once a second


def phases(traffic: Traffic, rates: list[float], phase_s: float) -> list[Phase]:
    out = []
    for k, rate in enumerate(rates):
        answers = [a for a in traffic.answers if a.phase == k]
        ok = [a for a in answers if a.ok]
        tiers = [a.tier for a in ok]
        latencies = np.array([a.latency_ms for a in answers]) if answers else np.zeros(1)
        start, end = k * phase_s, (k + 1) * phase_s
        thresholds = [t for when, t, _ in traffic.thresholds if start <= when < end]
        share = {tier: tiers.count(tier) / len(tiers) if tiers else 0.0
                 for tier in ("center", "edge-shed", "edge-degraded")}
        out.append(Phase(PHASES[k], rate, len(ok), len(answers) - len(ok),
                         traffic.center_503[k], share["center"], share["edge-shed"],
                         share["edge-degraded"], float(np.percentile(latencies, 50)),
                         float(np.percentile(latencies, 99)),
                         sum(a.correct for a in ok) / len(ok) if ok else 0.0,
                         float(np.mean(thresholds)) if thresholds else 0.0))
    return out


def measure_center(f: Fleet, texts: list[str], seconds: float) -> float:
    """Rows per second the capped center answers when asked directly, 16 requests in flight."""
    async def run() -> float:
        done = 0
        stop = time.perf_counter() + seconds

        async def worker(client: httpx.AsyncClient, k: int) -> None:
            nonlocal done
            while time.perf_counter() < stop:
                response = await client.post(
                    f"{f.center.url}/v2/models/{MODEL}/infer", content=body(texts[k]),
                    headers={"content-type": "application/json"})
                done += response.status_code == 200
                k += 16

        started = time.perf_counter()
        async with httpx.AsyncClient(timeout=30) as client:
            await asyncio.gather(*(worker(client, k) for k in range(16)))
        return done / (time.perf_counter() - started)

    return asyncio.run(run())


# --- part 2: the audit -----------------------------------------------------------------------

@dataclass
class Checkpoint:
    sent: int
    audited: float
    agreement: float
    expected: float
    estimate: float
    true_accuracy: float
    drift: bool


async def closed_loop(url: str, items: list[tuple[str, str]], every: int,
                      on_check: Any, concurrency: int = 8) -> list[bool]:
    """Send ``items`` (text, label) with ``concurrency`` in flight; after every ``every``
    answers call ``on_check(sent, correct so far)``. Returns each answer's correctness."""
    traffic = Traffic([t for t, _ in items], [label for _, label in items])
    results: list[bool] = []
    queue = list(range(len(items)))[::-1]
    async with httpx.AsyncClient(timeout=30) as client:
        async def worker() -> None:
            while queue:
                index = queue.pop()
                answer = await send(client, url, traffic, index, 0.0, 0)
                results.append(answer.ok and answer.correct)
                if len(results) % every == 0:
                    await on_check(client, len(results), results)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return results


async def audit_state(client: httpx.AsyncClient, url: str) -> dict[str, float]:
    text = (await client.get(f"{url}/metrics")).text
    return {"audited": metric(text, "edge_audit_rows_total"),
            "agreement": metric(text, "edge_audit_agreement"),
            "expected": metric(text, "edge_audit_expected_agreement"),
            "estimate": metric(text, "edge_estimated_accuracy"),
            "drift": metric(text, "edge_audit_drift"),
            "confidence_drift": metric(text, "edge_confidence_drift"),
            "psi": metric(text, "edge_confidence_psi")}


def scrambled(texts: list[str], rng: random.Random) -> list[str]:
    """Out-of-domain texts: words drawn at random from the whole split, at the same lengths."""
    words = [w for t in texts for w in t.split()]
    return [" ".join(rng.choice(words) for _ in t.split()) for t in texts]


@dataclass
class Audit:
    checkpoints: list[Checkpoint]
    clean_checks: int
    false_alarms: int
    drift_requests: int | None  # mixed requests until the alarm (None: not within the cap)
    drift_audited: float
    ready_notes: list[str]
    clean_psi: float  # the largest confidence PSI seen on clean traffic
    drift_kind: str  # which test fired: agreement, confidence or both
    drift_psi: float


def audit_part(f: Fleet, texts: list[str], labels: list[str], quick: bool) -> Audit:
    url = f.edges[0].url
    items = list(zip(texts, labels, strict=True))
    checkpoints: list[Checkpoint] = []
    alarms: dict[str, float] = {"checks": 0, "alarms": 0}

    async def checkpoint(client: httpx.AsyncClient, sent: int, results: list[bool]) -> None:
        s = await audit_state(client, url)
        checkpoints.append(Checkpoint(sent, s["audited"], s["agreement"], s["expected"],
                                      s["estimate"], sum(results) / len(results),
                                      bool(s["drift"])))

    async def clean_check(client: httpx.AsyncClient, sent: int, results: list[bool]) -> None:
        s = await audit_state(client, url)
        alarms["checks"] += 1
        alarms["alarms"] += bool(s["drift"] or s["confidence_drift"])
        alarms["psi"] = max(alarms.get("psi", 0.0), s["psi"])

    asyncio.run(closed_loop(url, items, 250, checkpoint))  # pass 1, in order
    rng = random.Random(7)
    for _ in range(1 if quick else 2):  # more clean passes, shuffled: false alarms
        shuffled = items[:]
        rng.shuffle(shuffled)
        asyncio.run(closed_loop(url, shuffled, CHECK_EVERY, clean_check))
    # drift: half the requests out-of-domain, until the alarm
    odd = scrambled(texts, rng)
    mixed = [(odd[i] if i % 2 else texts[i], labels[i]) for i in range(len(texts))] * 2
    found: dict[str, float] = {}

    async def drift_check(client: httpx.AsyncClient, sent: int, results: list[bool]) -> None:
        s = await audit_state(client, url)
        if (s["drift"] or s["confidence_drift"]) and "sent" not in found:
            found.update(sent=sent, audited=s["audited"], psi=s["psi"],
                         agreement=s["drift"], confidence=s["confidence_drift"])

    before = asyncio.run(audit_now(url))["audited"]
    asyncio.run(closed_loop(url, mixed, 25, drift_check))
    ready = httpx.get(f"{url}/v2/health/ready", timeout=5).json()
    kinds = [k for k in ("agreement", "confidence") if found.get(k)]
    return Audit(checkpoints, int(alarms["checks"]), int(alarms["alarms"]),
                 int(found["sent"]) if found else None,
                 found.get("audited", 0.0) - before, ready.get("notes", []),
                 alarms.get("psi", 0.0), " + ".join(kinds), found.get("psi", 0.0))


async def audit_now(url: str) -> dict[str, float]:
    """``audit_state`` on a client of its own (between the closed loops)."""
    async with httpx.AsyncClient(timeout=10) as client:
        return await audit_state(client, url)


# --- report ----------------------------------------------------------------------------------

def pct(x: float) -> str:
    return f"{x:.1%}"


def phase_table(title: str, rows: list[Phase]) -> Table:
    table = Table(title=title)
    for col in ("load", "offered req/s", "answered", "failed", "center 503s", "escalated",
                "shed", "degraded", "p50 ms", "p99 ms", "accuracy", "threshold (edge 1)"):
        table.add_column(col)
    for p in rows:
        table.add_row(f"{p.load:g}x", f"{p.offered:.0f}", str(p.answered), str(p.failed),
                      f"{p.center_503:.0f}", pct(p.escalated), pct(p.shed), pct(p.degraded),
                      f"{p.p50_ms:.0f}", f"{p.p99_ms:.0f}", pct(p.accuracy),
                      f"{p.threshold:.3f}" if p.threshold else "-")
    return table


def plot(path: Path, runs: dict[str, Traffic], capacity: float, phase_s: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True)
    for ax, (name, traffic) in zip(axes, runs.items(), strict=True):
        end = int(max((a.t for a in traffic.answers), default=0)) + 1
        bins = np.arange(end + 1)
        for tier, color in (("center", "tab:blue"), ("edge-shed", "tab:orange"),
                            ("edge-degraded", "tab:red")):
            ts = [a.t for a in traffic.answers if a.ok and a.tier == tier]
            ax.plot(bins[:-1], np.histogram(ts, bins)[0], label=f"{tier} rows/s", color=color)
        offered = np.histogram([a.t for a in traffic.answers], bins)[0]
        ax.plot(bins[:-1], offered * 0.1, color="grey", ls=":", label="offered req/s / 10")
        ax.axhline(capacity, color="black", ls="--", lw=1, label="center capacity (rows/s)")
        twin = ax.twinx()
        twin.plot([t for t, _, _ in traffic.thresholds], [v for _, v, _ in traffic.thresholds],
                  color="tab:green", lw=1, label="threshold (edge 1)")
        twin.set_ylim(0, 1.05)
        twin.set_ylabel("threshold")
        ax.set_title(name)
        ax.set_ylabel("rows per second")
        for k in range(1, len(PHASES)):
            ax.axvline(k * phase_s, color="#ddd", lw=0.8)
        ax.legend(loc="upper left", fontsize=7)
    axes[-1].set_xlabel("seconds")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --- main ------------------------------------------------------------------------------------

def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.control",
                                     description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--phase-s", type=float, default=15.0,
                        help="seconds per load phase (default 15; 6 with --quick)")
    parser.add_argument("--center-cpu", type=float, default=0.2,
                        help="share of one core the center may use (default 0.2)")
    parser.add_argument("--quick", action="store_true", help="short phases, one clean pass")
    parser.add_argument("--registry", type=Path, default=ROOT / "var" / "registry",
                        help="registry home holding the demo release (default var/registry)")
    parser.add_argument("--markdown", type=Path, default=None)
    parser.add_argument("--plot", type=Path, default=ROOT / "docs" / "control.png")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.quick:
        args.phase_s = min(args.phase_s, 6.0)
    if not 0.01 <= args.center_cpu <= 8:
        parser.error("--center-cpu must be between 0.01 and 8 cores")
    return args


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    shown = production(args.registry)
    manifest = shown["manifest"]
    calibration = manifest["calibration"]
    if not calibration.get("agreement"):
        raise SystemExit(f"{MODEL} v{shown['version']} predates the audit baseline "
                         f"(calibration.agreement): publish the demo release again")
    texts, label_ids = test_split()
    names = [manifest["labels"][int(k)] for k in label_ids]
    show = Shown(console)
    runs: dict[str, Traffic] = {}
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-control-") as tmp:
        work = Path(tmp)
        rates: list[float] = []
        capacity = 0.0
        cap = ""
        for name, flags in (("static threshold", ("--controller", "off")),
                            ("controller", ("--controller", "auto"))):
            with fleet(args.registry, work / name.split()[0], args.center_cpu, *flags) as f:
                cap = f.cap
                # asked directly first: the center's own capacity figure then comes from full
                # batches, as it would after any busy minute
                measured = measure_center(f, texts, 4 if args.quick else 8)
                if not rates:
                    capacity = measured
                    absorbed = capacity / float(calibration["escalation_rate"])
                    rates = [m * absorbed for m in PHASES]
                    console.log(f"center: {capacity:.1f} rows/s ({cap}); it absorbs "
                                f"{absorbed:.0f} req/s of edge traffic at the calibrated "
                                f"escalation rate {calibration['escalation_rate']:.1%}")
                console.log(f"{name}: ramp {', '.join(f'{r:.0f}' for r in rates)} req/s, "
                            f"{args.phase_s:g} s each")
                traffic = Traffic(texts, names)
                asyncio.run(ramp(f, traffic, rates, args.phase_s))
                runs[name] = traffic
                if name == "controller":
                    state = asyncio.run(audit_now(f.edges[0].url))
                    results["ramp_audit"] = state
        results["phases"] = {name: [asdict(p) for p in phases(t, rates, args.phase_s)]
                             for name, t in runs.items()}
        # the audit on its own: an uncapped center, the calibrated threshold, every row the
        # edge answers itself audited
        with fleet(args.registry, work / "audit", None, "--controller", "off",
                   "--audit-share", "1", "--audit-in-flight", "64") as f:
            audit = audit_part(f, texts, names, args.quick)
    report(show, args, calibration, capacity, cap, runs, rates, audit, results)
    plot(args.plot, runs, capacity, args.phase_s)
    console.print(f"wrote {args.plot}")
    if args.markdown is not None:
        show.write(args.markdown, "The cascade controller: a ramp past the center's capacity, "
                   "and the live audit")
    if args.json is not None:
        args.json.write_text(json.dumps(results | {"audit": asdict(audit)}, indent=2,
                                        default=str))


def report(show: Shown, args: argparse.Namespace, calibration: dict[str, Any], capacity: float,
           cap: str, runs: dict[str, Traffic], rates: list[float], audit: Audit,
           results: dict[str, Any]) -> None:
    info = machine(center=cap, phases=f"{len(PHASES)} x {args.phase_s:g} s")
    show(" · ".join(f"{k}: {v}" for k, v in info.items()))
    static, controlled = (phases(runs[n], rates, args.phase_s) for n in runs)
    floor = _floor_accuracy(calibration)
    show(f"Release {MODEL}: calibrated threshold {calibration['threshold']:.4f} escalates "
         f"{calibration['escalation_rate']:.1%} of the calibration split (cascade accuracy "
         f"{calibration['cascade_accuracy']:.2%}); the controller's floor (1 point of "
         f"tolerance) keeps a calibrated accuracy of {floor:.2%}. Center asked directly: "
         f"{capacity:.1f} rows/s; load 1x = {rates[1] / PHASES[1]:.0f} req/s (one text each, "
         f"the 2,000 test texts in turn, open loop, both edges in turn).")
    show(phase_table("Static threshold (--controller off)", static))
    show(phase_table("Controller (--controller auto, budgets from registry serve)", controlled))
    no_503 = sum(p.center_503 for p in controlled) == 0
    worst = max(p.p99_ms for p in controlled)
    lowest = min(p.accuracy for p in controlled)
    low = [k for k, m in enumerate(PHASES) if m < 1]
    gain = float(np.mean([controlled[k].accuracy - static[k].accuracy for k in low]))
    more = float(np.mean([controlled[k].escalated - static[k].escalated for k in low]))
    lost = sum(p.degraded + p.shed for p in static) / len(static)
    show(f"Goals: controller 0 center 503s through the ramp: "
         f"{'met' if no_503 else 'missed'} ({sum(p.center_503 for p in controlled):.0f}; "
         f"static {sum(p.center_503 for p in static):.0f} 503s, its overload shows as "
         f"escalations timing out: {lost:.1%} of rows degraded on average). Bounded p99 "
         f"(every phase <= {P99_BOUND_MS:.0f} ms): "
         f"{'met' if worst <= P99_BOUND_MS else 'missed'} (worst {worst:.0f} ms; static "
         f"{max(p.p99_ms for p in static):.0f} ms). Accuracy never below the floor's calibrated "
         f"{floor:.2%}: {'met' if lowest >= floor else 'missed'} (lowest phase {lowest:.2%}; a "
         f"phase of {min(p.answered for p in controlled)} rows is itself uncertain by about "
         f"±{196 * np.sqrt(0.82 * 0.18 / max(min(p.answered for p in controlled), 1)):.1f} "
         f"points). Low load (phases below 1x) above the static threshold's accuracy: "
         f"{'met' if gain > 0 else 'missed'} ({gain * 100:+.2f} points on the same texts; "
         f"{more * 100:+.1f} points of rows escalated).")
    table = Table(title="Live accuracy estimate vs the labels (audit share 1: every row the "
                        "edge answered itself is audited; clean test texts in order)")
    for col in ("requests", "audited rows", "agreement", "expected (calibration)",
                "estimated accuracy", "true accuracy", "error (points)"):
        table.add_column(col)
    for c in audit.checkpoints:
        table.add_row(str(c.sent), f"{c.audited:.0f}", pct(c.agreement), pct(c.expected),
                      pct(c.estimate) if c.estimate else "-", pct(c.true_accuracy),
                      f"{(c.estimate - c.true_accuracy) * 100:+.2f}" if c.estimate else "-")
    show(table)
    last = audit.checkpoints[-1] if audit.checkpoints else None
    if last is not None and last.estimate:
        error = abs(last.estimate - last.true_accuracy) * 100
        show(f"Goal: estimate within ±1 point of the true accuracy once enough rows are seen: "
             f"{'met' if error <= 1 else 'missed'} ({error:.2f} points after {last.audited:.0f} "
             f"audited rows). At a 1% audit share the same number of audited rows takes 100x "
             f"the requests ({last.sent * 100:,}).")
    ramp_audit = results.get("ramp_audit", {})
    ramp_ok = [a.correct for a in runs["controller"].answers if a.ok]
    estimate = ramp_audit.get("estimate", 0.0)
    show(f"During the controller's ramp at the default 1% share: "
         f"{ramp_audit.get('audited', 0):.0f} rows audited, estimated accuracy "
         f"{pct(estimate) if estimate else '- (fewer than 100 audited rows)'} vs the ramp's true "
         f"{pct(sum(ramp_ok) / max(len(ramp_ok), 1))} (too few audited rows for a tight "
         f"interval).")
    rate = audit.false_alarms / audit.clean_checks if audit.clean_checks else 0.0
    show(f"Drift alarm: clean traffic checked {audit.clean_checks} times (every {CHECK_EVERY} "
         f"requests): {audit.false_alarms} false alarms ({rate:.1%}; largest confidence PSI "
         f"{audit.clean_psi:.3f}). Half the requests out of domain (words drawn at random from "
         f"the split): "
         + (f"alarm after {audit.drift_requests} requests, by the {audit.drift_kind} test (PSI "
            f"{audit.drift_psi:.3f}; {audit.drift_audited:.0f} rows audited meanwhile). The "
            f"confidence test needs no audit, so the same holds at a 1% share"
            if audit.drift_requests else "no alarm within the 4,000 requests sent")
         + (f". Readiness note (the Consul check's output): \"{audit.ready_notes[0]}\""
            if audit.ready_notes else ". No readiness note."))


def _floor_accuracy(calibration: dict[str, Any], tolerance: float = 0.01) -> float:
    """The calibrated cascade accuracy at the controller's floor (see edge.controller)."""
    import msgspec

    from edge.controller import floor_threshold
    from serving.release.manifest import Calibration

    cal = msgspec.convert(calibration, Calibration)
    floor = floor_threshold(cal, tolerance)
    points = sorted(cal.curve, key=lambda p: abs(p.threshold - floor))
    return points[0].cascade_accuracy if points else float(cal.cascade_accuracy or 0)


if __name__ == "__main__":
    main()
