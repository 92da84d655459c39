"""What the serving benchmarks share (``bench.tiers`` for the text model, ``bench.tiers_digits``
for the image model): their settings (concurrencies, batching flags), one server run under wrk
with the server's /metrics counters and cores, and the in-process timing of raw batches."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from bench.harness import Counters, Cpu, Plan, Usage, console, counters, wrk
from bench.kit import BUSY_OTHERS
from harness.load import Load
from harness.processes import TierProcess

CONCURRENCY = (1, 8, 32)
SATURATION = 32
BATCHING_ON = ("--max-batch-size", "32", "--max-batch-delay-ms", "5")
BATCHING_OFF = ("--max-batch-size", "1")
EDGE_FLAGS = ("--cache-size", "0")
WORKERS = 2  # the edge again with --workers 2 (each worker: the cores shared out as threads)

T = TypeVar("T")


@dataclass(frozen=True)
class Run:
    tier: str
    batching: str  # the configuration's name
    concurrency: int
    load: Load
    server: Counters
    usage: Usage


def measure(plan: Plan, handle: TierProcess, tier: str, batching: str, concurrency: int) -> Run:
    before, cpu = counters(handle.url, tier), Cpu.now(handle.pid)
    load = wrk(plan, handle.url, concurrency, plan.seconds)
    usage = Cpu.now(handle.pid).cores_since(cpu, load.seconds)
    run = Run(tier, batching, concurrency, load, counters(handle.url, tier) - before, usage)
    console.log(f"{tier:6} batching {batching:3} c={concurrency:<2} {load.rps:8.1f} req/s  "
                f"p50 {load.p50_ms:7.2f} ms  p99 {load.p99_ms:7.2f} ms  errors {load.errors}  "
                f"server {usage.server_cores:.2f} cores, others {usage.other_cores:.2f}")
    return run


def rotating_batches(rows: Sequence[T], size: int) -> list[list[T]]:
    """Consecutive batches through the rotation until it lines up again (every row equally)."""
    count = len(rows) // math.gcd(len(rows), size)
    return [[rows[(k * size + i) % len(rows)] for i in range(size)] for k in range(count)]


def time_batches(predict: Callable[[Any], object], batches: Sequence[Any],
                 seconds: float) -> tuple[int, float]:
    """(batches run, elapsed seconds) for ``predict`` cycling through ``batches``."""
    for batch in batches[:3]:
        predict(batch)  # warm-up
    done, started = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - started) < seconds:
        predict(batches[done % len(batches)])
        done += 1
    return done, elapsed


def ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f}"


class Timed(Protocol):
    """An in-process timing (text's ``Raw``, the images' ``RawImages``)."""

    @property
    def other_cores(self) -> float: ...


def interference_note(raws: Sequence[Timed], runs: Sequence[Run]) -> str:
    """How busy the rest of the machine was during the raw timings and the server runs."""
    busy = max([r.other_cores for r in raws] + [r.usage.other_cores for r in runs])
    if busy <= BUSY_OTHERS:
        return f"Other processes used at most {busy:.2f} cores during any measurement."
    return (f"[red]Other processes used up to {busy:.2f} cores during a measurement: the "
            f"flagged rows are skewed; rerun on a quiet machine.[/]")
