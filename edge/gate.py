"""The confidence gate: which rows the edge answers and which go to the center."""

from __future__ import annotations

import numpy as np

SMALL = 8  # rows up to which the gate compares in Python


def unsure(confidence: np.ndarray, threshold: float) -> list[int]:
    """Indices of rows whose confidence (their max probability) is below the threshold.

    A threshold of 1 escalates every row, even one the edge is certain about.
    """
    if threshold >= 1:
        return list(range(len(confidence)))
    if len(confidence) <= SMALL:  # in Python: cheaper than two numpy calls on a few rows
        return [j for j, c in enumerate(confidence.tolist()) if c < threshold]
    return np.flatnonzero(confidence < threshold).tolist()
