"""The confidence gate: which rows the edge answers and which go to the center."""

from __future__ import annotations

import numpy as np


def unsure(confidence: np.ndarray, threshold: float) -> list[int]:
    """Indices of rows whose confidence (their max probability) is below the threshold.

    A threshold of 1 escalates every row, even one the edge is certain about.
    """
    if threshold >= 1:
        return list(range(len(confidence)))
    return np.flatnonzero(confidence < threshold).tolist()
