"""Export an edge model to ONNX and quantize it to INT8 (dynamic, per-channel 7-bit weights)."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import torch
from onnxruntime.quantization import QuantType, quantize_dynamic

from registry.errors import InvalidRelease
from serving.release.manifest import Quantization

INPUT_NAMES = ["input_ids", "attention_mask"]
OPSET = 17


def _example() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.arange(1, 17, dtype=torch.int64).reshape(2, 8)  # no RNG: exports are repeatable
    return ids, torch.ones_like(ids)


def export_onnx(module: torch.jit.ScriptModule, path: Path) -> None:
    """ONNX with dynamic batch and sequence axes, inputs ``input_ids``/``attention_mask``.

    TorchScript modules cannot go through the dynamo exporter, so this uses the TorchScript-based
    exporter, which torch marks deprecated but still ships; its notice is silenced here.
    """
    module.eval()
    dynamic = {name: {0: "batch", 1: "sequence"} for name in INPUT_NAMES}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(module, _example(), str(path), dynamo=False, opset_version=OPSET,
                              input_names=INPUT_NAMES, output_names=["logits"],
                              dynamic_axes={**dynamic, "logits": {0: "batch"}})
    except Exception as exc:
        raise InvalidRelease(f"could not export the edge model to ONNX: {exc}") from exc


QUANTIZATION = Quantization(per_channel=True, reduce_range=True)
"""For the fleet, not the publisher: onnxruntime's u8s8 kernels on x86 without VNNI add pairs
of u8*s8 products in 16 bits, which saturates with full 8-bit weights; 7-bit weights
(``reduce_range``) cannot saturate, so the INT8 model computes the same on AVX2, VNNI, AMX and
ARM. Measured (docs/quantization.md): on AVX2 the tiny test edge goes from 96.0% to 99.5%
agreement, the demo edge from 98.35% to 98.8%, at the same speed; per-tensor weights lose
more on the demo model."""


def precision(q: Quantization) -> str:
    """The edge artifact's ``precision`` string, e.g. ``int8-dynamic-per-channel-7bit``."""
    return (f"{q.weight_type}-{q.method}-{'per-channel' if q.per_channel else 'per-tensor'}"
            f"{'-7bit' if q.reduce_range else ''}")


def quantize_int8(fp32: Path, int8: Path, q: Quantization = QUANTIZATION) -> None:
    """Dynamic INT8 quantization of the weights (activations quantized per batch at run time)."""
    logging.disable(logging.WARNING)  # quantize_dynamic logs advice to the root logger
    try:
        quantize_dynamic(str(fp32), str(int8), per_channel=q.per_channel,
                         reduce_range=q.reduce_range, weight_type=QuantType.QInt8)
    except Exception as exc:
        raise InvalidRelease(f"could not quantize the edge model: {exc}") from exc
    finally:
        logging.disable(logging.NOTSET)
