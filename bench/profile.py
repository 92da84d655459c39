"""Where a tier server's time goes under load: py-spy samples the server while wrk drives it.

    .venv/bin/python -m bench.profile [--tier edge|center] [--concurrency 32] [--duration 15]
        [--flame PATH.svg] [--markdown PATH] [--registry HOME] [-- extra server flags]

Prints the process's CPU (all threads, from /proc) beside the Python threads' samples, grouped
by what the code was doing (HTTP server, framework, parse, tokenize, batcher, model call,
cascade, metrics, logging, encode), and the functions with the most samples of their own.
``--flame`` also writes py-spy's flame graph (SVG). The model runtime's own worker threads
(onnxruntime's intra-op pool, torch's) are not Python threads: py-spy does not see them, the
CPU column does. How it measures: docs/benchmark-methods.md, "Profile".
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.table import Table

from bench.harness import (
    BIN,
    MODEL,
    TEXTS,
    Cpu,
    Plan,
    bench_parser,
    console,
    ensure_wrk,
    parse_bench_args,
    pull,
    review_texts,
    server,
    wrk,
)
from bench.kit import machine, write_bodies
from bench.markdown import Shown

RATE = 200  # samples per second
# (group, substrings of a frame "function (file:line)"), matched from the innermost frame out:
# the first frame that matches names the group of the sample
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("model call", ("onnxruntime/", "torch/", "center/runtime.py", "edge/runtime.py")),
    ("tokenize", ("serving/model/text.py",)),
    ("parse request", ("serving/protocol/v2.py (parse", "validate (serving/protocol/v2.py",
                       "_texts (serving/protocol/v2", "_token_rows", "_data (serving/protocol/v2",
                       "_json_data", "decode (serving/protocol/v2",
                       "_tensors (serving/protocol/v2")),
    ("encode response", ("encode_http", "encode_response", "classify.py", "raw_bytes")),
    ("metrics", ("prometheus_client/", "serving/telemetry/quality.py",
                 "serving/telemetry/metrics.py")),
    ("logging", ("logging/", "serving/telemetry/logs.py")),
    ("tracing", ("serving/telemetry/tracing.py", "opentelemetry/")),
    ("batcher", ("serving/runtime/batcher.py",)),
    ("cascade (cache, gate, softmax)", ("edge/", "serving/model/scores.py", "center/service.py")),
    ("data plane", ("serving/dataplane.py", "serving/runtime/repository.py")),
    ("framework (Litestar)", ("litestar/", "serving/transport/rest.py")),
    ("HTTP server (uvicorn)", ("uvicorn/", "httptools", "serving/transport/httpserver.py")),
    ("event loop, threads", ("asyncio/", "uvloop", "concurrent/futures", "threading.py")),
)


@dataclass(frozen=True)
class Profile:
    samples: int
    groups: dict[str, int]
    own: list[tuple[str, int]]  # (function, samples of its own)
    seconds: float
    cpu_cores: float  # the server process, all threads
    rps: float


def group(frames: Sequence[str]) -> str:
    for frame in reversed(frames):
        for name, needles in GROUPS:
            if any(n in frame for n in needles):
                return name
    return "other"


def summarise(raw: Path) -> tuple[int, dict[str, int], list[tuple[str, int]]]:
    """py-spy's raw (collapsed) output: ``frame;frame;... count`` per line."""
    groups: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames, n = stack.split(";"), int(count)
        total += n
        groups[group(frames)] += n
        own[frames[-1]] += n
    return total, dict(groups), own.most_common(15)


def py_spy() -> str:
    found = shutil.which("py-spy", path=str(BIN)) or shutil.which("py-spy")
    if found is None:
        raise SystemExit("py-spy is not installed: .venv/bin/pip install py-spy")
    return found


