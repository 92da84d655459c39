"""The cascade curve of the image model: accuracy vs escalation on the digits test split.

    .venv/bin/python -m bench.cascade --model digits [--plot PNG] [--json PATH]
        [--markdown PATH]

The digits release (``bench.images``) is built when missing and published into a temporary
registry, as ``registry publish`` does for any user (the edge exported to ONNX and quantized to
INT8, the threshold calibrated on the calibration split); the INT8 edge and the fp32 center it
stores are pulled and run in-process over the 1,000 test PNGs, decoded and normalised as the
servers do (``serving.inputs.pixels``, the release's ``ImageInput``). Offline only: no servers.
About 30 s. How it measures: docs/benchmark-methods.md, "The cascade".
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench import images
from bench.cascade.curve import GOAL_TOLERANCE, Curve, Point, Saved
from bench.cascade.measure import Meter, Offline, calibrated_on, plot
from bench.cascade.report import (
    CALIBRATED,
    Report,
    as_json,
    pct,
    points,
    saved_line,
    verdict_line,
)
from bench.harness import console
from bench.images import DIGITS, ImageRelease, TestImages
from bench.kit import BUSY_OTHERS, ROOT, machine

PLOT = ROOT / "docs" / "digits_cascade.png"


def offline_logits(edge: ImageRelease, center: ImageRelease, test: TestImages) -> Offline:
    """Both models over the test images' rows with the runners and batch size ``registry
    publish`` validates with (``serving.model.runner``)."""
    from serving.model import torchscript
    from serving.model.runner import BATCH, Inputs, onnx_session, run_onnx, run_torchscript

    name = edge.spec.name
    inputs = Inputs([{name: test.rows[i:i + BATCH]} for i in range(0, len(test), BATCH)],
                    "calibration")
    warm = Inputs(inputs.batches[:1], inputs.kind)
    module = torchscript.load(center.model_file).eval()
    session = onnx_session(edge.model_file)

    def timed(run: Callable[[Inputs], np.ndarray]) -> tuple[np.ndarray, float]:
        run(warm)
        started = time.perf_counter()
        out = run(inputs)
        return out, 1000 * (time.perf_counter() - started) / len(test)

    meter = Meter.now()
    center_logits, center_ms = timed(lambda i: run_torchscript(module, i, "center"))
    edge_logits, edge_ms = timed(lambda i: run_onnx(session, i, "edge"))
    others = Meter.now().others_since(meter)
    console.log(f"test split: {len(test)} images at batch {BATCH}: center fp32 "
                f"{center_ms:.3f} ms/row, edge INT8 {edge_ms:.3f} ms/row (others used "
                f"{others:.2f} cores)")
    return Offline(center_logits, edge_logits, center_ms, edge_ms, others)


def markdown(r: Report, image: str, edge: ImageRelease, decode_us: float) -> str:
    m, cal = r.machine, r.manifest_calibration
    artifact = edge.manifest.edge
    out = ["## The cascade on images (digits): accuracy vs escalation", "",
           f"Measured by `python -m bench.cascade --model digits` on {m['date']}: {m['cpu']}, "
           f"{m['cores']} cores, onnxruntime / torch {m['onnxruntime / torch']}, commit "
           f"{m['git commit']}, load average {m['load average']}.", "",
           f"Release `{DIGITS}` v{r.version}, built by `examples.digits.build` and published "
           f"into a temporary registry: the edge CNN (4k parameters) exported to ONNX and "
           f"quantized by `publish` ({artifact.precision}, {artifact.size:,} B), the fp32 "
           f"TorchScript center CNN (422k parameters), both over the {r.curve.rows:,} **test** "
           f"PNGs decoded and normalised as the servers do (`serving.inputs.pixels`, "
           f"{decode_us:.0f} µs per image), with the publish pipeline's runners at batch 32; "
           f"rows whose edge confidence (max softmax) is below the threshold go to the center. "
           f"The threshold was calibrated by `publish` on the calibration split "
           f"({cal['rows']:,} images: escalation {cal['escalation_rate']:.1%}, cascade "
           f"{cal['cascade_accuracy']:.2%} vs center {cal['center_accuracy']:.2%}, edge "
           f"{cal['edge_accuracy']:.2%}).", "",
           "| operating point | threshold | escalated | cascade accuracy | vs center-only |",
           "|---|---|---|---|---|"]
    for name, p in r.rows():
        cells = [name, f"{p.threshold:.4f}", f"{p.escalation:.1%}", pct(p.accuracy),
                 points(-p.gap_points(r.curve.center_accuracy))]
        if CALIBRATED in name:
            cells = [f"**{c}**" for c in cells]
        out.append("| " + " | ".join(cells) + " |")
    out += ["", verdict_line(r, rich=False), "", saved_line(r), "", busy_line(r), "",
            f"![Digits: cascade accuracy vs share of images escalated on the test split, the "
            f"calibrated threshold marked]({image})", ""]
    return "\n".join(out)


def busy_line(r: Report) -> str:
    others = r.offline.other_cores
    if others <= BUSY_OTHERS:
        return f"Other processes used {others:.2f} cores during the in-process timing."
    return (f"Other processes used {others:.2f} cores during the in-process timing: the ms per "
            f"row are skewed (the accuracies are not).")


def run(args: argparse.Namespace) -> None:
    """``bench.cascade --model digits``: ``args`` as ``bench.cascade``'s parser gives them."""
    plot_path: Path = args.plot or PLOT
    with tempfile.TemporaryDirectory(prefix="bench-cascade-digits-") as tmp:
        work = Path(tmp)
        home = images.published(work)
        edge, center = (images.pull(home, t, work / t) for t in ("edge", "center"))
        calibration = edge.manifest.calibration
        test = images.test_images(edge.spec)
        decode_us = images.decode_us(test, edge.spec, 1.0)
        offline = offline_logits(edge, center, test)
    curve = Curve.of(offline.center, offline.edge, test.labels)
    calibrated = calibrated_on(offline, test.labels, calibration.threshold)
    manifest_curve = [Point(p.threshold, p.escalation_rate, p.cascade_accuracy)
                      for p in calibration.curve]
    size = plot(plot_path, curve, calibrated, curve.lowest_within(GOAL_TOLERANCE),
                manifest_curve, f"{DIGITS} v{edge.version}: INT8 edge CNN -> fp32 center CNN "
                                f"cascade, test split ({curve.rows:,} images)")
    console.log(f"plot written: {plot_path} ({size / 1024:.0f} KiB)")
    cal: dict[str, Any] = {"rows": calibration.rows, "threshold": calibration.threshold,
                           "escalation_rate": calibration.escalation_rate,
                           "cascade_accuracy": calibration.cascade_accuracy,
                           "center_accuracy": calibration.center_accuracy,
                           "edge_accuracy": calibration.edge_accuracy,
                           "source": calibration.source}
    report = Report(edge.version, machine(), curve, calibrated, cal,
                    curve.lowest_within(GOAL_TOLERANCE), curve.stays_within(GOAL_TOLERANCE),
                    Saved(calibrated.escalation, offline.center_ms_per_row,
                          offline.edge_ms_per_row),
                    offline, None, 0, plot_path)
    show(report)
    if args.json:
        args.json.write_text(json.dumps({**as_json(report), "model": DIGITS}, indent=2) + "\n")
    if args.markdown:
        docs = ROOT / "docs"
        image = (os.path.relpath(plot_path.resolve(), docs)
                 if plot_path.resolve().is_relative_to(docs) else str(plot_path))
        args.markdown.write_text(markdown(report, image, edge, decode_us))
        console.log(f"wrote {args.markdown}")


def show(r: Report) -> None:
    from rich.table import Table

    m = r.machine
    console.print(f"[dim]{m['date']} · {m['cpu']} · {m['cores']} cores · onnxruntime/torch "
                  f"{m['onnxruntime / torch']} · commit {m['git commit']} · load average "
                  f"{m['load average']}[/]")
    table = Table(title=f"{DIGITS} v{r.version}: cascade on the test split ({r.curve.rows:,} "
                        f"images; edge confidence < threshold -> center)")
    for column in ("operating point", "threshold", "escalated", "cascade accuracy",
                   "vs center-only"):
        table.add_column(column, justify="left" if column == "operating point" else "right")
    for name, p in r.rows():
        table.add_row(name, f"{p.threshold:.4f}", f"{p.escalation:.1%}", pct(p.accuracy),
                      points(-p.gap_points(r.curve.center_accuracy)))
    console.print(table)
    console.print(verdict_line(r))
    console.print(saved_line(r))
    console.print(busy_line(r))
