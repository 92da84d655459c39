"""The confidence gate: which rows the edge answers and which go to the center."""

from __future__ import annotations

from typing import Any

import numpy as np

from serving.errors import BadRequest


def threshold_for(parameters: dict[str, Any], calibrated: float, override: float | None) -> float:
    """The request's ``parameters.threshold`` (0 = never escalate, 1 = always), else the edge's
    override, else the release's calibrated threshold."""
    value = parameters.get("threshold")
    if value is None:
        return calibrated if override is None else override
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise BadRequest("parameters.threshold must be a number between 0 and 1")
    return float(value)


def unsure(probabilities: np.ndarray, threshold: float) -> np.ndarray:
    """Indices of rows whose confidence (max probability) is below the threshold.

    A threshold of 1 escalates every row, even one the edge is certain about.
    """
    confidence = probabilities.max(axis=1)
    mask = np.ones(len(confidence), bool) if threshold >= 1 else confidence < threshold
    return np.flatnonzero(mask)
