"""Which INT8 quantization holds across CPUs: fidelity and speed of each setting, side by side.

    .venv/bin/python -m bench.quantization [--demo var/demo/release] [--emulated-rows 256]
                                           [--markdown docs/bench/quantization.md]

How it measures: docs/benchmark-methods.md, "INT8 quantization across CPUs".
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

SETTINGS = {  # name -> (per_channel, reduce_range); the shipped choice is marked in the table
    "per-channel": (True, False),
    "per-channel, 7-bit": (True, True),
    "per-tensor": (False, False),
    "per-tensor, 7-bit": (False, True),
}
INPUTS, FP32 = "inputs.npz", "edge-fp32.onnx"
ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Row:
    release: str
    setting: str
    rows: int
    native: float
    emulated_rows: int
    haswell: float | None
    native_same_rows: float  # this CPU on the rows the emulated CPU ran
    mib: float
    b1: float
    b8: float
    fp32_b1: float


def int8_file(name: str) -> str:
    return "edge-int8-" + name.replace(", ", "-") + ".onnx"


def session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def batches(work: Path, rows: int | None = None) -> list[dict[str, np.ndarray]]:
    with np.load(work / INPUTS) as data:
        ids, mask = data["input_ids"], data["attention_mask"]
    if rows is not None:
        ids, mask = ids[:rows], mask[:rows]
    out = []
    for start in range(0, len(ids), 32):  # publish's batches, each padded to its longest row
        m = mask[start:start + 32]
        length = int(m.sum(1).max())
        out.append({"input_ids": ids[start:start + 32, :length], "attention_mask": m[:, :length]})
    return out


def logits(work: Path, rows: int | None = None,
           names: tuple[str, ...] = ("fp32", *SETTINGS)) -> dict[str, np.ndarray]:
    """Each model's logits on the calibration rows (the emulated worker runs the INT8 ones;
    fp32 kernels do not depend on VNNI, so the native fp32 logits are its reference)."""
    feeds = batches(work, rows)
    result = {}
    for name in names:
        s = session(work / (FP32 if name == "fp32" else int8_file(name)))
        result[name] = np.concatenate([s.run(None, f)[0] for f in feeds])
    return result


def prepare(release: Path, work: Path) -> int:
    """Export and quantize the release's edge, tokenize its calibration rows; returns rows."""
    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from registry.publish.export import export_onnx
    from registry.publish.source import load_source
    from serving.model.runner import text_inputs
    from serving.model.text import pad

    source = load_source(release)
    assert source.calibration is not None and source.tokenizer is not None
    inputs = text_inputs(source.tokenizer, source.max_length,
                         [str(t) for t in source.calibration.items])
    rows = [b["input_ids"][i, :int(b["attention_mask"][i].sum())]
            for b in inputs.batches for i in range(len(b["input_ids"]))]
    padded = pad(rows)
    np.savez(work / INPUTS, input_ids=padded.input_ids, attention_mask=padded.attention_mask)
    export_onnx(torch.jit.load(str(source.edge)).eval(), work / FP32)
    logging.disable(logging.WARNING)
    for name, (per_channel, reduce_range) in SETTINGS.items():
        quantize_dynamic(str(work / FP32), str(work / int8_file(name)), per_channel=per_channel,
                         reduce_range=reduce_range, weight_type=QuantType.QInt8)
    logging.disable(logging.NOTSET)
    return len(rows)


def emulated(work: Path, rows: int) -> dict[str, np.ndarray] | None:
    qemu = shutil.which("qemu-x86_64")
    if qemu is None or platform.machine() != "x86_64":
        return None
    out = work / "emulated.npz"
    subprocess.run([qemu, "-cpu", "Haswell", sys.executable, "-m", "bench.quantization",
                    "--worker", str(work), "--emulated-rows", str(rows), "--out", str(out)],
                   check=True, stderr=subprocess.DEVNULL, cwd=ROOT)
    with np.load(out) as data:
        return {k: data[k] for k in data.files}


