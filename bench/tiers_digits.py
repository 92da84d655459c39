"""Serving benchmark, image model: the digits edge and center under HTTP load vs their raw
runtimes in-process, and the bytes the edge sends its center per escalated row.

    .venv/bin/python -m bench.tiers --model digits [--duration SECONDS] [--quick]
        [--server-threads N] [--markdown PATH]

The digits release (``bench.images``) is built when missing and published into a temporary
registry. How it measures: docs/benchmark-methods.md, "Serving tiers", "The image model".
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from collections.abc import Sequence
from pathlib import Path

from rich.table import Table

from bench import images
from bench.harness import Plan, console, ensure_wrk, server, wrk
from bench.images import DIGITS, FORM_NAMES, Escalated, ImageRelease, RawImages, TestImages
from bench.kit import cores, machine, wrk_version
from bench.markdown import Shown
from bench.tier_runs import (
    BATCHING_ON,
    CONCURRENCY,
    EDGE_FLAGS,
    SATURATION,
    WORKERS,
    Run,
    interference_note,
    measure,
    ms,
)

LOADED = ("png", "fp32")  # the forms the servers are measured under wrk with
QUICK_ESCALATED = 60  # requests per form escalated with --quick (else every test image)


# --- servers under wrk -----------------------------------------------------------------------

def server_runs(plans: dict[str, Plan], tier: str, store: Path, label: str,
                levels: Sequence[int], test: TestImages, workers: int = 1) -> list[Run]:
    """One server, each form's bodies at each concurrency (each run named by its form and
    ``label``); answers checked first."""
    first = next(iter(plans.values()))
    flags = (*(EDGE_FLAGS if tier == "edge" else ()), "--threads", str(first.threads),
             *BATCHING_ON, *(("--workers", str(workers)) if workers > 1 else ()))
    with server(tier, store, first.logs, *flags) as handle:
        for form in plans:
            images.check_answer(handle.url, test, form)
        wrk(first, handle.url, SATURATION, first.warmup)
        return [measure(plan, handle, tier, f"{FORM_NAMES[form]}{label}", c)
                for form, plan in plans.items() for c in levels]


def escalation(store: tuple[Path, Path], logs: Path, test: TestImages,
               requests: int) -> list[Escalated]:
    """A center and an edge escalating to it; ``requests`` single-image requests per form with
    ``threshold`` 1, the edge's byte and row counters read around each form."""
    edge_store, center_store = store
    with server("center", center_store, logs) as center, \
            server("edge", edge_store, logs, *EDGE_FLAGS, "--center-url", center.url) as edge:
        found = [images.escalate(edge.url, test, form, requests) for form in images.FORMS]
    for e in found:
        console.log(f"escalated {FORM_NAMES[e.form]}: {e.rows:.0f} rows, {e.bytes:.0f} bytes to "
                    f"the center = {e.bytes_per_row:.1f} B/row, failed {e.failed}")
    return found


# --- report ----------------------------------------------------------------------------------

def machine_table(wrk_path: str, duration: int, threads: int, edge: ImageRelease,
                  center: ImageRelease, test: TestImages) -> Table:
    table = Table(title="Machine", show_header=False)
    edge_artifact, center_artifact = edge.manifest.edge, center.manifest.center
    rows = machine(
        wrk=wrk_version(wrk_path),
        release=f"{DIGITS} v{edge.version}: edge ONNX {edge_artifact.precision} "
                f"({edge_artifact.size:,} B), center TorchScript {center_artifact.precision} "
                f"({center_artifact.size:,} B)",
        load=f"wrk -t1, {duration} s per run, {len(test):,} test images rotated, 1 per request: "
             f"the PNG as BYTES (mean {test.png_bytes:.0f} B) or its FP32 tensor "
             f"{[1, *test.rows.shape[1:]]} ({test.rows[0].nbytes:,} B), binary tensor "
             f"extension",
        server_flags=f"--threads {threads} (0 = runtime default), batching 32 rows / 5 ms; "
                     f"edge --cache-size 0, threshold 0 (never escalates)")
    for key, value in rows.items():
        table.add_row(key, value)
    return table


