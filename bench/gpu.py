"""The center on a GPU: throughput and p99 with adaptive batching, concurrency 1..256, fp32 vs
fp16 (and bf16 with ``--bf16``).

    .venv/bin/python -m bench.gpu [--duration S] [--max-batch-size N] [--markdown PATH]

Run by ``bench/gpu.sh`` on a machine with an NVIDIA GPU. How it measures:
docs/benchmark-methods.md, "The center on a GPU".
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from rich.table import Table

from bench.harness import Plan, console, counters, ensure_wrk, pull, review_texts, wrk
from bench.kit import write_bodies
from harness.load import Load
from harness.processes import start_tier

CONCURRENCY = (1, 4, 16, 64, 128, 256)
REGISTRY = Path("var/registry")


def gpu_name() -> str:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        raise SystemExit("no nvidia-smi: bench/gpu.py needs an NVIDIA GPU (see bench/gpu.sh)")
    out = subprocess.run([smi, "--query-gpu=name,memory.total", "--format=csv,noheader"],
                         capture_output=True, text=True, check=True).stdout.strip()
    return out.splitlines()[0]


def gpu_memory_mib() -> float:
    if shutil.which("nvidia-smi") is None:
        return float("nan")
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,"
                          "nounits"], capture_output=True, text=True, check=True).stdout
    return float(out.splitlines()[0])


def run_precision(precision: str, store: Path, plan: Plan, args: argparse.Namespace,
                  ) -> list[tuple[int, Load, float, float]]:
    rows = []
    server = start_tier("center", store, plan.logs, "--device", args.device, "--precision",
                        precision, "--max-batch-size", str(args.max_batch_size),
                        "--max-batch-delay-ms", str(args.max_batch_delay_ms),
                        "--max-queue-rows", "65536", timeout=300)
    try:
        wrk(plan, server.url, 64, plan.warmup)  # CUDA kernels and allocator warmed
        time.sleep(2)  # what the warm-up left queued is done before counting
        for concurrency in args.concurrency:
            before = counters(server.url, "center")
            load = wrk(plan, server.url, concurrency, plan.seconds)
            after = counters(server.url, "center")
            rows.append((concurrency, load, (after - before).mean_batch, gpu_memory_mib()))
            console.log(f"{precision} c={concurrency}: {load.rps:.0f} req/s, "
                        f"p99 {load.p99_ms:.1f} ms")
    finally:
        server.stop()
    return rows


def table(results: dict[str, list[tuple[int, Load, float, float]]]) -> Table:
    t = Table(title="center on CUDA: V2 requests (one review each), adaptive batching")
    for col in ("precision", "concurrency", "req/s", "p50 ms", "p99 ms", "errors",
                "rows/batch", "GPU MiB"):
        t.add_column(col, justify="right")
    for precision, rows in results.items():
        for concurrency, load, batch, memory in rows:
            t.add_row(precision, str(concurrency), f"{load.rps:.0f}", f"{load.p50_ms:.1f}",
                      f"{load.p99_ms:.1f}", str(load.errors), f"{batch:.1f}", f"{memory:.0f}")
    return t


def markdown(results: dict[str, list[tuple[int, Load, float, float]]], gpu: str) -> str:
    lines = ["## The center on a GPU", "",
             f"{gpu}, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, `bench/gpu.sh`.", "",
             "| precision | concurrency | req/s | p50 ms | p99 ms | errors | rows/batch |",
             "|---|---|---|---|---|---|---|"]
    for precision, rows in results.items():
        lines += [f"| {precision} | {c} | {load.rps:.0f} | {load.p50_ms:.1f} | "
                  f"{load.p99_ms:.1f} | {load.errors} | {batch:.1f} |"
                  for c, load, batch, _ in rows]
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--duration", type=int, default=10, help="seconds per wrk run")
    parser.add_argument("--max-batch-size", type=int, default=64)
    parser.add_argument("--max-batch-delay-ms", type=float, default=2.0)
    parser.add_argument("--concurrency", type=int, nargs="+", default=list(CONCURRENCY))
    parser.add_argument("--bf16", action="store_true", help="also measure bf16")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                        help="cpu only to check this script where there is no GPU (the center "
                             "then runs fp32 whatever the precision)")
    parser.add_argument("--markdown", type=Path, default=None)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    gpu = gpu_name() if args.device == "cuda" else "no GPU: --device cpu (a dry run)"
    console.print(f"GPU: {gpu}")
    with tempfile.TemporaryDirectory(prefix="tiered-gpu-") as tmp:
        root = Path(tmp)
        release = pull(REGISTRY, "center", root / "store")
        plan = Plan(wrk=ensure_wrk(), logs=root, seconds=args.duration, warmup=3,
                    bodies=write_bodies(review_texts(2000), root / "bodies.txt", threshold=0),
                    threads=0)
        precisions = ["fp32", "fp16", *(["bf16"] if args.bf16 else [])]
        results = {p: run_precision(p, release.store, plan, args) for p in precisions}
    console.print(table(results))
    if args.markdown:
        args.markdown.write_text(markdown(results, gpu))


if __name__ == "__main__":
    main()
