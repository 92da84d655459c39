"""Export an edge model to ONNX and quantize it to INT8: dynamic (weights INT8, per-channel,
7-bit; activations per batch at run time) for every model, and static (QDQ, per-channel,
activations calibrated on the release's calibration rows) for convolutional models, where
dynamic quantization leaves the convolutions' activations in fp32 or loses fidelity."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import onnx.utils
import torch
from onnxruntime.quantization import (
    CalibrationDataReader,
    QuantFormat,
    QuantType,
    quantize_dynamic,
    quantize_static,
)

from registry.errors import InvalidRelease, brief
from serving.model.outputs import Selected, Selector
from serving.release.manifest import Quantization, TensorSpec

OPSET = 17
TEXT_INPUTS = ("input_ids", "attention_mask")
STATIC_CALIBRATION_ROWS = 512  # rows the activation ranges are calibrated on
Feeds = dict[str, np.ndarray]


def export_onnx(module: torch.jit.ScriptModule, path: Path,
                inputs: list[TensorSpec] | None = None, example: Feeds | None = None,
                output: Selector | None = None) -> None:
    """ONNX with the model's inputs (``inputs``' names, a dynamic axis for every -1) and one
    output, ``logits``, dynamic in its batch; traced on ``example``. Without them: a text
    model's ``input_ids`` and ``attention_mask``, dynamic in batch and sequence. A module
    that returns a tuple or a dict is exported answering only its element ``output``.

    TorchScript modules cannot go through the dynamo exporter, so this uses the TorchScript-based
    exporter, which torch marks deprecated but still ships; its notice is silenced here.
    """
    module.eval()
    if inputs is None or example is None:
        inputs = [TensorSpec(name, "INT64", [-1, -1]) for name in TEXT_INPUTS]
        ids = np.arange(1, 17, dtype=np.int64).reshape(2, 8)  # no RNG: exports are repeatable
        example = {TEXT_INPUTS[0]: ids, TEXT_INPUTS[1]: np.ones_like(ids)}
    names = [i.name for i in inputs]
    dynamic = {i.name: {axis: f"{i.name}_{axis}" if axis else "batch"
                        for axis, size in enumerate(i.shape) if size == -1} for i in inputs}
    args = tuple(torch.from_numpy(example[name]) for name in names)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # the exporter refuses a script module called inside a plain one: trace it first
            exported = (module if output is None
                        else torch.jit.trace(Selected(module, output), args))
            torch.onnx.export(exported, args, str(path), dynamo=False, opset_version=OPSET,
                              input_names=names, output_names=["logits"],
                              dynamic_axes={**dynamic, "logits": {0: "batch"}})
    except Exception as exc:
        raise InvalidRelease(f"could not export the edge model to ONNX: {brief(exc)}") from exc


def one_output(path: Path, work: Path, which: Selector | None,
               option: str) -> tuple[Path, str | None]:
    """The fp32 ONNX edge at ``path`` with only its logits output (the one named or indexed by
    ``which``, else ``logits`` or the first), extracted into ``work``, and that output's name;
    ``path`` itself and None when it has one output."""
    try:
        graph = onnx.load(str(path), load_external_data=False).graph
    except Exception as exc:
        raise InvalidRelease(f"{path}: the edge model is not a loadable ONNX file") from exc
    names = [o.name for o in graph.output]
    if len(names) == 1:
        return path, None
    returns = f"the edge model returns {len(names)} outputs ({', '.join(names)})"
    if isinstance(which, int) and which >= len(names):
        raise InvalidRelease(f"{returns}; {option} {which} is out of range")
    if isinstance(which, str) and which not in names:
        raise InvalidRelease(f"{returns}; {option} {which} is not one of them")
    chosen = (names[which] if isinstance(which, int)
              else which or ("logits" if "logits" in names else names[0]))
    single = work / "edge-fp32.onnx"
    try:
        onnx.utils.extract_model(str(path), str(single), [i.name for i in graph.input
                                                          if i.name not in _weights(graph)],
                                 [chosen])
    except Exception as exc:
        raise InvalidRelease(f"{path}: could not keep only output {chosen!r}: {exc}") from exc
    return single, chosen


def _weights(graph: onnx.GraphProto) -> set[str]:
    """Initializers, which older exporters also list among the graph's inputs."""
    return {w.name for w in graph.initializer}


QUANTIZATION = Quantization(per_channel=True, reduce_range=True)
"""For the fleet, not the publisher: onnxruntime's u8s8 kernels on x86 without VNNI add pairs
of u8*s8 products in 16 bits, which saturates with full 8-bit weights; 7-bit weights
(``reduce_range``) cannot saturate, so the INT8 model computes the same on AVX2, VNNI, AMX and
ARM. Measured (docs/quantization.md): on AVX2 the tiny test edge goes from 96.0% to 99.5%
agreement, the demo edge from 98.35% to 98.8%, at the same speed; per-tensor weights lose
more on the demo model."""
STATIC = Quantization(method="static", per_channel=True, reduce_range=True)


def precision(q: Quantization) -> str:
    """The edge artifact's ``precision`` string, e.g. ``int8-dynamic-per-channel-7bit``."""
    return (f"{q.weight_type}-{q.method}-{'per-channel' if q.per_channel else 'per-tensor'}"
            f"{'-7bit' if q.reduce_range else ''}")


def convolutional(path: Path) -> bool:
    """Whether the ONNX graph convolves (static quantization is then worth trying)."""
    return any(node.op_type == "Conv" for node in onnx.load(str(path)).graph.node)


def quantize_int8(fp32: Path, int8: Path, q: Quantization = QUANTIZATION,
                  calibration: list[Feeds] | None = None) -> None:
    """INT8 quantization by ``q.method``: dynamic, or static on ``calibration``'s batches."""
    logging.disable(logging.WARNING)  # onnxruntime's quantizers log advice to the root logger
    try:
        if q.method == "static":
            quantize_static(str(fp32), str(int8), _Reader(calibration or []),
                            quant_format=QuantFormat.QDQ, per_channel=q.per_channel,
                            reduce_range=q.reduce_range, activation_type=QuantType.QUInt8,
                            weight_type=QuantType.QInt8)
        else:
            quantize_dynamic(str(fp32), str(int8), per_channel=q.per_channel,
                             reduce_range=q.reduce_range, weight_type=QuantType.QInt8)
    except Exception as exc:
        raise InvalidRelease(f"could not quantize the edge model ({q.method}): {brief(exc)}") \
            from exc
    finally:
        logging.disable(logging.NOTSET)


class _Reader(CalibrationDataReader):
    """The calibration batches, up to ``STATIC_CALIBRATION_ROWS`` rows, one at a time."""

    def __init__(self, batches: list[Feeds]) -> None:
        self._batches = iter(self._bounded(batches))

    @staticmethod
    def _bounded(batches: list[Feeds]) -> Iterator[Feeds]:
        rows = 0
        for batch in batches:
            if rows >= STATIC_CALIBRATION_ROWS:
                return
            rows += len(next(iter(batch.values())))
            yield batch

    def get_next(self) -> Feeds | None:
        return next(self._batches, None)
