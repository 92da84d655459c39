"""Protocol benchmark: the same edge, model and texts over V2 JSON/HTTP, the binary tensor
extension over HTTP, and gRPC V2, at concurrency 1/8/32, with 1 and 32 rows per request; then
the edge's escalation to the center over REST vs over gRPC.

    .venv/bin/python -m bench.protocols [--duration SECONDS] [--quick] [--markdown PATH]

One edge serves the demo release (INT8, response cache off, every row answered at the edge:
``threshold`` 0, so no center is involved). The clients are what users run: request bodies
made by ``tritonclient.http`` (binary) and ``tritonclient.grpc``'s messages, sent with aiohttp
and grpc.aio from this one process, which also decodes every answer (JSON parse; tritonclient's
binary parse; numpy over ``raw_output_contents``). Each row of the table is one run of
``--duration`` seconds after a warm-up; the client's own CPU use is shown so a saturated client
is visible.

The escalation table: a center (full precision) and two edges, one escalating over V2 REST
(``--center-url http://``), one over gRPC (``grpc://``); JSON requests with ``threshold`` 1, so
every row goes to the center.

The runs and the tables are ``harness.protocols`` (``tests/integration/test_protocols.py`` runs
them in miniature); this starts the servers and reports.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Sequence
from pathlib import Path

from rich.table import Table

from bench.harness import (
    MODEL,
    TEXTS,
    bench_parser,
    console,
    parse_bench_args,
    pull,
    review_texts,
    server,
)
from bench.kit import machine
from bench.markdown import Shown
from harness.processes import free_port
from harness.protocols import measure, measure_escalation, summary, table

EDGE_FLAGS = ("--cache-size", "0", "--max-batch-size", "32", "--max-batch-delay-ms", "5")


def machine_table(extra: dict[str, str]) -> Table:
    out = Table(title="Machine", show_header=False)
    out.add_column()
    out.add_column()
    for key, value in machine(**extra).items():
        out.add_row(key, value)
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = bench_parser(__doc__, "3 s runs")
    args = parse_bench_args(parser, argv)
    warmup = 1.0 if args.quick else 2.0
    texts = review_texts(TEXTS)
    show = Shown(console)
    with tempfile.TemporaryDirectory(prefix="tiered-protocols-") as tmp:
        root = Path(tmp)
        pull(args.registry, "edge", root / "edge")
        pull(args.registry, "center", root / "center")
        grpc_port, center_grpc = free_port(), free_port()
        with server("edge", root / "edge", root, *EDGE_FLAGS, "--grpc-port",
                    str(grpc_port)) as edge:
            results = asyncio.run(measure(edge.url, f"127.0.0.1:{grpc_port}", edge.pid, texts,
                                          args.duration, warmup, MODEL, console.print))
        with server("center", root / "center", root, "--grpc-port", str(center_grpc)) as center, \
                server("edge", root / "edge", root, *EDGE_FLAGS, "--center-url",
                       center.url) as over_rest, \
                server("edge", root / "edge", root, *EDGE_FLAGS, "--center-url",
                       f"grpc://127.0.0.1:{center_grpc}") as over_grpc:
            escalations = asyncio.run(measure_escalation(
                {"REST": (over_rest.url, over_rest.pid), "gRPC": (over_grpc.url, over_grpc.pid)},
                texts, args.duration, warmup, MODEL, console.print))
    show(machine_table({"edge flags": " ".join(EDGE_FLAGS),
                        "clients": "aiohttp, grpc.aio, tritonclient (bodies and parsing)"}))
    show(table(results, args.duration))
    show(summary(results, "JSON/HTTP", "Client protocols:"))
    show(table(escalations, args.duration, "Edge → center escalation over V2 REST vs gRPC "
               "(every row escalates; JSON client requests)", "REST", "vs REST",
               "escalation"))
    show(summary(escalations, "REST", "Escalation:"))
    if args.markdown:
        show.write(args.markdown, "Protocols")


if __name__ == "__main__":
    main()
