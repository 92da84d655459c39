"""The peer comparison's measurements: pinned peer venvs, process trees (peak RSS, CPU), the three
servers started on the same release, their answers compared, wrk runs and the verdict. How
and why: docs/benchmark-methods.md, "Peers".
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.harness import MODEL, Cpu, Plan, Release, Usage, console, wrk
from bench.kit import ROOT
from harness.load import Load, descendants, tree_cpu_s
from harness.processes import free_port, start_tier
from serving.transport.workers import threads_per_worker

HERE = Path(__file__).resolve().parent
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
MULTI_ROWS, MULTI_CONCURRENCY = 32, 8  # then 32 texts per request, 8 requests in flight
WARMUP_CONCURRENCY = 32
MAX_BATCH_SIZE = 32
MAX_BATCH_DELAY_MS = 5.0
TIERED_FLAGS = ("--cache-size", "0", "--threads", "0", "--max-batch-size", str(MAX_BATCH_SIZE),
                "--max-batch-delay-ms", f"{MAX_BATCH_DELAY_MS:g}")
CHECK_TEXTS, QUICK_CHECK_TEXTS, CHECK_PARALLEL = 64, 24, 8
CHECK_ALONE = 8  # texts sent one at a time first: a batch of 1 everywhere, answers must match
GOAL_RATIO, GOAL_FROM = 1.5, 8
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
    workers: int = 1  # MLServer parallel_workers; Tiered's --workers; KServe's --workers

    @property
    def processes(self) -> str:
        if self.kind == "mlserver":
            return ("2 (HTTP front + 1 inference worker)" if self.workers == 1 else
                    "1 (inference in the front process)" if self.workers == 0 else
                    f"{self.workers + 1} (HTTP front + {self.workers} inference workers)")
        if self.workers > 1:
            return f"{self.workers + 1} (a supervisor + {self.workers} serving workers)"
        return "1"

    @property
    def serving(self) -> int:
        """Processes that serve requests (a supervisor that only accepts does not count):
        the goal compares servers with as many."""
        if self.kind == "mlserver":
            return self.workers + 1 if self.workers else 1
        return max(1, self.workers)


@dataclass(frozen=True)
class Handle:
    url: str
    pid: int
    log: Path


@dataclass(frozen=True)
class Served:
    """The model every server serves: the Tiered edge from its store, the peers from its INT8
    ONNX file with their runtime of its kind (text: ``onnx_text.py``, tokenized; image:
    ``onnx_image.py``, FP32 in the model's layout)."""

    name: str  # the V2 model name
    store: Path  # the Tiered edge's model store
    version: str
    onnx: Path
    labels: list[str]
    kind: str = "text"  # text | image
    tokenizer: Path | None = None
    max_length: int = 0

    @classmethod
    def text(cls, release: Release, labels: list[str]) -> Served:
        return cls(MODEL, release.store, release.folder.name, release.model_file, labels,
                   "text", release.tokenizer, release.max_length)

    @property
    def classes(self) -> int:
        return len(self.labels)


def wait_ready(url: str, process: subprocess.Popen[bytes], log: Path,
               model: str = MODEL) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited {process.returncode}: {log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/v2/models/{model}/ready", timeout=2).status_code == 200:
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


def mlserver_command(spec: Spec, venv: Venv, served: Served,
                     folder: Path) -> tuple[list[str], int]:
    """Write settings.json and MODEL/model-settings.json into ``folder``."""
    port = free_port()
    settings = {"host": "127.0.0.1", "http_port": port, "grpc_port": free_port(),
                "metrics_port": free_port(), "parallel_workers": spec.workers,
                "metrics_dir": str(folder / ".metrics"),
                "environments_dir": str(folder / ".envs")}
    extra: dict[str, object] = {"labels": served.labels, "threads": 0}
    if served.kind == "text":
        extra |= {"tokenizer": str(served.tokenizer), "max_length": served.max_length}
    runtime = "OnnxTextClassifier" if served.kind == "text" else "OnnxImageClassifier"
    model = {"name": served.name, "implementation": f"mlserver_runtime.{runtime}",
             "max_batch_size": MAX_BATCH_SIZE, "max_batch_time": MAX_BATCH_DELAY_MS / 1000,
             "parameters": {"uri": str(served.onnx), "version": served.version,
                            "extra": extra}}
    (folder / served.name).mkdir(parents=True)
    (folder / "settings.json").write_text(json.dumps(settings, indent=2))
    (folder / served.name / "model-settings.json").write_text(json.dumps(model, indent=2))
    return [str(venv.bin / "mlserver"), "start", str(folder)], port


def kserve_command(venv: Venv, served: Served, workers: int) -> tuple[list[str], int]:
    port = free_port()
    kind = (["--tokenizer", str(served.tokenizer), "--max_length", str(served.max_length)]
            if served.kind == "text" else ["--kind", served.kind])
    return [str(venv.bin / "python"), str(HERE / "kserve_server.py"), "--model_name",
            served.name, "--http_port", str(port), "--enable_grpc", "false", "--workers",
            str(workers), "--onnx", str(served.onnx), *kind, "--labels",
            ",".join(served.labels),
            # several workers: the cores shared out as intra-op threads, as Tiered's are
            "--threads", str(threads_per_worker(0, workers))], port


@contextmanager
def running(spec: Spec, venvs: dict[str, Venv], served: Served,
            work: Path) -> Iterator[Handle]:
    """The server of ``spec`` on a free loopback port, stopped (tree and all) afterwards."""
    if spec.kind == "tiered":
        flags = (*TIERED_FLAGS, *(("--workers", str(spec.workers)) if spec.workers > 1 else ()))
        tier = start_tier("edge", served.store, work, *flags, timeout=START_TIMEOUT_S)
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
        command, port = mlserver_command(spec, venv, served, folder)
        env = peer_env(venv, HERE)
    else:
        command, port = kserve_command(venv, served, spec.workers)
        env = peer_env(venv)
    log = work / f"{spec.key}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=folder,
                                   env=env, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, process, log, served.name)
        yield Handle(url, process.pid, log)
    finally:
        stop_tree(process)


# --- answers ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Answer:
    label: str
    probabilities: tuple[float, ...]


def parse_answer(key: str, response: httpx.Response, classes: int = 2) -> Answer:
    if response.status_code != 200:
        raise RuntimeError(f"{key}: HTTP {response.status_code}: {response.text[:500]}")
    body = response.json()
    outputs = {o["name"]: o for o in body.get("outputs", [])}
    probs, label = outputs.get("probabilities"), outputs.get("label")
    if probs is None or probs["datatype"] != "FP32" or list(probs["shape"]) != [1, classes]:
        raise RuntimeError(f"{key}: no FP32 [1, {classes}] 'probabilities' output: {body}")
    if label is None or label["datatype"] != "BYTES" or list(label["shape"]) != [1]:
        raise RuntimeError(f"{key}: no BYTES [1] 'label' output: {body}")
    if key == "tiered" and body.get("parameters", {}).get("escalated", 0):
        raise RuntimeError(f"{key}: the edge escalated with threshold 0: {body}")
    return Answer(str(label["data"][0]), tuple(float(p) for p in probs["data"]))


def answers(key: str, url: str, bodies: Sequence[str], parallel: int, model: str = MODEL,
            classes: int = 2) -> list[Answer]:
    """One request per body, ``parallel`` in flight (batching servers batch them)."""
    with httpx.Client(timeout=30, headers={"Content-Type": "application/json"}) as client, \
            ThreadPoolExecutor(parallel) as pool:
        target = f"{url}/v2/models/{model}/infer"
        responses = list(pool.map(lambda body: client.post(target, content=body), bodies))
    return [parse_answer(key, r, classes) for r in responses]


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
    rows: int = 1  # texts per request

    @property
    def rows_per_s(self) -> float:
        return self.load.rps * self.rows


@dataclass
class Outcome:
    spec: Spec
    results: list[Result] = field(default_factory=list)
    alone: list[Answer] = field(default_factory=list)  # one request in flight
    check: list[Answer] = field(default_factory=list)  # CHECK_PARALLEL in flight


def measure(plan: Plan, spec: Spec, handle: Handle, concurrency: int, rows: int = 1) -> Result:
    base = Cpu.now()
    start = Cpu(base.machine_s, base.own_s, tree_cpu_s(handle.pid))
    with PeakRss(handle.pid) as rss:
        load = wrk(plan, handle.url, concurrency, plan.seconds)
    end_base = Cpu.now()
    usage = Cpu(end_base.machine_s, end_base.own_s, tree_cpu_s(handle.pid)).cores_since(
        start, load.seconds)
    result = Result(spec.key, concurrency, load, rss.peak_mib, usage, rows)
    console.log(f"{spec.label:28} c={concurrency:<2} rows {rows:<2} {load.rps:8.1f} req/s  "
                f"p50 {load.p50_ms:7.2f} ms  p99 {load.p99_ms:7.2f} ms  errors {load.errors}  "
                f"peak RSS {rss.peak_mib:6.0f} MiB  server {usage.server_cores:.2f} cores, "
                f"others {usage.other_cores:.2f}")
    return result


def run_server(plan: Plan, spec: Spec, venvs: dict[str, Venv], served: Served,
               check_bodies: Sequence[str], levels: Sequence[int],
               multi: Plan | None = None) -> Outcome:
    """The server's answers, then wrk at each of ``levels`` (one row per request) and, with
    ``multi`` (its bodies hold MULTI_ROWS rows each), at MULTI_CONCURRENCY."""
    outcome = Outcome(spec)
    console.log(f"starting {spec.label}")
    with running(spec, venvs, served, plan.logs) as handle:
        ask = (served.name, served.classes)
        outcome.alone = answers(spec.key, handle.url, check_bodies[:CHECK_ALONE], 1, *ask)
        outcome.check = answers(spec.key, handle.url, check_bodies, CHECK_PARALLEL, *ask)
        wrk(plan, handle.url, WARMUP_CONCURRENCY, plan.warmup)
        outcome.results = [measure(plan, spec, handle, c) for c in levels]
        if multi is not None:
            outcome.results.append(measure(multi, spec, handle, MULTI_CONCURRENCY, MULTI_ROWS))
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
    tiered: str = "tiered"  # the Tiered configuration judged
    @property
    def assessed(self) -> bool:
        return bool(self.levels)

    @property
    def met(self) -> bool:
        return self.assessed and self.tiered_errors == 0 and all(v.met for v in self.levels)

    def line(self, labels: dict[str, str]) -> str:
        goal = (f"Goal: {labels[self.tiered]} >= {GOAL_RATIO:g}x the req/s of the best peer "
                f"with as many serving processes, at equal or lower p99, at every concurrency "
                f">= {GOAL_FROM}, zero errors")
        if not self.assessed:
            return f"{goal}: not assessed (no run at concurrency >= {GOAL_FROM})"
        parts = [f"c={v.concurrency}: {v.ratio:.2f}x {labels[v.best_peer]} "
                 f"(p99 {v.tiered_p99_ms:.1f} vs {v.peer_p99_ms:.1f} ms) "
                 f"{'ok' if v.met else 'short'}" for v in self.levels]
        return (f"{goal}: **{'met' if self.met else 'missed'}** — " + "; ".join(parts)
                + f"; Tiered errors {self.tiered_errors}")


def verdicts(outcomes: Sequence[Outcome]) -> list[Verdict]:
    """One verdict per Tiered configuration, each against the best of every peer's."""
    return [verdict(outcomes, o.spec.key) for o in outcomes if o.spec.kind == "tiered"]


def verdict(outcomes: Sequence[Outcome], key: str = "tiered") -> Verdict:
    """``key`` against the best peer with as many serving processes, at each concurrency."""
    tiered = next(o for o in outcomes if o.spec.key == key)
    peers = [r for o in outcomes if o.spec.kind != "tiered" and o.spec.serving ==
             tiered.spec.serving for r in o.results if r.rows == 1]
    levels = []
    for mine in (r for r in tiered.results if r.rows == 1):
        rivals = [r for r in peers if r.concurrency == mine.concurrency]
        if mine.concurrency < GOAL_FROM or not rivals:
            continue
        best = max(rivals, key=lambda r: r.load.rps)
        levels.append(LevelVerdict(mine.concurrency, mine.load.rps, mine.load.p99_ms,
                                   best.server, best.load.rps, best.load.p99_ms))
    return Verdict(levels, sum(r.load.errors for r in tiered.results), key)
