"""What both tiers do around the model: rows in, classification outputs out."""

from __future__ import annotations

from typing import Any

import numpy as np

from serving.errors import BadRequest
from serving.model.scores import softmax
from serving.protocol import v2
from serving.runtime.repository import Resident

__all__ = ["outputs_metadata", "response", "softmax"]

OUTPUTS = ("label", "probabilities", "confidence", "tier")
SMALL = 8  # rows up to which the outputs are computed on Python lists


def outputs_metadata(resident: Resident) -> list[dict[str, Any]]:
    labels = len(resident.manifest.labels)
    return [{"name": "label", "datatype": "BYTES", "shape": [-1]},
            {"name": "probabilities", "datatype": "FP32", "shape": [-1, labels]},
            {"name": "confidence", "datatype": "FP32", "shape": [-1]},
            {"name": "tier", "datatype": "BYTES", "shape": [-1]}]


def response(resident: Resident, parsed: v2.Parsed, probabilities: np.ndarray,
             tiers: list[str], parameters: dict[str, Any]) -> v2.InferResponse:
    """The V2 response; only the outputs the request asked for, when it asked."""
    n, labels = probabilities.shape
    names = resident.manifest.labels
    values = probabilities.astype(np.float32, copy=False)
    if n <= SMALL:  # in Python: numpy's argmax and max cost more than this on a few rows
        rows = values.tolist()
        top = [row.index(max(row)) for row in rows]  # the first of equal maxima, as argmax
        confidence: Any = [row[k] for row, k in zip(rows, top, strict=True)]
        flat: Any = [p for row in rows for p in row]
    else:
        top = values.argmax(1).tolist()
        confidence, flat = values.max(1), values.ravel()
    tensors = {
        "label": v2.ResponseOutput("label", [n], "BYTES", [names[i] for i in top]),
        "probabilities": v2.ResponseOutput("probabilities", [n, labels], "FP32", flat),
        "confidence": v2.ResponseOutput("confidence", [n], "FP32", confidence),
        "tier": v2.ResponseOutput("tier", [n], "BYTES", tiers),
    }
    wanted = parsed.outputs if parsed.outputs is not None else list(OUTPUTS)
    unknown = [name for name in wanted if name not in tensors]
    if unknown:
        raise BadRequest(f"unknown output {unknown[0]!r}: this model returns {list(OUTPUTS)}")
    return v2.InferResponse(model_name=resident.manifest.name,
                            model_version=str(resident.version),
                            outputs=[tensors[name] for name in wanted], id=parsed.id,
                            parameters=parameters)