def raw_table(raws: Sequence[RawImages]) -> Table:
    table = Table(title="Raw model in-process (no HTTP, no decoding): the test images' model "
                        "rows, rotating")
    for column in ("tier", "runtime", "batch", "rows/s", "ms/batch", "ms/row",
                   "others' cores"):
        table.add_column(column, justify="left" if column in ("tier", "runtime") else "right")
    runtimes = {"edge": "onnxruntime, INT8", "center": "TorchScript, fp32"}
    for r in raws:
        table.add_row(r.tier, runtimes[r.tier], str(r.batch), f"{r.rows_per_s:.1f}",
                      ms(r.ms_per_batch), f"{r.ms_per_batch / r.batch:.3f}",
                      cores(r.other_cores))
    return table


def runs_table(title: str, runs: Sequence[Run]) -> Table:
    table = Table(title=title)
    columns = ("tier", "configuration", "conc", "req/s", "p50 ms", "p99 ms", "errors",
               "rows/call", "compute ms/row", "server cores", "others' cores")
    for column in columns:
        table.add_column(column, justify="left" if column in columns[:2] else "right")
    for r in runs:
        table.add_row(r.tier, r.batching, str(r.concurrency), f"{r.load.rps:.1f}",
                      ms(r.load.p50_ms), ms(r.load.p99_ms), str(r.load.errors),
                      ms(r.server.mean_batch), f"{r.server.compute_ms_per_row:.3f}",
                      f"{r.usage.server_cores:.2f}", cores(r.usage.other_cores))
    return table


def versus_table(runs: Sequence[Run], raws: Sequence[RawImages]) -> Table:
    table = Table(title="Servers as a share of the model's limit (its best in-process batch on "
                        "the same images, same run; the server also decodes each PNG) and vs "
                        "raw single rows")
    for column in ("tier", "configuration", "conc", "req/s", "p50 ms", "p99 ms",
                   "raw 1-row rows/s", "vs 1-row", "limit rows/s (batch)", "share of limit"):
        table.add_column(column, justify="left" if column in ("tier", "configuration")
                         else "right")
    for r in runs:
        one, top = images.single(raws, r.tier), images.best(raws, r.tier)
        table.add_row(r.tier, r.batching, str(r.concurrency), f"{r.load.rps:.1f}",
                      ms(r.load.p50_ms), ms(r.load.p99_ms), f"{one.rows_per_s:.1f}",
                      f"{r.load.rps / one.rows_per_s:.2f}x",
                      f"{top.rows_per_s:.1f} ({top.batch})",
                      f"{r.load.rps / top.rows_per_s:.0%}")
    return table


def escalation_table(found: Sequence[Escalated], tensor_bytes: int) -> Table:
    table = Table(title="Bytes the edge sends its center per escalated row, by the form the "
                        "client sent (threshold 1: every row escalated)")
    for column in ("client sends", "requests", "rows escalated", "bytes to the center",
                   "to the center B/row", "vs FP32 tensor", "client data B/row",
                   "client body B/row", "failed"):
        table.add_column(column, justify="left" if column == "client sends" else "right")
    for e in found:
        table.add_row(FORM_NAMES[e.form], str(e.requests), f"{e.rows:.0f}", f"{e.bytes:,.0f}",
                      f"{e.bytes_per_row:,.1f}", f"{e.bytes_per_row / tensor_bytes:.1%}",
                      f"{e.data_bytes_per_row:,.1f}", f"{e.request_bytes_per_row:,.1f}",
                      str(e.failed))
    return table


def escalation_line(found: Sequence[Escalated], test: TestImages) -> str:
    png = next(e for e in found if e.form == "png")
    tensor = test.rows[0].nbytes
    return (f"Bytes per escalated row: the edge's counter `edge_escalated_input_bytes_total` "
            f"(the input's binary data as the edge forwards it over the binary tensor "
            f"extension; its JSON header and HTTP framing not counted) over the rows its "
            f"`edge_rows_total` counts as answered by the center, read before and after "
            f"{png.requests:,} single-image requests per form, one at a time. An FP32 "
            f"{list(test.rows.shape[1:])} row is {tensor:,} B; a test PNG averages "
            f"{test.png_bytes:.1f} B and is forwarded as it came (+ a 4-byte length): "
            f"{png.bytes_per_row:.1f} B/row, {tensor / png.bytes_per_row:.1f}x less than "
            f"the tensor. Client data: the request's binary tensor data; client body: with its "
            f"JSON header.")


