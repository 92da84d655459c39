"""The confidence gate: which rows the edge answers and which go to the center."""

from __future__ import annotations

import numpy as np


def unsure(probabilities: np.ndarray, threshold: float) -> np.ndarray:
    """Indices of rows whose confidence (max probability) is below the threshold.

    A threshold of 1 escalates every row, even one the edge is certain about.
    """
    confidence = probabilities.max(axis=1)
    mask = np.ones(len(confidence), bool) if threshold >= 1 else confidence < threshold
    return np.flatnonzero(mask)
