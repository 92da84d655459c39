"""What ``tiered demo --model digits`` shows under each cascade mode: ``auto`` (the controller,
the default) and ``static`` (every edge at the calibrated threshold), on a real fleet.

    .venv/bin/python -m bench.cascade_modes --release var/demo/digits [--rows 2000]

A ``registry serve``, one center measuring its own capacity and two edges on loopback, as
``tiered up`` runs them; the demo's test PNGs (one per request, concurrency 8, as ``tiered
demo``) are sent half to each edge (nginx balances them so). Auto is measured once the edges
hold budgets (a warm-up of 400 rows lets the center measure itself), then the policy is set
to static and the demo runs again. Prints each mode's tier split and accuracy
(docs/cascade.md, "Spare capacity").
"""

from __future__ import annotations

import asyncio
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import click
import httpx

from harness.processes import BIN, code_path, start_registry, start_tier
from tiered import demo

TOKEN = "bench-token-0123456789"
MODEL = "digits"


def registry(home: Path, *args: str) -> None:
    subprocess.run([str(BIN / "registry"), *args], check=True, capture_output=True,
                   env={"PATH": str(BIN), "REGISTRY_HOME": str(home), **code_path()})


def budget(url: str) -> float:
    for line in httpx.get(f"{url}/metrics", timeout=5).text.splitlines():
        if line.startswith("edge_cascade_budget_rows_per_second{") and MODEL in line:
            return float(line.split()[-1])
    return 0.0


def wait(what: str, ready: Callable[[], bool], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(0.5)
    raise RuntimeError(f"timed out waiting for {what}")


def run_demo(urls: list[str], requests: list[demo.DemoRequest]) -> demo.Outcome:
    """The requests split over the edges, 4 at a time each (8 in all), merged."""
    halves = [requests[i::len(urls)] for i in range(len(urls))]

    async def both() -> list[demo.Outcome]:
        return list(await asyncio.gather(*(demo.run(u, MODEL, len(h), 8 // len(urls),
                                                    requests=h)
                                           for u, h in zip(urls, halves, strict=True))))

    merged = demo.Outcome()
    for o in asyncio.run(both()):
        merged.sent += o.sent
        merged.failed += o.failed
        merged.correct += o.correct
        merged.rows_by_tier.update(o.rows_by_tier)
    return merged


def show(mode: str, o: demo.Outcome) -> None:
    tiers: Counter[str] = o.rows_by_tier
    total = sum(tiers.values())
    split = ", ".join(f"{t} {n} ({n / total:.1%})" for t, n in sorted(tiers.items()))
    print(f"{mode}: {o.answered} answered, accuracy {o.accuracy:.1%}; {split}")


@click.command()
@click.option("--release", type=click.Path(path_type=Path, exists=True), required=True)
@click.option("--rows", type=int, default=2000, show_default=True)
@click.option("--report-interval-s", default="10", show_default=True,
              help="REGISTRY_REPORT_INTERVAL_S (how fast budgets follow)")
def main(release: Path, rows: int, report_interval_s: str) -> None:
    requests = demo.image_requests(release, rows)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        home = root / "registry"
        registry(home, "publish", str(release), "--name", MODEL)
        reg = start_registry(home, root, TOKEN,
                             env={"REGISTRY_REPORT_INTERVAL_S": report_interval_s})
        env = {"PATH": str(BIN), **code_path()}
        flags = ("--registry", reg.target, "--poll-interval-s", "0.2")
        nodes = [start_tier("center", root / "center", root, *flags, env=env,
                            registry_secret=TOKEN, until="live")]
        try:
            for region in ("eu", "us"):
                nodes.append(start_tier("edge", root / f"edge-{region}", root, *flags,
                                        "--region", region, "--center-url", nodes[0].url,
                                        env=env, registry_secret=TOKEN, until="live"))
            edges = [n.url for n in nodes[1:]]
            wait("the fleet to serve digits", lambda: all(
                httpx.get(f"{n.url}/v2/models/{MODEL}/ready", timeout=5).status_code == 200
                for n in nodes))
            run_demo(edges, requests[:400])  # the center measures its capacity on these
            wait("budgets on both edges", lambda: all(budget(u) > 0 for u in edges), 180)
            print("budgets (rows/s):", [round(budget(u), 1) for u in edges])
            show("auto", run_demo(edges, requests))
            registry(home, "cascade", MODEL, "--mode", "static")
            wait("no budget under static", lambda: all(budget(u) == 0 for u in edges))
            show("static", run_demo(edges, requests))
        finally:
            for node in reversed(nodes):
                node.stop()
            reg.stop()


if __name__ == "__main__":
    main()