def keep_lines(runs: Sequence[Run], raws: Sequence[RawImages], decode_us: float) -> list[str]:
    lines = [f"PNG decode + normalise in-process (`serving.inputs.pixels`, one image at a "
             f"time): {decode_us:.0f} µs per image."]
    for tier, runtime in (("edge", "onnxruntime"), ("center", "TorchScript")):
        one, top = images.single(raws, tier), images.best(raws, tier)
        for r in runs:
            if r.tier == tier and r.concurrency == SATURATION and "--workers" not in r.batching:
                lines.append(f"{tier.capitalize()} server ({r.batching}) at concurrency "
                             f"{SATURATION}: {r.load.rps:.1f} req/s = "
                             f"{r.load.rps / one.rows_per_s:.2f}x raw single-row {runtime} "
                             f"({one.rows_per_s:.1f} rows/s), {r.load.rps / top.rows_per_s:.0%} "
                             f"of its best batch ({top.batch}: {top.rows_per_s:.1f} rows/s); "
                             f"p50 {r.load.p50_ms:.2f} ms, p99 {r.load.p99_ms:.2f} ms.")
    return lines


# --- main ------------------------------------------------------------------------------------

def run(args: argparse.Namespace) -> None:
    """``bench.tiers --model digits``: ``args`` as ``bench.tiers.parse_args`` gives them."""
    show = Shown(console)
    wrk_path = ensure_wrk()
    raw_seconds, warmup = (1.0, 1) if args.quick else (3.0, 2)
    with tempfile.TemporaryDirectory(prefix="bench-digits-") as tmp:
        work = Path(tmp)
        home = images.published(work)
        edge, center = (images.pull(home, t, work / t) for t in ("edge", "center"))
        test = images.test_images(edge.spec)
        show(machine_table(wrk_path, args.duration, args.server_threads, edge, center, test))
        console.log(f"{DIGITS}: edge {edge.model_file.name}, center {center.model_file.name}, "
                    f"{len(test)} test images")
        console.log("raw in-process timing")
        decode_us = images.decode_us(test, edge.spec, raw_seconds)
        raws = [*images.raw_runs("edge", edge, test, raw_seconds),
                *images.raw_runs("center", center, test, raw_seconds)]
        base = Plan(wrk_path, work, work / "unused", args.duration, warmup, args.server_threads,
                    DIGITS)
        plans = {form: dataclasses.replace(base, bodies=images.write_bodies(
            test, work / f"bodies-{form}", form, threshold=0)) for form in LOADED}
        edge_runs = server_runs(plans, "edge", edge.store, "", CONCURRENCY, test)
        edge_workers = server_runs({"png": plans["png"]}, "edge", edge.store,
                                   f", --workers {WORKERS}", CONCURRENCY, test, WORKERS)
        center_runs = server_runs(plans, "center", center.store, "", CONCURRENCY, test)
        escalated = escalation((edge.store, center.store), work, test,
                               QUICK_ESCALATED if args.quick else len(test))
    show(raw_table(raws))
    everything = [*edge_runs, *edge_workers, *center_runs]
    show(runs_table("Edge and center servers under wrk (batching on; the edge also with "
                    f"--workers {WORKERS})", everything))
    for line in keep_lines(everything, raws, decode_us):
        show(line)
    show(versus_table([r for r in everything if r.concurrency >= 8], raws))
    show(escalation_table(escalated, test.rows[0].nbytes))
    show(escalation_line(escalated, test))
    show(interference_note(raws, everything))
    if args.markdown:
        show.write(args.markdown, "Serving the image model (digits): edge and center under wrk "
                                  "vs the raw runtimes, bytes per escalated row")
        console.log(f"wrote {args.markdown}")