def speed(path: Path, work: Path, batch: int, repeats: int, rows: int = 256) -> float:
    """Rows/s over the first ``rows`` rows in batches of ``batch`` (median of passes)."""
    with np.load(work / INPUTS) as data:
        ids, mask = data["input_ids"][:rows], data["attention_mask"][:rows]
    s = session(path)
    feeds = []
    for start in range(0, len(ids), batch):
        m = mask[start:start + batch]
        length = int(m.sum(1).max())
        feeds.append({"input_ids": ids[start:start + batch, :length],
                      "attention_mask": m[:, :length]})
    s.run(None, feeds[0])  # warm-up
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        for f in feeds:
            s.run(None, f)
        times.append(time.perf_counter() - started)
    return len(ids) / statistics.median(times)


def agreement(a: np.ndarray, b: np.ndarray) -> float:
    return float((a.argmax(1) == b.argmax(1)).mean())


def measure(name: str, release: Path, args: argparse.Namespace) -> list[Row]:
    from registry.publish.export import QUANTIZATION

    with tempfile.TemporaryDirectory(prefix="tiered-quant-") as tmp:
        work = Path(tmp)
        rows = prepare(release, work)
        native = logits(work)
        emulated_rows = min(rows, args.emulated_rows)
        haswell = emulated(work, emulated_rows)
        results = []
        for setting, flags in SETTINGS.items():
            path = work / int8_file(setting)
            shipped = flags == (QUANTIZATION.per_channel, QUANTIZATION.reduce_range)
            results.append(Row(
                name, setting + (" (shipped)" if shipped else ""), rows,
                agreement(native[setting], native["fp32"]), emulated_rows if haswell else 0,
                agreement(haswell[setting], native["fp32"][:emulated_rows]) if haswell else None,
                agreement(native[setting][:emulated_rows], native["fp32"][:emulated_rows]),
                path.stat().st_size / 2**20, speed(path, work, 1, args.repeats),
                speed(path, work, 8, args.repeats), speed(work / FP32, work, 1, args.repeats)))
        return results


def worker(args: argparse.Namespace) -> None:
    result = logits(Path(args.worker), args.emulated_rows, tuple(SETTINGS))
    np.savez(args.out, **result)  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--demo", type=Path, default=Path("var/demo/release"),
                        help="demo release folder (skipped when missing)")
    parser.add_argument("--emulated-rows", type=int, default=256,
                        help="rows run under the emulated AVX2 CPU, per release")
    parser.add_argument("--repeats", type=int, default=5, help="timed passes per figure")
    parser.add_argument("--markdown", type=Path, help="also write the tables here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
    else:
        report(args)


def report(args: argparse.Namespace) -> None:
    from rich.table import Table

    from bench.harness import console
    from bench.kit import cpu
    from bench.markdown import Shown
    from examples.sentiment.tiny import build_tiny_release

    show = Shown(console)
    emulation = ("qemu-x86_64 -cpu Haswell (avx2, no avx512, no vnni)"
                 if shutil.which("qemu-x86_64") else "skipped (no qemu-user)")
    show(f"Machine: {cpu()}, {os.cpu_count()} cores, onnxruntime {ort.__version__}; emulated "
         f"CPU: {emulation}.")
    results = []
    with tempfile.TemporaryDirectory(prefix="tiered-tiny-") as tmp:
        results += measure("tiny test edge", build_tiny_release(Path(tmp) / "release"), args)
    if (args.demo / "tiered.json").is_file():
        results += measure("demo edge", args.demo, args)
    table = Table(title="INT8 edge vs its fp32 ONNX: top-1 agreement and speed (1 thread)")
    for column in ("release", "weights", "agreement, this CPU", "agreement, AVX2 (emulated)",
                   "MiB", "rows/s b1", "rows/s b8", "b1 vs fp32"):
        table.add_column(column)
    for r in results:
        haswell = "-" if r.haswell is None else (
            f"{r.haswell:.2%} of {r.emulated_rows} (this CPU: {r.native_same_rows:.2%})")
        table.add_row(r.release, r.setting, f"{r.native:.2%} of {r.rows}", haswell,
                      f"{r.mib:.1f}", f"{r.b1:.0f}", f"{r.b8:.0f}", f"{r.b1 / r.fp32_b1:.2f}x")
    show(table)
    show("The emulated column covers the first rows only (emulation is slow); in brackets, this "
         "CPU on the same rows. docs/quantization.md has both CPUs on every row.")
    if args.markdown:
        show.write(args.markdown, "INT8 quantization across CPUs (`python -m bench.quantization`)")
    print(json.dumps([asdict(r) for r in results], indent=1), file=sys.stderr)


if __name__ == "__main__":
    main()