def record(plan: Plan, tier: str, store: Path, concurrency: int, flags: Sequence[str],
           flame: Path | None) -> Profile:
    spy = py_spy()
    with server(tier, store, plan.logs, *flags) as handle:
        wrk(plan, handle.url, concurrency, plan.warmup)
        raw = plan.logs / "profile.txt"
        seconds = plan.seconds
        # --gil: only the thread holding the GIL is sampled, so the samples are Python's
        # serial work (native code that releases the GIL, onnxruntime's run, does not count)
        command = [spy, "record", "-p", str(handle.pid), "--subprocesses", "-d", str(seconds),
                   "-r", str(RATE), "--gil", "--nonblocking", "--format", "raw", "-o", str(raw)]
        started, cpu = time.perf_counter(), Cpu.now(handle.pid)
        sampler = subprocess.Popen(command, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
        load = wrk(plan, handle.url, concurrency, seconds)
        usage = Cpu.now(handle.pid).cores_since(cpu, time.perf_counter() - started)
        sampler.wait(timeout=seconds + 60)
        if flame is not None:  # a second, shorter recording for the picture
            flame.parent.mkdir(parents=True, exist_ok=True)
            svg = subprocess.Popen([spy, "record", "-p", str(handle.pid), "--subprocesses",
                                    "-d", "5", "-r", str(RATE), "--nonblocking", "-o",
                                    str(flame)],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            wrk(plan, handle.url, concurrency, 5)
            svg.wait(timeout=120)
    total, groups, own = summarise(raw)
    return Profile(total, groups, own, seconds, usage.server_cores, load.rps)


def groups_table(profile: Profile, title: str) -> Table:
    table = Table(title=title)
    for column in ("what", "share of GIL samples", "≈ µs per request"):
        table.add_column(column, justify="left" if column == "what" else "right")
    per_request = 1e6 * profile.seconds / max(1.0, profile.rps * profile.seconds)
    ordered = sorted(profile.groups.items(), key=lambda kv: -kv[1])
    for name, n in ordered:
        share = n / profile.samples if profile.samples else 0.0
        # samples / rate = seconds a Python thread spent there; spread over the requests
        us = 1e6 * n / RATE / max(1.0, profile.rps * profile.seconds)
        table.add_row(name, f"{share:.1%}", f"{us:.0f}")
    table.caption = (f"{profile.rps:.0f} req/s; server process {profile.cpu_cores:.2f} cores "
                     f"(all threads) = {profile.cpu_cores * per_request:.0f} µs of CPU per "
                     f"request; {profile.samples} samples at {RATE}/s of the thread holding "
                     f"the GIL ({profile.samples / RATE / profile.seconds:.0%} of the time)")
    return table


def own_table(profile: Profile) -> Table:
    table = Table(title="Functions with the most samples of their own")
    table.add_column("function")
    table.add_column("share", justify="right")
    for name, n in profile.own:
        table.add_row(name, f"{n / profile.samples:.1%}")
    return table


def main(argv: Sequence[str] | None = None) -> None:
    parser = bench_parser(__doc__, "5 s of sampling")
    parser.add_argument("--tier", choices=("edge", "center"), default="edge")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--flame", type=Path, default=None, help="write a flame graph (SVG)")
    parser.add_argument("flags", nargs=argparse.REMAINDER,
                        help="after --: extra server flags (e.g. -- --workers 2)")
    args = parse_bench_args(parser, argv)
    flags = [f for f in args.flags if f != "--"]
    show = Shown(console)
    wrk_path = ensure_wrk()
    with tempfile.TemporaryDirectory(prefix="bench-profile-") as tmp:
        work = Path(tmp)
        release = pull(args.registry, args.tier, work / args.tier)
        bodies = write_bodies(review_texts(TEXTS), work / "bodies.jsonl", threshold=0)
        plan = Plan(wrk_path, work, bodies, args.duration, 2, 0)
        server_flags = (*(("--cache-size", "0") if args.tier == "edge" else ()), *flags)
        profile = record(plan, args.tier, release.store, args.concurrency, server_flags,
                         args.flame)
    table = Table(title="Machine", show_header=False)
    for key, value in machine(load=f"wrk -t1 -c{args.concurrency}, {args.duration} s, "
                                   f"{TEXTS} texts rotated, 1 per request",
                              server=f"{args.tier} {' '.join(server_flags)}",
                              model=MODEL).items():
        table.add_row(key, value)
    show(table)
    show(groups_table(profile, f"Where the {args.tier}'s Python time goes at concurrency "
                               f"{args.concurrency}"))
    show(own_table(profile))
    if args.markdown:
        show.write(args.markdown, f"Profile: the {args.tier} under load")


if __name__ == "__main__":
    main()
