"""Peer comparison: Tiered's edge vs Seldon MLServer and KServe's Python model server.

Run from the repository root (about 3 minutes by default once the peer venvs exist, under a
minute and a half with ``--quick``)::

    .venv/bin/python -m bench.peers.run [--duration S] [--quick] [--json PATH] [--markdown PATH]

All three serve the demo release's INT8 ONNX edge model (``sentiment`` pulled from
``var/registry`` into a temporary store) over KServe V2 REST, and all three get the same load:
``wrk`` (one thread, keep-alive connections) with ``bench/v2_infer.lua`` POSTing the same V2
JSON bodies, one real test-split review text per request (200 texts rotated, split seed 7:
``bench.tiers.review_texts``), BYTES input ``text`` of shape ``[1]`` and
``"parameters": {"threshold": 0}`` (Tiered's edge then never escalates; V2 allows request
parameters and both peers ignore them: checked before measuring). Each server runs at
concurrency 1, 8, 32 and 64 for ``--duration`` seconds after an unrecorded warm-up at 32.

Servers (each started on a free 127.0.0.1 port, stopped by PID in a ``finally``):

* **Tiered edge**: ``edge --cache-size 0 --threads 0 --max-batch-size 32
  --max-batch-delay-ms 5`` (batching flags = its defaults; the cache is off or every repeat of
  the 200 texts would be a hit); no center. One process.
* **MLServer** with ``bench/peers/mlserver_runtime.py`` (MLServer has no ONNX runtime package):
  adaptive batching ``max_batch_size: 32``, ``max_batch_time: 0.005`` s (= Tiered's 32 rows /
  5 ms). ``parallel_workers: 1``, MLServer 1.7's default: the HTTP front process plus one
  inference worker process (Tiered: one process with one model thread). With
  ``--mlserver-workers 1,0`` (the default unless ``--quick``) it also runs with
  ``parallel_workers: 0``: inference inside the front process, the same process count as
  Tiered. Other settings are MLServer's defaults (``debug: true``: uvicorn access log on).
* **KServe** ``kserve.ModelServer`` with ``bench/peers/kserve_server.py``, one uvicorn worker,
  gRPC off, default logging (KServe 0.21 always listens on 0.0.0.0; only loopback is used).
  **KServe's Python model server has no adaptive batching**: the KServe batcher
  (``spec.predictor.batcher``) is part of the Go agent sidecar that the KServe controller
  injects into a Kubernetes InferenceService pod, not of the ``kserve`` package, and per
  KServe's docs it handles the V1 protocol only. So every request is one model execution
  (batch of 1); nothing here emulates a batcher for it.

The peers tokenize with the release's ``tokenizer.json`` (truncate to the manifest's
``preprocessing.max_length``, pad to the longest text of the batch) and run the ONNX file with
onnxruntime's CPU provider and the edge's session options (``edge/runtime.py``), and answer
``label`` BYTES, ``probabilities`` FP32 ``[n, 2]`` and ``confidence`` FP32. Before measuring,
every server answers the first 8 texts one request at a time (a batch of 1 everywhere: the
probabilities should match the Tiered edge's to float precision) and the first 64 texts (24
with ``--quick``) with 8 requests in flight (batching servers merge and split them); labels and
probabilities are compared with the Tiered edge's and reported (dynamic INT8 quantization
makes batch-mates matter slightly, so a rare label flip near 0.5 is expected there).

Each peer lives in its own venv under ``var/bench/venvs/{mlserver,kserve}`` (they pull
conflicting dependencies, and neither may touch ``.venv``), created with this interpreter's
``venv`` and ``pip install`` of ``PINS`` below, and reused while the pinned versions match.
A venv in which torch shows up is refused.

Reported per server and concurrency: req/s, p50 and p99 latency (wrk), errors (non-2xx +
socket errors), peak RSS of the server's process tree (VmRSS of the server and all its
descendants, summed, sampled every 0.2 s during the run), the cores the tree used and the
cores other processes used (a shared machine skews results; such rows are flagged). The goal,
reported and never asserted: Tiered edge >= 2x the best peer's req/s at equal or lower p99 at
every concurrency >= 8, with zero errors.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from datetime import datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import httpx
from rich.table import Table

from bench.harness import (
    MODEL,
    TEXTS,
    Cpu,
    Load,
    Plan,
    Release,
    Usage,
    bench_parser,
    console,
    ensure_wrk,
    parse_bench_args,
    process_cpu_s,
    pull,
    review_texts,
    wrk,
)
from bench.kit import BUSY_OTHERS, cores, cpu, git_commit, write_bodies, wrk_version
from tiered.processes import free_port, start_tier

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
VENVS = ROOT / "var" / "bench" / "venvs"

# Pinned peer stacks (Python 3.11). onnxruntime, tokenizers and numpy match the project's .venv
# so the model math is the same; the web stacks are pinned to what resolved and worked here.
# uvloop < 0.22: MLServer 1.7.1's inference worker calls asyncio.get_event_loop() before any
# loop exists, which uvloop 0.22+ turns into a RuntimeError (the worker dies, no model loads).
COMMON = ("onnxruntime==1.32.0", "tokenizers==0.23.3", "numpy==2.4.6")
PINS: dict[str, tuple[str, ...]] = {
    "mlserver": ("mlserver==1.7.1", "uvloop==0.21.0", "fastapi==0.115.14", "uvicorn==0.54.0",
                 "pydantic==2.14.4", *COMMON),
    "kserve": ("kserve==0.21.0", "fastapi==0.165.0", "uvicorn==0.54.0", "pydantic==2.14.4",
               *COMMON),
}
FORBIDDEN = ("torch",)  # a peer venv must not pull it

CONCURRENCY = (1, 8, 32, 64)
QUICK_CONCURRENCY = (1, 32)
WARMUP_CONCURRENCY = 32
MAX_BATCH_SIZE = 32
MAX_BATCH_DELAY_MS = 5.0
TIERED_FLAGS = ("--cache-size", "0", "--threads", "0", "--max-batch-size", str(MAX_BATCH_SIZE),
                "--max-batch-delay-ms", f"{MAX_BATCH_DELAY_MS:g}")
CHECK_TEXTS, QUICK_CHECK_TEXTS, CHECK_PARALLEL = 64, 24, 8
CHECK_ALONE = 8  # texts sent one at a time first: a batch of 1 everywhere, answers must match
GOAL_RATIO, GOAL_FROM = 2.0, 8
SAMPLE_S = 0.2
START_TIMEOUT_S = 180


# --- peer venvs ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Venv:
    name: str
    path: Path
    versions: dict[str, str]
    created_s: float | None  # None: reused

    @property
    def bin(self) -> Path:
        return self.path / "bin"

    def describe(self) -> str:
        how = "reused" if self.created_s is None else f"created in {self.created_s:.0f} s"
        return f"{self.path.relative_to(ROOT)} ({how})"


def pinned(pins: Sequence[str]) -> dict[str, str]:
    return dict(pin.split("==", 1) for pin in pins)


def installed(python: Path, names: Sequence[str]) -> dict[str, str] | None:
    """Installed versions of ``names`` in the venv of ``python`` ("" = not installed)."""
    probe = ("import json, sys\nfrom importlib import metadata\nout = {}\n"
             "for n in sys.argv[1:]:\n    try:\n        out[n] = metadata.version(n)\n"
             "    except metadata.PackageNotFoundError:\n        out[n] = ''\n"
             "print(json.dumps(out))")
    if not python.exists():
        return None
    result = subprocess.run([str(python), "-c", probe, *names], capture_output=True, text=True)
    if result.returncode != 0:
        return None
    found: dict[str, str] = json.loads(result.stdout)
    return found


def ensure_venv(name: str, pins: Sequence[str]) -> Venv:
    """``var/bench/venvs/NAME`` with exactly ``pins`` installed (reused when they match)."""
    path = VENVS / name
    want = pinned(pins)
    names = [*want, *FORBIDDEN]
    have = installed(path / "bin" / "python", names)
    created: float | None = None
    if have is None or any(have.get(n) != v for n, v in want.items()):
        console.log(f"creating the {name} venv at {path.relative_to(ROOT)}: "
                    f"pip install {' '.join(pins)}")
        started = time.perf_counter()
        if path.exists():
            shutil.rmtree(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "venv", str(path)], check=True,
                       capture_output=True)
        install = [str(path / "bin" / "python"), "-m", "pip", "install", "--no-input",
                   "--disable-pip-version-check", *pins]
        result = subprocess.run(install, capture_output=True, text=True)
        if result.returncode != 0:
            lines = [x for x in (result.stdout + result.stderr).splitlines()
                     if not x.startswith("WARNING: Location")]
            raise SystemExit(f"pip install into {path} failed:\n" + "\n".join(lines[-40:]))
        created = time.perf_counter() - started
        have = installed(path / "bin" / "python", names) or {}
        wrong = {n: have.get(n) for n, v in want.items() if have.get(n) != v}
        if wrong:
            raise SystemExit(f"{path}: pip installed {wrong}, not the pins {want}")
    pulled = [n for n in FORBIDDEN if have.get(n)]
    if pulled:
        raise SystemExit(f"{path}: the {name} venv contains {pulled} (a peer must not pull "
                         f"torch); remove the venv and check the pins")
    return Venv(name, path, {n: have[n] for n in want}, created)


# --- process trees ---------------------------------------------------------------------------

def descendants(pid: int) -> list[int]:
    """``pid`` and every live process below it (from /proc/*/stat parent ids)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    tree, i = [pid], 0
    while i < len(tree):
        tree.extend(children.get(tree[i], []))
        i += 1
    return tree


def rss_kib(pids: Sequence[int]) -> int:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
                    break
        except OSError:
            continue
    return total


def tree_cpu_s(pid: int) -> float:
    total = 0.0
    for p in descendants(pid):
        try:
            total += process_cpu_s(p)
        except (OSError, IndexError, ValueError):
            continue
    return total


class PeakRss:
    """Max over time of the summed VmRSS of a process tree, sampled in a thread."""

    def __init__(self, pid: int, every: float = SAMPLE_S) -> None:
        self.pid, self.every = pid, every
        self.peak_kib = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="rss", daemon=True)

    def _sample(self) -> None:
        while True:
            self.peak_kib = max(self.peak_kib, rss_kib(descendants(self.pid)))
            if self._stop.wait(self.every):
                return

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def peak_mib(self) -> float:
        return self.peak_kib / 1024


def stop_tree(process: subprocess.Popen[bytes], grace: float = 8) -> None:
    """SIGTERM the server (it stops its workers), then SIGKILL what is left of its process
    group: peers are started with ``start_new_session``, so the group id is the server's PID
    and holds its workers even after the server itself has exited. Also on Ctrl-C.

    MLServer 1.7.1 often never finishes a SIGTERM shutdown after a wrk run (uvicorn keeps
    "waiting for background tasks to complete" for the requests wrk abandoned at its end), so
    the grace is short; nothing is measured after it."""
    try:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            with suppress(subprocess.TimeoutExpired):
                process.wait(timeout=grace)
    finally:
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


# --- servers ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Spec:
    key: str  # unique name in results
    kind: str  # tiered | mlserver | kserve
    label: str
    workers: int = 1  # MLServer parallel_workers

    @property
    def processes(self) -> str:
        if self.kind == "mlserver":
            return ("2 (HTTP front + 1 inference worker)" if self.workers == 1 else
                    "1 (inference in the front process)" if self.workers == 0 else
                    f"{self.workers + 1} (HTTP front + {self.workers} inference workers)")
        return "1"


@dataclass(frozen=True)
class Handle:
    url: str
    pid: int
    log: Path


def wait_ready(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited {process.returncode}: {log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/v2/models/{MODEL}/ready", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"not ready after {START_TIMEOUT_S}s: {log.read_text()[-3000:]}")


def peer_env(venv: Venv, pythonpath: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = f"{venv.bin}{os.pathsep}{env.get('PATH', '')}"
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return env


def mlserver_command(spec: Spec, venv: Venv, release: Release, labels: list[str],
                     folder: Path) -> tuple[list[str], int]:
    """Write settings.json and sentiment/model-settings.json into ``folder``."""
    port = free_port()
    settings = {"host": "127.0.0.1", "http_port": port, "grpc_port": free_port(),
                "metrics_port": free_port(), "parallel_workers": spec.workers,
                "metrics_dir": str(folder / ".metrics"),
                "environments_dir": str(folder / ".envs")}
    model = {"name": MODEL, "implementation": "mlserver_runtime.OnnxTextClassifier",
             "max_batch_size": MAX_BATCH_SIZE, "max_batch_time": MAX_BATCH_DELAY_MS / 1000,
             "parameters": {"uri": str(release.model_file), "version": release.folder.name,
                            "extra": {"tokenizer": str(release.tokenizer),
                                      "max_length": release.max_length, "labels": labels,
                                      "threads": 0}}}
    (folder / MODEL).mkdir(parents=True)
    (folder / "settings.json").write_text(json.dumps(settings, indent=2))
    (folder / MODEL / "model-settings.json").write_text(json.dumps(model, indent=2))
    return [str(venv.bin / "mlserver"), "start", str(folder)], port


def kserve_command(venv: Venv, release: Release, labels: list[str]) -> tuple[list[str], int]:
    port = free_port()
    return [str(venv.bin / "python"), str(HERE / "kserve_server.py"), "--model_name", MODEL,
            "--http_port", str(port), "--enable_grpc", "false", "--workers", "1",
            "--onnx", str(release.model_file), "--tokenizer", str(release.tokenizer),
            "--max_length", str(release.max_length), "--labels", ",".join(labels),
            "--threads", "0"], port


@contextmanager
def running(spec: Spec, venvs: dict[str, Venv], release: Release, labels: list[str],
            work: Path) -> Iterator[Handle]:
    """The server of ``spec`` on a free loopback port, stopped (tree and all) afterwards."""
    if spec.kind == "tiered":
        tier = start_tier("edge", release.store, work, *TIERED_FLAGS, timeout=START_TIMEOUT_S)
        try:
            yield Handle(tier.url, tier.pid, tier.log)
        finally:
            try:
                tier.stop()
            except KeyboardInterrupt:
                tier.kill()
                raise
        return
    folder = work / spec.key
    folder.mkdir()
    venv = venvs[spec.kind]
    if spec.kind == "mlserver":
        command, port = mlserver_command(spec, venv, release, labels, folder)
        env = peer_env(venv, HERE)
    else:
        command, port = kserve_command(venv, release, labels)
        env = peer_env(venv)
    log = work / f"{spec.key}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=folder,
                                   env=env, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, process, log)
        yield Handle(url, process.pid, log)
    finally:
        stop_tree(process)


# --- answers ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Answer:
    label: str
    probabilities: tuple[float, ...]


def parse_answer(key: str, response: httpx.Response) -> Answer:
    if response.status_code != 200:
        raise RuntimeError(f"{key}: HTTP {response.status_code}: {response.text[:500]}")
    body = response.json()
    outputs = {o["name"]: o for o in body.get("outputs", [])}
    probs, label = outputs.get("probabilities"), outputs.get("label")
    if probs is None or probs["datatype"] != "FP32" or list(probs["shape"]) != [1, 2]:
        raise RuntimeError(f"{key}: no FP32 [1, 2] 'probabilities' output: {body}")
    if label is None or label["datatype"] != "BYTES" or list(label["shape"]) != [1]:
        raise RuntimeError(f"{key}: no BYTES [1] 'label' output: {body}")
    if key == "tiered" and body.get("parameters", {}).get("escalated", 0):
        raise RuntimeError(f"{key}: the edge escalated with threshold 0: {body}")
    return Answer(str(label["data"][0]), tuple(float(p) for p in probs["data"]))


def answers(key: str, url: str, bodies: Sequence[str], parallel: int) -> list[Answer]:
    """One request per body, ``parallel`` in flight (batching servers batch them)."""
    with httpx.Client(timeout=30, headers={"Content-Type": "application/json"}) as client, \
            ThreadPoolExecutor(parallel) as pool:
        target = f"{url}/v2/models/{MODEL}/infer"
        responses = list(pool.map(lambda body: client.post(target, content=body), bodies))
    return [parse_answer(key, r) for r in responses]


@dataclass(frozen=True)
class Agreement:
    rows: int
    same_label: int
    max_abs_diff: float  # largest |p_peer - p_tiered| over rows and classes

    @property
    def share(self) -> float:
        return self.same_label / self.rows if self.rows else math.nan


def agreement(reference: Sequence[Answer], other: Sequence[Answer]) -> Agreement:
    same = sum(a.label == b.label for a, b in zip(reference, other, strict=True))
    diff = max((abs(x - y) for a, b in zip(reference, other, strict=True)
                for x, y in zip(a.probabilities, b.probabilities, strict=True)), default=0.0)
    return Agreement(len(reference), same, diff)


# --- measuring -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Result:
    server: str
    concurrency: int
    load: Load
    peak_rss_mib: float
    usage: Usage


@dataclass
class Outcome:
    spec: Spec
    results: list[Result] = field(default_factory=list)
    alone: list[Answer] = field(default_factory=list)  # one request in flight
    check: list[Answer] = field(default_factory=list)  # CHECK_PARALLEL in flight


def measure(plan: Plan, spec: Spec, handle: Handle, concurrency: int) -> Result:
    base = Cpu.now()
    start = Cpu(base.machine_s, base.own_s, tree_cpu_s(handle.pid))
    with PeakRss(handle.pid) as rss:
        load = wrk(plan, handle.url, concurrency, plan.seconds)
    end_base = Cpu.now()
    usage = Cpu(end_base.machine_s, end_base.own_s, tree_cpu_s(handle.pid)).cores_since(
        start, load.seconds)
    result = Result(spec.key, concurrency, load, rss.peak_mib, usage)
    console.log(f"{spec.label:28} c={concurrency:<2} {load.rps:8.1f} req/s  "
                f"p50 {load.p50_ms:7.2f} ms  p99 {load.p99_ms:7.2f} ms  errors {load.errors}  "
                f"peak RSS {rss.peak_mib:6.0f} MiB  server {usage.server_cores:.2f} cores, "
                f"others {usage.other_cores:.2f}")
    return result


def run_server(plan: Plan, spec: Spec, venvs: dict[str, Venv], release: Release,
               labels: list[str], check_bodies: Sequence[str],
               levels: Sequence[int]) -> Outcome:
    outcome = Outcome(spec)
    console.log(f"starting {spec.label}")
    with running(spec, venvs, release, labels, plan.logs) as handle:
        outcome.alone = answers(spec.key, handle.url, check_bodies[:CHECK_ALONE], 1)
        outcome.check = answers(spec.key, handle.url, check_bodies, CHECK_PARALLEL)
        wrk(plan, handle.url, WARMUP_CONCURRENCY, plan.warmup)
        outcome.results = [measure(plan, spec, handle, c) for c in levels]
    return outcome


# --- verdict ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class LevelVerdict:
    concurrency: int
    tiered_rps: float
    tiered_p99_ms: float
    best_peer: str
    peer_rps: float
    peer_p99_ms: float

    @property
    def ratio(self) -> float:
        return self.tiered_rps / self.peer_rps if self.peer_rps else math.inf

    @property
    def met(self) -> bool:
        return self.ratio >= GOAL_RATIO and self.tiered_p99_ms <= self.peer_p99_ms


@dataclass(frozen=True)
class Verdict:
    levels: list[LevelVerdict]
    tiered_errors: int

    @property
    def assessed(self) -> bool:
        return bool(self.levels)

    @property
    def met(self) -> bool:
        return self.assessed and self.tiered_errors == 0 and all(v.met for v in self.levels)

    def line(self, labels: dict[str, str]) -> str:
        goal = (f"Goal: Tiered edge >= {GOAL_RATIO:g}x the best peer's req/s at equal or lower "
                f"p99 at every concurrency >= {GOAL_FROM}, zero errors")
        if not self.assessed:
            return f"{goal}: not assessed (no run at concurrency >= {GOAL_FROM})"
        parts = [f"c={v.concurrency}: {v.ratio:.2f}x {labels[v.best_peer]} "
                 f"(p99 {v.tiered_p99_ms:.1f} vs {v.peer_p99_ms:.1f} ms) "
                 f"{'ok' if v.met else 'short'}" for v in self.levels]
        return (f"{goal}: **{'met' if self.met else 'missed'}** — " + "; ".join(parts)
                + f"; Tiered errors {self.tiered_errors}")


def verdict(outcomes: Sequence[Outcome]) -> Verdict:
    tiered = next(o for o in outcomes if o.spec.kind == "tiered")
    peers = [r for o in outcomes if o.spec.kind != "tiered" for r in o.results]
    levels = []
    for mine in tiered.results:
        rivals = [r for r in peers if r.concurrency == mine.concurrency]
        if mine.concurrency < GOAL_FROM or not rivals:
            continue
        best = max(rivals, key=lambda r: r.load.rps)
        levels.append(LevelVerdict(mine.concurrency, mine.load.rps, mine.load.p99_ms,
                                   best.server, best.load.rps, best.load.p99_ms))
    return Verdict(levels, sum(r.load.errors for r in tiered.results))


# --- report ----------------------------------------------------------------------------------

def fmt(value: float, digits: int = 1) -> str:
    return "-" if math.isnan(value) else f"{value:.{digits}f}"


def results_table(outcomes: Sequence[Outcome]) -> Table:
    table = Table(title="Same load, same model: req/s, latency, errors, memory")
    columns = ("server", "conc", "req/s", "p50 ms", "p99 ms", "errors", "peak RSS MiB",
               "server cores", "others' cores")
    for column in columns:
        table.add_column(column, justify="left" if column == "server" else "right")
    for o in outcomes:
        for r in o.results:
            others = r.usage.other_cores
            table.add_row(o.spec.label, str(r.concurrency), fmt(r.load.rps),
                          fmt(r.load.p50_ms, 2), fmt(r.load.p99_ms, 2), str(r.load.errors),
                          fmt(r.peak_rss_mib, 0), f"{r.usage.server_cores:.2f}",
                          cores(others))
    return table


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


def markdown(context: Context, outcomes: Sequence[Outcome], result: Verdict) -> str:
    labels = {o.spec.key: o.spec.label for o in outcomes}
    lines = ["## Tiered edge vs MLServer and KServe", "",
             f"Measured {context.date} on {context.machine}, git {context.commit}; "
             f"{context.wrk}, {context.duration} s per run after a {context.warmup} s warm-up "
             f"at concurrency {WARMUP_CONCURRENCY}, load generator and server on the same "
             f"machine.", "", "Settings:", ""]
    lines += [f"- **{labels.get(k, k)}**: {v}" for k, v in context.settings.items()]
    lines += [f"- Load: {TEXTS} test-split review texts rotated, one per request, the same V2 "
              f"JSON bodies for every server (BYTES input `text` of shape [1], "
              f"`\"parameters\": {{\"threshold\": 0}}`, which the peers ignore).",
              f"- Model: demo release `{MODEL}` {context.release}, INT8 ONNX, onnxruntime CPU "
              f"with the edge's session options (graph optimizations all, default intra-op "
              f"threads) in every server."]
    def agreeing(found: dict[str, Agreement]) -> str:
        return "; ".join(f"{labels[k]} {a.same_label}/{a.rows} same label, max |Δp| "
                         f"{a.max_abs_diff:.2g}" for k, a in found.items())

    alone = next(iter(context.alone.values())).rows if context.alone else 0
    rows = next(iter(context.agreement.values())).rows if context.agreement else 0
    lines += [f"- Answers vs the Tiered edge's: the first {alone} texts one request at a time "
              f"(a batch of 1 everywhere): {agreeing(context.alone)}. The first {rows} texts "
              f"with {CHECK_PARALLEL} requests in flight (batching servers batch them, and "
              f"dynamic INT8 quantization depends on the batch-mates): "
              f"{agreeing(context.agreement)}.", "",
              "| server | concurrency | req/s | p50 ms | p99 ms | errors | peak RSS MiB |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for o in outcomes:
        for r in o.results:
            lines.append(f"| {o.spec.label} | {r.concurrency} | {fmt(r.load.rps)} | "
                         f"{fmt(r.load.p50_ms, 2)} | {fmt(r.load.p99_ms, 2)} | {r.load.errors} "
                         f"| {fmt(r.peak_rss_mib, 0)} |")
    busy = max((r.usage.other_cores for o in outcomes for r in o.results), default=0.0)
    lines += ["", result.line(labels), ""]
    if busy > BUSY_OTHERS:
        lines += [f"Other processes used up to {busy:.2f} cores during a run: the machine was "
                  f"shared and the numbers are skewed.", ""]
    return "\n".join(lines)


def as_json(context: Context, outcomes: Sequence[Outcome], result: Verdict) -> dict[str, Any]:
    return {
        "context": {**asdict(context),
                    **{name: {k: {**asdict(a), "share": a.share} for k, a in found.items()}
                       for name, found in (("alone", context.alone),
                                           ("agreement", context.agreement))}},
        "servers": [{"key": o.spec.key, "label": o.spec.label, "kind": o.spec.kind,
                     "processes": o.spec.processes,
                     **({"parallel_workers": o.spec.workers} if o.spec.kind == "mlserver"
                        else {})} for o in outcomes],
        "runs": [{"server": r.server, "concurrency": r.concurrency, "rps": r.load.rps,
                  **asdict(r.load), "peak_rss_mib": r.peak_rss_mib, **asdict(r.usage)}
                 for o in outcomes for r in o.results],
        "goal": {"ratio": GOAL_RATIO, "from_concurrency": GOAL_FROM, "met": result.met,
                 "assessed": result.assessed, "tiered_errors": result.tiered_errors,
                 "levels": [{**asdict(v), "ratio": v.ratio, "met": v.met}
                            for v in result.levels]},
    }


# --- main ------------------------------------------------------------------------------------

def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = bench_parser(__doc__, "3 s runs at concurrency 1 and 32 only, 1 s warm-up, "
                          "MLServer with parallel_workers 1 only (a smoke run)")
    parser.add_argument("--mlserver-workers", default=None,
                        help="comma-separated MLServer parallel_workers values to run "
                             "(default 1,0; 1 with --quick)")
    parser.add_argument("--json", type=Path, help="write the raw numbers here")
    args = parse_bench_args(parser, argv)
    try:
        workers = [int(w) for w in (args.mlserver_workers or ("1" if args.quick else "1,0"))
                   .split(",")]
    except ValueError:
        parser.error("--mlserver-workers takes comma-separated integers, e.g. 1,0")
    if any(w < 0 for w in workers) or len(set(workers)) != len(workers):
        parser.error("--mlserver-workers: distinct values >= 0")
    args.mlserver_workers = workers
    return args


def specs(workers: Sequence[int]) -> list[Spec]:
    mlserver, kserve = pinned(PINS["mlserver"])["mlserver"], pinned(PINS["kserve"])["kserve"]
    out = [Spec("tiered", "tiered", "Tiered edge")]
    for w in workers:
        out.append(Spec("mlserver" if w == workers[0] else f"mlserver-w{w}", "mlserver",
                        f"MLServer {mlserver} (workers {w})", w))
    out.append(Spec("kserve", "kserve", f"KServe {kserve}"))
    return out


def settings_lines(outcomes: Sequence[Outcome], venvs: dict[str, Venv]) -> dict[str, str]:
    lines: dict[str, str] = {}
    for o in outcomes:
        s = o.spec
        if s.kind == "tiered":
            lines[s.key] = (f"`edge {' '.join(TIERED_FLAGS)}` (batching = its defaults: "
                            f"{MAX_BATCH_SIZE} rows, {MAX_BATCH_DELAY_MS:g} ms; response cache "
                            f"off; no center); processes: {s.processes}; tiered "
                            f"{metadata.version('tiered')}, onnxruntime "
                            f"{metadata.version('onnxruntime')}, tokenizers "
                            f"{metadata.version('tokenizers')}")
        elif s.kind == "mlserver":
            lines[s.key] = (f"custom runtime `bench/peers/mlserver_runtime.py`; adaptive "
                            f"batching max_batch_size {MAX_BATCH_SIZE}, max_batch_time "
                            f"{MAX_BATCH_DELAY_MS / 1000:g} s; parallel_workers {s.workers} "
                            f"(MLServer's default is 1); processes: {s.processes}; other "
                            f"settings default (debug: access log on); "
                            f"{pins_text(venvs['mlserver'])}")
        else:
            lines[s.key] = (f"`kserve.ModelServer` with `bench/peers/kserve_server.py`, 1 "
                            f"uvicorn worker, gRPC off, default logging; **no adaptive "
                            f"batching** (KServe's batcher is the Go agent sidecar on "
                            f"Kubernetes, V1 protocol only; the Python server runs one request "
                            f"per model execution); processes: {s.processes}; "
                            f"{pins_text(venvs['kserve'])}")
    return lines


def pins_text(venv: Venv) -> str:
    return ", ".join(f"{n} {v}" for n, v in venv.versions.items())


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    levels = QUICK_CONCURRENCY if args.quick else CONCURRENCY
    warmup = 1 if args.quick else 2
    wrk_path = ensure_wrk()
    venvs = {name: ensure_venv(name, pins) for name, pins in PINS.items()}
    for venv in venvs.values():
        console.log(f"{venv.name} venv: {venv.describe()}: {pins_text(venv)}")
    texts = review_texts(TEXTS)
    wanted = specs(args.mlserver_workers)
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="bench-peers-") as tmp:
        work = Path(tmp)
        release = pull(args.registry, "edge", work / "store")
        manifest = json.loads((release.folder / "release.json").read_text())
        labels = [str(label) for label in manifest["labels"]]
        bodies = write_bodies(texts, work / "bodies.jsonl", threshold=0)
        check_bodies = bodies.read_text().splitlines()[:QUICK_CHECK_TEXTS if args.quick
                                                       else CHECK_TEXTS]
        console.log(f"{MODEL} version {release.folder.name}: {release.model_file.name}, "
                    f"max_length {release.max_length}, labels {labels}")
        plan = Plan(wrk_path, work, bodies, args.duration, warmup, 0)
        for spec in wanted:
            outcomes.append(run_server(plan, spec, venvs, release, labels, check_bodies,
                                       levels))
    alone = {o.spec.key: agreement(outcomes[0].alone, o.alone) for o in outcomes[1:]}
    agree = {o.spec.key: agreement(outcomes[0].check, o.check) for o in outcomes[1:]}
    for key in agree:
        console.log(f"answers {key} vs the Tiered edge: one at a time {alone[key].same_label}/"
                    f"{alone[key].rows} same label, max |Δp| {alone[key].max_abs_diff:.2g}; "
                    f"{CHECK_PARALLEL} in flight {agree[key].same_label}/{agree[key].rows}, "
                    f"max |Δp| {agree[key].max_abs_diff:.2g}")
    context = Context(
        date=datetime.now().astimezone().isoformat(timespec="seconds"),
        machine=f"{cpu()}, {len(os.sched_getaffinity(0))} usable cores, Python "
                f"{sys.version.split()[0]}",
        commit=git_commit(), duration=args.duration, warmup=warmup,
        wrk=f"{wrk_version(wrk_path).split('[')[0].strip()} -t1",
        release=f"version {release.folder.name}",
        settings=settings_lines(outcomes, venvs),
        versions={name: v.versions for name, v in venvs.items()},
        venvs={name: v.describe() for name, v in venvs.items()}, alone=alone, agreement=agree)
    result = verdict(outcomes)
    servers = Table(title="Servers", show_header=False)
    for o in outcomes:
        servers.add_row(o.spec.label, context.settings[o.spec.key].replace("**", ""))
    console.print(servers)
    console.print(results_table(outcomes))
    labels_by_key = {o.spec.key: o.spec.label for o in outcomes}
    console.print(result.line(labels_by_key).replace("**", ""))
    if args.markdown:
        args.markdown.write_text(markdown(context, outcomes, result) + "\n")
        console.log(f"wrote {args.markdown}")
    if args.json:
        args.json.write_text(json.dumps(as_json(context, outcomes, result), indent=2) + "\n")
        console.log(f"wrote {args.json}")


if __name__ == "__main__":
    main()
