"""Peer comparison: Tiered's edge vs Seldon MLServer and KServe's Python model server.

    .venv/bin/python -m bench.peers [--model sentiment|digits] [--duration S] [--quick]
        [--mlserver-workers 1,0] [--json PATH] [--markdown PATH]

(``python -m bench.peers.run`` is the same.) About 3 minutes once the peer venvs exist. With
``--model digits`` every server serves the digits release's INT8 ONNX edge (``bench.images``:
built when missing, published into a temporary registry), each request one FP32 image as JSON.
How it measures: docs/benchmark-methods.md, "Peers".
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from importlib import metadata
from pathlib import Path

from rich.table import Table

from bench import images
from bench.harness import (
    MODEL,
    TEXTS,
    Plan,
    bench_parser,
    console,
    ensure_wrk,
    parse_bench_args,
    pull,
    review_texts,
)
from bench.kit import cpu, git_commit, write_bodies, wrk_version
from bench.peers.measure import (
    CHECK_PARALLEL,
    CHECK_TEXTS,
    CONCURRENCY,
    MAX_BATCH_DELAY_MS,
    MAX_BATCH_SIZE,
    MULTI_CONCURRENCY,
    MULTI_ROWS,
    PINS,
    QUICK_CHECK_TEXTS,
    QUICK_CONCURRENCY,
    TIERED_FLAGS,
    Outcome,
    Served,
    Spec,
    Venv,
    agreement,
    ensure_venv,
    pinned,
    run_server,
    verdicts,
)
from bench.peers.report import (
    Context,
    as_json,
    markdown,
    multi_lines,
    ratios,
    ratios_table,
    results_table,
)
from bench.tiers import LIMIT, Raw, limit_of, raw_runs

# --- main ------------------------------------------------------------------------------------

def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = bench_parser(__doc__, "3 s runs at concurrency 1 and 32 only, 1 s warm-up, "
                          "MLServer with parallel_workers 1 only (a smoke run)",
                          "python -m bench.peers")
    parser.add_argument("--mlserver-workers", default=None,
                        help="comma-separated MLServer parallel_workers values to run "
                             "(default 1,0; 1 with --quick)")
    parser.add_argument("--processes", default=None,
                        help="comma-separated process counts to run Tiered and KServe with "
                             "as well (their --workers; default 2, none with --quick)")
    parser.add_argument("--json", type=Path, help="write the raw numbers here")
    parser.add_argument("--model", choices=(MODEL, images.DIGITS), default=MODEL,
                        help=f"the text demo release ({MODEL}, from --registry; default) or the "
                             f"image one (digits: built when missing, published into a "
                             f"temporary registry)")
    args = parse_bench_args(parser, argv)
    try:
        workers = [int(w) for w in (args.mlserver_workers or ("1" if args.quick else "1,0"))
                   .split(",")]
    except ValueError:
        parser.error("--mlserver-workers takes comma-separated integers, e.g. 1,0")
    if any(w < 0 for w in workers) or len(set(workers)) != len(workers):
        parser.error("--mlserver-workers: distinct values >= 0")
    args.mlserver_workers = workers
    try:
        processes = [int(n) for n in (args.processes or ("" if args.quick else "2")).split(",")
                     if n.strip()]
    except ValueError:
        parser.error("--processes takes comma-separated integers, e.g. 2,4")
    if any(n < 2 for n in processes):
        parser.error("--processes: counts >= 2 (1 is the plain run)")
    args.processes = processes
    return args


def specs(workers: Sequence[int], processes: Sequence[int] = ()) -> list[Spec]:
    """The servers: Tiered, MLServer at each ``workers`` (parallel_workers), KServe; Tiered and
    KServe again with each of ``processes`` serving processes (both ``--workers N``)."""
    mlserver, kserve = pinned(PINS["mlserver"])["mlserver"], pinned(PINS["kserve"])["kserve"]
    out = [Spec("tiered", "tiered", "Tiered edge")]
    out += [Spec(f"tiered-w{n}", "tiered", f"Tiered edge (workers {n})", n) for n in processes]
    for w in workers:
        out.append(Spec("mlserver" if w == workers[0] else f"mlserver-w{w}", "mlserver",
                        f"MLServer {mlserver} (workers {w})", w))
    out.append(Spec("kserve", "kserve", f"KServe {kserve}"))
    out += [Spec(f"kserve-w{n}", "kserve", f"KServe {kserve} (workers {n})", n)
            for n in processes]
    return out


def settings_lines(outcomes: Sequence[Outcome], venvs: dict[str, Venv],
                   kind: str = "text") -> dict[str, str]:
    lines: dict[str, str] = {}
    for o in outcomes:
        s = o.spec
        if s.kind == "tiered":
            flags = " ".join((*TIERED_FLAGS, *(("--workers", str(s.workers))
                                               if s.workers > 1 else ())))
            tokenizers = (f", tokenizers {metadata.version('tokenizers')}" if kind == "text"
                          else "")
            lines[s.key] = (f"`edge {flags}` (batching = its defaults: "
                            f"{MAX_BATCH_SIZE} rows, {MAX_BATCH_DELAY_MS:g} ms; response cache "
                            f"off; no center); processes: {s.processes}; tiered "
                            f"{metadata.version('tiered')}, onnxruntime "
                            f"{metadata.version('onnxruntime')}{tokenizers}")
        elif s.kind == "mlserver":
            lines[s.key] = (f"custom runtime `bench/peers/mlserver_runtime.py`; adaptive "
                            f"batching max_batch_size {MAX_BATCH_SIZE}, max_batch_time "
                            f"{MAX_BATCH_DELAY_MS / 1000:g} s; parallel_workers {s.workers} "
                            f"(MLServer's default is 1); processes: {s.processes}; other "
                            f"settings default (debug: access log on); "
                            f"{pins_text(venvs['mlserver'])}")
        else:
            shared = " (intra-op threads: the cores shared out, as Tiered does)"
            lines[s.key] = (f"`kserve.ModelServer` with `bench/peers/kserve_server.py`, "
                            f"--workers {s.workers}{shared if s.workers > 1 else ''}"
                            f", gRPC off, default logging; **no adaptive "
                            f"batching** (KServe's batcher is the Go agent sidecar on "
                            f"Kubernetes, V1 protocol only; the Python server runs one request "
                            f"per model execution); processes: {s.processes}; "
                            f"{pins_text(venvs['kserve'])}")
    return lines


def pins_text(venv: Venv) -> str:
    return ", ".join(f"{n} {v}" for n, v in venv.versions.items())


@dataclass(frozen=True)
class Setup:
    """What every server is measured on: the model, the bodies, the model's limit on the same
    rows (its best in-process batch), and how the report names them."""

    served: Served
    plan: Plan
    multi: Plan  # MULTI_ROWS rows per request
    check_bodies: list[str]
    limit: Raw
    unit: str  # what one row is
    heading: str = ""
    load: str = ""
    model: str = ""


def text_setup(args: argparse.Namespace, work: Path, wrk_path: str, warmup: int) -> Setup:
    """The demo release ``sentiment`` from ``--registry``: review texts as JSON."""
    texts = review_texts(TEXTS)
    release = pull(args.registry, "edge", work / "store")
    manifest = json.loads((release.folder / "release.json").read_text())
    labels = [str(label) for label in manifest["labels"]]
    bodies = write_bodies(texts, work / "bodies.jsonl", threshold=0)
    check_bodies = bodies.read_text().splitlines()[:QUICK_CHECK_TEXTS if args.quick
                                                   else CHECK_TEXTS]
    console.log(f"{MODEL} version {release.folder.name}: {release.model_file.name}, "
                f"max_length {release.max_length}, labels {labels}")
    console.log(f"the model's limit: onnxruntime in-process, batches of 1 and {LIMIT}")
    limit = limit_of(raw_runs("edge", release, texts, 1.0 if args.quick else 3.0, (1, LIMIT)))
    plan = Plan(wrk_path, work, bodies, args.duration, warmup, 0)
    multi = Plan(wrk_path, work, write_bodies(texts, work / "bodies-32.jsonl", threshold=0,
                                              rows=MULTI_ROWS), args.duration, warmup, 0)
    return Setup(Served.text(release, labels), plan, multi, check_bodies, limit, "texts")


MULTI_IMAGE_BODIES = 100  # bodies of MULTI_ROWS images as JSON (~0.3 MB each)


def digits_setup(args: argparse.Namespace, work: Path, wrk_path: str, warmup: int) -> Setup:
    """The digits release: each test image as its FP32 tensor in JSON, the one form every
    server takes (MLServer's REST has no binary tensor extension; the peers decode no PNG)."""
    release = images.pull(images.published(work), "edge", work / "store")
    test = images.test_images(release.spec)
    labels = list(release.manifest.labels)
    bodies = images.write_bodies(test, work / "bodies.jsonl", "fp32-json", threshold=0)
    check_bodies = bodies.read_text().splitlines()[:QUICK_CHECK_TEXTS if args.quick
                                                   else CHECK_TEXTS]
    artifact = release.manifest.edge
    console.log(f"{images.DIGITS} version {release.version}: {release.model_file.name} "
                f"({artifact.precision}, {artifact.size:,} B), labels {labels}")
    console.log("the model's limit: onnxruntime in-process, its best batch")
    raw = images.best(images.raw_runs("edge", release, test, 1.0 if args.quick else 3.0),
                      "edge")
    limit = Raw("edge", raw.batch, raw.rows_per_s, raw.ms_per_batch, math.nan, raw.other_cores)
    plan = Plan(wrk_path, work, bodies, args.duration, warmup, 0, images.DIGITS)
    multi = Plan(wrk_path, work, images.write_bodies(
        test, work / "bodies-32.jsonl", "fp32-json", threshold=0, rows=MULTI_ROWS,
        count=MULTI_IMAGE_BODIES), args.duration, warmup, 0, images.DIGITS)
    served = Served(images.DIGITS, release.store, str(release.version), release.model_file,
                    labels, "image")
    return Setup(
        served, plan, multi, check_bodies, limit, "images",
        heading="Tiered edge vs MLServer and KServe: the image model (digits)",
        load=f"- Load: the {len(test):,} test images of the digits release rotated, one per "
             f"request, the same V2 JSON bodies for every server (FP32 input `image` of shape "
             f"[1, 1, 28, 28], the PNG decoded and normalised beforehand, "
             f"`\"parameters\": {{\"threshold\": 0}}`, which the peers ignore); then "
             f"{MULTI_ROWS} images per request (shape [{MULTI_ROWS}, 1, 28, 28], the first "
             f"{MULTI_IMAGE_BODIES} bodies) at concurrency {MULTI_CONCURRENCY}.",
        model=f"- Model: the digits release's edge, a 4k-parameter CNN exported and quantized "
              f"by `registry publish` ({artifact.precision}, {artifact.size:,} B ONNX), "
              f"onnxruntime CPU with the edge's session options (graph optimizations all, "
              f"default intra-op threads) in every server; the peers' runtimes "
              f"`bench/peers/onnx_image.py`.")


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    levels = QUICK_CONCURRENCY if args.quick else CONCURRENCY
    warmup = 1 if args.quick else 2
    wrk_path = ensure_wrk()
    venvs = {name: ensure_venv(name, pins) for name, pins in PINS.items()}
    for venv in venvs.values():
        console.log(f"{venv.name} venv: {venv.describe()}: {pins_text(venv)}")
    wanted = specs(args.mlserver_workers, args.processes)
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="bench-peers-") as tmp:
        work = Path(tmp)
        setup = (digits_setup if args.model == images.DIGITS else text_setup)(
            args, work, wrk_path, warmup)
        limit = setup.limit
        console.log(f"the model's limit: {limit.rows_per_s:.1f} rows/s, batch {limit.label} "
                    f"(other processes {limit.other_cores:.2f} cores)")
        for spec in wanted:
            outcomes.append(run_server(setup.plan, spec, venvs, setup.served,
                                       setup.check_bodies, levels, setup.multi))
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
        release=f"version {setup.served.version}",
        settings=settings_lines(outcomes, venvs, setup.served.kind),
        versions={name: v.versions for name, v in venvs.items()},
        venvs={name: v.describe() for name, v in venvs.items()}, alone=alone, agreement=agree,
        load=setup.load, model=setup.model, unit=setup.unit, limit=limit,
        **({"heading": setup.heading} if setup.heading else {}))
    results = verdicts(outcomes)
    servers = Table(title="Servers", show_header=False)
    for o in outcomes:
        servers.add_row(o.spec.label, context.settings[o.spec.key].replace("**", ""))
    console.print(servers)
    console.print(results_table(outcomes, limit))
    labels_by_key = {o.spec.key: o.spec.label for o in outcomes}
    for result in results:
        console.print(result.line(labels_by_key).replace("**", ""))
    for line in multi_lines(outcomes, setup.unit):
        console.print(line)
    found = ratios(outcomes, results, limit, limit_goals=setup.served.kind == "text")
    console.print(ratios_table(found))
    if args.markdown:
        args.markdown.write_text(markdown(context, outcomes, results, found) + "\n")
        console.log(f"wrote {args.markdown}")
    if args.json:
        args.json.write_text(json.dumps(as_json(context, outcomes, results), indent=2) + "\n")
        console.log(f"wrote {args.json}")


if __name__ == "__main__":
    main()
