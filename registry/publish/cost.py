"""What a row costs each tier, measured at publish on the publisher's CPU.

The center's TorchScript fp32 and the edge's INT8 ONNX each run in process over the same
calibration rows in batches of ``BATCH`` (the batch publish and the tiers' batchers use), after
one warm-up call; the figure is the median, over ``REPEATS`` passes of ``BATCHES`` batches, of
a batch's time divided by its rows. It says
what the cascade saves per row the edge answers; a GPU center, or another CPU, costs otherwise,
so the platform is recorded with it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import onnxruntime as ort
import torch

from registry.publish.validate import Inputs, run_onnx, run_torchscript
from serving.model.outputs import Selector
from serving.model.runner import BATCH, Feeds
from serving.release import hardware
from serving.release.manifest import Cost

REPEATS = 3
BATCHES = 3  # a sample of the split: a large center takes ~10 ms a row on two cores


def measure(center: torch.jit.ScriptModule, edge: ort.InferenceSession,
            inputs: Inputs, repeats: int = REPEATS, output: Selector | None = None) -> Cost:
    """Each tier's milliseconds per row on the first ``BATCHES`` batches of ``inputs``;
    ``output``: where the center's logits are in what it returns (a tuple's, a dict's)."""
    batches = inputs.batches[:BATCHES]
    rows = sum(len(next(iter(b.values()))) for b in batches)
    center_ms = _median(lambda b: run_torchscript(center, Inputs([b], inputs.kind), "center",
                                                         output),
                        batches, repeats)
    edge_ms = _median(lambda b: run_onnx(edge, Inputs([b], inputs.kind), "edge INT8"),
                      batches, repeats)
    runtime = f"torch {torch.__version__}, onnxruntime {ort.__version__} CPU"
    return Cost(center_ms=round(center_ms, 6), edge_ms=round(edge_ms, 6), batch=BATCH,
                rows=rows, repeats=repeats, platform=hardware.here(runtime))


def _median(run: Callable[[Feeds], object], batches: list[Feeds], repeats: int) -> float:
    """The median over ``repeats`` passes of each batch's milliseconds per row."""
    run(batches[0])  # warm-up: first-call allocations and lazy kernel choices
    samples = []
    for _ in range(repeats):
        for batch in batches:
            start = time.perf_counter()
            run(batch)
            samples.append((time.perf_counter() - start) * 1000
                           / len(next(iter(batch.values()))))
    return statistics.median(samples)
