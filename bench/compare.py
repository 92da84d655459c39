"""A/B of one tier's server between this checkout and another (a refactor's "within noise of
before"): the two servers take turns on the same store and the same bodies under wrk, round
after round (the order alternating), and the table gives each side's median and the ratio.

    git worktree add ../before <commit>      # with a venv of its own: ../before/.venv
    .venv/bin/python -m bench.compare --other ../before [--tier edge] [--rounds 6]

How it measures: docs/benchmark-methods.md, "Comparing two checkouts".
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import httpx
from rich.table import Table

from bench.harness import BIN, MODEL, ROOT, TEXTS, console, ensure_wrk, pull, review_texts
from bench.kit import machine_line, write_bodies
from bench.loadgen import run_wrk
from bench.tiers import BATCHING_ON, EDGE_FLAGS
from harness.processes import free_port

CONCURRENCY = (1, 8, 32)
Results = dict[str, dict[int, list[float]]]  # side -> concurrency -> req/s per round


def serve(side: str, binary: Path, store: Path, logs: Path,
          tier: str) -> tuple[subprocess.Popen[bytes], str]:
    """``binary`` (one checkout's ``edge``/``center``) on a free port, once ready."""
    port = free_port()
    flags = [*BATCHING_ON, *(EDGE_FLAGS if tier == "edge" else ())]
    with (logs / f"{side}-{port}.log").open("wb") as log:
        process = subprocess.Popen([str(binary), "--host", "127.0.0.1", "--port", str(port),
                                    "--grpc-port", "0", "--store", str(store), "--node-id",
                                    f"compare-{port}", *flags], stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if httpx.get(f"{url}/v2/health/ready", timeout=1).status_code == 200:
                return process, url
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    process.kill()
    raise SystemExit(f"{binary} did not become ready (see {logs})")


def summary(results: Results) -> list[tuple[int, float, float, float]]:
    """(concurrency, this checkout's median, the other's, this / other) per concurrency."""
    rows = []
    for concurrency in sorted(results["this"]):
        mine = statistics.median(results["this"][concurrency])
        theirs = statistics.median(results["other"][concurrency])
        rows.append((concurrency, mine, theirs, mine / theirs if theirs else float("nan")))
    return rows


def table(results: Results, tier: str, other: Path, rounds: int, seconds: int) -> Table:
    out = Table(title=f"{tier} server, this checkout vs {other} (req/s, median of {rounds} "
                      f"alternating rounds of {seconds} s)", caption=machine_line())
    for column in ("concurrency", "this", "other", "this / other", "this, each round",
                   "other, each round"):
        out.add_column(column, justify="right")
    for concurrency, mine, theirs, ratio in summary(results):
        out.add_row(str(concurrency), f"{mine:.1f}", f"{theirs:.1f}", f"{ratio:.2f}x",
                    " ".join(f"{v:.0f}" for v in results["this"][concurrency]),
                    " ".join(f"{v:.0f}" for v in results["other"][concurrency]))
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__)
    parser.add_argument("--other", type=Path, required=True,
                        help="the other checkout, with its own .venv (the tier command in it)")
    parser.add_argument("--tier", choices=("edge", "center"), default="edge")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=int, default=8, help="per run")
    parser.add_argument("--registry", type=Path, default=ROOT / "var" / "registry")
    args = parser.parse_args(argv)
    binaries = {"this": BIN / args.tier, "other": args.other.resolve() / ".venv/bin" / args.tier}
    if not binaries["other"].exists():
        raise SystemExit(f"{binaries['other']} does not exist: the other checkout needs a venv")
    wrk = ensure_wrk()
    results: Results = {side: {} for side in binaries}
    with tempfile.TemporaryDirectory(prefix="bench-compare-") as tmp:
        work = Path(tmp)
        release = pull(args.registry, args.tier, work / args.tier)
        bodies = write_bodies(review_texts(TEXTS), work / "bodies.jsonl", threshold=0)
        url_path = f"/v2/models/{MODEL}/infer"
        for round_ in range(args.rounds):
            order = list(binaries.items())
            for side, binary in order if round_ % 2 == 0 else order[::-1]:
                process, url = serve(side, binary, release.store, work, args.tier)
                try:
                    run_wrk(wrk, url + url_path, bodies, 8, 2)  # warm-up
                    for concurrency in CONCURRENCY:
                        run = run_wrk(wrk, url + url_path, bodies, concurrency, args.seconds)
                        if run.errors:
                            raise SystemExit(f"{side}: {run.errors} errors at {concurrency}")
                        results[side].setdefault(concurrency, []).append(run.rps)
                finally:
                    process.terminate()
                    process.wait(timeout=30)
                console.log(f"round {round_ + 1}, {side}: " + ", ".join(
                    f"c={c} {v[-1]:.0f}" for c, v in results[side].items()))
    console.print(table(results, args.tier, args.other, args.rounds, args.seconds))


if __name__ == "__main__":
    main()
