"""Peer comparison: Tiered's edge vs Seldon MLServer and KServe's Python model server.

    .venv/bin/python -m bench.peers [--duration S] [--quick] [--mlserver-workers 1,0]
        [--json PATH] [--markdown PATH]

(``python -m bench.peers.run`` is the same.) About 3 minutes once the peer venvs exist. How it
measures: docs/benchmark-methods.md, "Peers".
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from datetime import datetime
from importlib import metadata
from pathlib import Path

from rich.table import Table

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
    MULTI_ROWS,
    PINS,
    QUICK_CHECK_TEXTS,
    QUICK_CONCURRENCY,
    TIERED_FLAGS,
    Outcome,
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
from bench.tiers import single_row

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


def settings_lines(outcomes: Sequence[Outcome], venvs: dict[str, Venv]) -> dict[str, str]:
    lines: dict[str, str] = {}
    for o in outcomes:
        s = o.spec
        if s.kind == "tiered":
            flags = " ".join((*TIERED_FLAGS, *(("--workers", str(s.workers))
                                               if s.workers > 1 else ())))
            lines[s.key] = (f"`edge {flags}` (batching = its defaults: "
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


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    levels = QUICK_CONCURRENCY if args.quick else CONCURRENCY
    warmup = 1 if args.quick else 2
    wrk_path = ensure_wrk()
    venvs = {name: ensure_venv(name, pins) for name, pins in PINS.items()}
    for venv in venvs.values():
        console.log(f"{venv.name} venv: {venv.describe()}: {pins_text(venv)}")
    texts = review_texts(TEXTS)
    wanted = specs(args.mlserver_workers, args.processes)
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
        console.log("raw single-row onnxruntime, in-process")
        single = single_row(release, texts, 1.0 if args.quick else 3.0)
        # spinning intra-op threads make it the measure most hurt by a busy machine
        console.log(f"raw single-row: {single.rows_per_s:.1f} rows/s (other processes "
                    f"{single.other_cores:.2f} cores)")
        plan = Plan(wrk_path, work, bodies, args.duration, warmup, 0)
        multi = Plan(wrk_path, work, write_bodies(texts, work / "bodies-32.jsonl", threshold=0,
                                                  rows=MULTI_ROWS), args.duration, warmup, 0)
        for spec in wanted:
            outcomes.append(run_server(plan, spec, venvs, release, labels, check_bodies,
                                       levels, multi))
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
    results = verdicts(outcomes)
    servers = Table(title="Servers", show_header=False)
    for o in outcomes:
        servers.add_row(o.spec.label, context.settings[o.spec.key].replace("**", ""))
    console.print(servers)
    console.print(results_table(outcomes))
    labels_by_key = {o.spec.key: o.spec.label for o in outcomes}
    for result in results:
        console.print(result.line(labels_by_key).replace("**", ""))
    for line in multi_lines(outcomes):
        console.print(line)
    found = ratios(outcomes, results, single)
    console.print(ratios_table(found))
    if args.markdown:
        args.markdown.write_text(markdown(context, outcomes, results, found) + "\n")
        console.log(f"wrote {args.markdown}")
    if args.json:
        args.json.write_text(json.dumps(as_json(context, outcomes, results), indent=2) + "\n")
        console.log(f"wrote {args.json}")


if __name__ == "__main__":
    main()
