"""Figures the digits build writes to ``report.json`` and prints: accuracies, the cascade."""

from __future__ import annotations

import platform
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from examples.digits import data, models
from serving.model.scores import softmax

Model = Callable[[torch.Tensor], torch.Tensor]
THRESHOLDS = [0.7, 0.9, 0.99]


def cpu_name(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The first "model name" of /proc/cpuinfo (Linux), else what Python knows."""
    try:
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def logits(model: Model, images: data.Images, batch_size: int = 500) -> np.ndarray:
    with torch.inference_mode():
        return np.concatenate([model(models.normalise(images[i:i + batch_size])).numpy()
                               for i in range(0, len(images), batch_size)])


def figures(scripted: Mapping[str, Model],
            splits: Mapping[str, data.Digits]) -> dict[str, Any]:
    """Accuracy of each model on each split; on the test split, the cascade (rows whose edge
    confidence is below a threshold answered by the center) at a few thresholds."""
    found = {split: {name: logits(model, part.images) for name, model in scripted.items()}
             for split, part in splits.items()}
    accuracy = {split: {name: round(float((out.argmax(1) == splits[split].labels).mean()), 4)
                        for name, out in by_model.items()}
                for split, by_model in found.items()}
    edge, center, labels = found["test"]["edge"], found["test"]["center"], splits["test"].labels
    cascade = []
    for threshold in THRESHOLDS:
        escalate = softmax(edge).max(1) < threshold
        answer = np.where(escalate, center.argmax(1), edge.argmax(1))
        cascade.append({"threshold": threshold, "escalation": round(float(escalate.mean()), 4),
                        "accuracy": round(float((answer == labels).mean()), 4)})
    return {"rows": {split: len(part) for split, part in splits.items()},
            "accuracy": accuracy, "cascade": cascade}


def show(console: Console, r: dict[str, Any]) -> None:
    test, calibration = r["accuracy"]["test"], r["accuracy"]["calibration"]
    table = Table(title=f"digits release: {r['rows']['test']} test digits")
    for col in ("model", "parameters", "test accuracy", "calibration accuracy"):
        table.add_column(col, justify="right")
    for name in ("edge", "center"):
        table.add_row(f"{name} TorchScript fp32", f"{r['parameters'][name]:,}",
                      f"{test[name]:.2%}", f"{calibration[name]:.2%}")
    console.print(table)
    cascade = Table(title="cascade on the test split (edge confidence < threshold -> center)")
    for col in ("threshold", "escalated", "cascade accuracy"):
        cascade.add_column(col, justify="right")
    cascade.add_row("edge only", "0.00%", f"{test['edge']:.2%}")
    for row in r["cascade"]:
        cascade.add_row(f"{row['threshold']:.2f}", f"{row['escalation']:.2%}",
                        f"{row['accuracy']:.2%}")
    cascade.add_row("center only", "100.00%", f"{test['center']:.2%}")
    console.print(cascade)
    console.print(f"build time {r['build_seconds']:.1f} s on {r['cpu']} "
                  f"({r['threads']} torch threads)")
