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
    tensors = {
        "label": v2.ResponseOutput("label", [n], "BYTES",
                                   [names[i] for i in probabilities.argmax(1)]),
        "probabilities": v2.ResponseOutput("probabilities", [n, labels], "FP32",
                                           probabilities.astype(np.float32).ravel()),
        "confidence": v2.ResponseOutput("confidence", [n], "FP32",
                                        probabilities.max(1).astype(np.float32)),
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
