"""Figures the demo build prints: accuracies, INT8 fidelity, latency, the cascade table."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.table import Table
from tokenizers import Tokenizer

from registry.publish.calibrate import calibrate
from serving.model.scores import softmax
from serving.model.text import encode

Model = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
THRESHOLDS = [0.6, 0.7, 0.8, 0.9, 0.95, 0.99]
TOLERANCE = 0.005


def latency(center: Model, edge: Model, tokenizer: Tokenizer, texts: list[str],
            batch: int = 8, repeats: int = 30) -> dict[str, float]:
    """Median milliseconds per batch of 8 real snippets, center fp32 vs edge INT8, one run."""
    enc = encode(tokenizer, texts[:batch])
    ids, mask = torch.from_numpy(enc.input_ids), torch.from_numpy(enc.attention_mask)
    times: dict[str, list[float]] = {"center": [], "edge": []}
    with torch.inference_mode():
        for _ in range(3):
            center(ids, mask)
            edge(ids, mask)
        for _ in range(repeats):  # interleaved so both see the same machine load
            for name, model in (("center", center), ("edge", edge)):
                start = time.perf_counter()
                model(ids, mask)
                times[name].append((time.perf_counter() - start) * 1000)
    c, e = statistics.median(times["center"]), statistics.median(times["edge"])
    return {"latency_tokens": int(ids.shape[1]), "center_ms": round(c, 2),
            "edge_int8_ms": round(e, 2), "edge_speedup": round(c / e, 2)}


def _acc(logits: np.ndarray, labels: np.ndarray) -> float:
    return float((logits.argmax(1) == labels).mean())


def cascade_at(center: np.ndarray, edge: np.ndarray, labels: np.ndarray,
               threshold: float) -> tuple[float, float]:
    """Escalation rate and cascade accuracy when rows below ``threshold`` go to the center."""
    escalate = softmax(edge).max(1) < threshold
    pred = np.where(escalate, center.argmax(1), edge.argmax(1))
    return float(escalate.mean()), float((pred == labels).mean())


def figures(logits: dict[str, np.ndarray], val_labels: list[int],
            test_labels: list[int]) -> dict[str, Any]:
    y = np.asarray(test_labels)
    center, edge = logits["test_center"], logits["test_edge_int8"]
    calibration = calibrate(logits["val_center"], logits["val_edge_int8"], val_labels, TOLERANCE)
    rate, acc = cascade_at(center, edge, y, calibration.threshold)
    rows = [{"threshold": t, **dict(zip(("escalation", "accuracy"),
                                        cascade_at(center, edge, y, t), strict=True))}
            for t in THRESHOLDS]
    return {
        "test_rows": len(y),
        "accuracy": {"center_fp32": _acc(center, y), "edge_fp32": _acc(logits["test_edge_fp32"], y),
                     "edge_int8": _acc(edge, y)},
        "int8_agreement": float((edge.argmax(1) == logits["test_edge_fp32"].argmax(1)).mean()),
        "calibrated": {"threshold": calibration.threshold,
                       "val_escalation": calibration.escalation_rate,
                       "test_escalation": rate, "test_cascade_accuracy": acc},
        "cascade": rows,
    }


def show(console: Console, r: dict[str, Any]) -> None:
    a, cal = r["accuracy"], r["calibrated"]
    table = Table(title=f"demo release: test split ({r['test_rows']} rows)")
    for col in ("model", "test accuracy", "size", "batch-8 latency"):
        table.add_column(col, justify="right")
    table.add_row("center TorchScript fp32", f"{a['center_fp32']:.2%}",
                  f"{r['center_bytes'] / 2**20:.1f} MiB", f"{r['center_ms']:.1f} ms")
    table.add_row("edge ONNX fp32", f"{a['edge_fp32']:.2%}",
                  f"{r['edge_fp32_bytes'] / 2**20:.1f} MiB", "")
    table.add_row("edge ONNX INT8", f"{a['edge_int8']:.2%}",
                  f"{r['edge_int8_bytes'] / 2**20:.1f} MiB", f"{r['edge_int8_ms']:.1f} ms")
    console.print(table)
    console.print(f"edge INT8 is {r['edge_speedup']:.1f}x cheaper than the center per batch of 8 "
                  f"({r['latency_tokens']} tokens); INT8 agrees with edge fp32 on "
                  f"{r['int8_agreement']:.2%} of test rows")
    cascade = Table(title="cascade on the test split (edge confidence < threshold -> center)")
    for col in ("threshold", "escalated", "cascade accuracy"):
        cascade.add_column(col, justify="right")
    cascade.add_row("edge only", "0.00%", f"{a['edge_int8']:.2%}")
    for row in r["cascade"]:
        cascade.add_row(f"{row['threshold']:.2f}", f"{row['escalation']:.2%}",
                        f"{row['accuracy']:.2%}")
    cascade.add_row(f"[bold]{cal['threshold']:.4f} (calibrated on val)[/]",
                    f"[bold]{cal['test_escalation']:.2%}[/]",
                    f"[bold]{cal['test_cascade_accuracy']:.2%}[/]")
    cascade.add_row("center only", "100.00%", f"{a['center_fp32']:.2%}")
    console.print(cascade)
    console.print(f"build time {r['build_seconds']:.0f}s")
