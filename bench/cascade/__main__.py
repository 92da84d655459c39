"""Cascade report: accuracy vs escalation on the test split, and the live cascade vs the center.

    .venv/bin/python -m bench.cascade [--model sentiment|digits] [--duration SECONDS]
        [--quick] [--no-live] [--plot PNG] [--json PATH] [--markdown PATH]

About 75 s on a quiet 2-core machine. ``--model digits``: the image model's curve, offline
(``bench.cascade.digits``; plot ``docs/digits_cascade.png``). How it measures:
docs/benchmark-methods.md, "The cascade".
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from bench.cascade.curve import GOAL_TOLERANCE, Curve, Point, Saved
from bench.cascade.measure import (
    QUICK_ROWS,
    calibrated_on,
    live,
    offline_logits,
    plot,
    production,
    pull,
    test_split,
)
from bench.cascade.report import Report, as_json, markdown, show
from bench.harness import (
    MODEL,
    Plan,
    bench_parser,
    console,
    ensure_wrk,
    parse_bench_args,
)
from bench.kit import ROOT, machine, write_bodies

# --- main ------------------------------------------------------------------------------------

def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = bench_parser(__doc__, f"{QUICK_ROWS} rows for the live accuracy, 3 s wrk runs",
                          "python -m bench.cascade")
    parser.add_argument("--json", type=Path, help="write the raw numbers here")
    parser.add_argument("--plot", type=Path, default=None,
                        help="PNG to write (default docs/cascade.png; docs/digits_cascade.png "
                             "with --model digits)")
    parser.add_argument("--no-live", action="store_true",
                        help="only the curve and the plot (no servers, no wrk)")
    parser.add_argument("--model", choices=(MODEL, "digits"), default=MODEL,
                        help=f"the text demo release ({MODEL}, from --registry; default) or the "
                             f"image one (digits: built when missing, published into a "
                             f"temporary registry; the curve only)")
    return parse_bench_args(parser, argv)


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds through the finally blocks that stop servers


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    if args.model != MODEL:
        from bench.cascade.digits import run

        run(args)
        return
    args.plot = args.plot or ROOT / "docs" / "cascade.png"
    wrk_path = None if args.no_live else ensure_wrk()
    shown = production(args.registry)
    version, calibration = int(shown["version"]), dict(shown["manifest"]["calibration"])
    texts, labels = test_split()
    with tempfile.TemporaryDirectory(prefix="bench-cascade-") as tmp:
        work = Path(tmp)
        edge, center = (pull(args.registry, version, t, work / t) for t in ("edge", "center"))
        console.log(f"{MODEL} v{version} pulled: edge {edge.model_file.name}, center "
                    f"{center.model_file.name}; calibrated threshold "
                    f"{calibration['threshold']:.4f}")
        offline = offline_logits(edge, center, texts)
        curve = Curve.of(offline.center, offline.edge, labels)
        calibrated = calibrated_on(offline, labels, float(calibration["threshold"]))
        manifest_curve = [Point(p["threshold"], p["escalation_rate"], p["cascade_accuracy"])
                          for p in calibration.get("curve", [])]
        size = plot(args.plot, curve, calibrated, curve.lowest_within(GOAL_TOLERANCE),
                    manifest_curve, f"{MODEL} v{version}: INT8 edge -> fp32 center cascade, "
                                    f"test split ({curve.rows:,} rows)")
        console.log(f"plot written: {args.plot} ({size / 1024:.0f} KiB)")
        result = None
        if wrk_path is not None:
            rows = QUICK_ROWS if args.quick else len(texts)
            plan = Plan(wrk_path, work, write_bodies(texts, work / "bodies.jsonl",
                                                     outputs=("label", "tier")),
                        args.duration, 1 if args.quick else 2, 0)
            result = live(work, edge, center, rows, plan, offline, labels,
                          float(calibration["threshold"]))
    report = Report(version, machine(), curve, calibrated, calibration,
                    curve.lowest_within(GOAL_TOLERANCE), curve.stays_within(GOAL_TOLERANCE),
                    Saved(calibrated.escalation, offline.center_ms_per_row,
                          offline.edge_ms_per_row),
                    offline, result, args.duration, args.plot)
    show(report)
    if args.json:
        args.json.write_text(json.dumps(as_json(report), indent=2) + "\n")
    if args.markdown:
        docs = ROOT / "docs"
        image = (os.path.relpath(args.plot.resolve(), docs)
                 if args.plot.resolve().is_relative_to(docs) else str(args.plot))
        args.markdown.write_text(markdown(report, image))


if __name__ == "__main__":
    main()
