"""An edge's escalation budget for one model, as the registry grants it (``registry.fleet.budgets``
computes it, the sync stream carries it, ``edge.controller`` holds to it)."""

from __future__ import annotations

import math
from dataclasses import dataclass

MAX_ROWS_S = 1e9  # anything above is not a budget a registry would send


@dataclass(frozen=True)
class Budget:
    controlled: bool  # False: hold the release's calibrated threshold
    rows_per_s: float = 0.0  # escalated rows per second this edge may send
    capacity_rows_s: float = 0.0  # all centers together, for the operator
    share: float = 0.0  # this edge's part of it (0..1)

    @classmethod
    def checked(cls, controlled: bool, rows_per_s: float, capacity_rows_s: float,
                share: float) -> Budget:
        """A received budget, or ValueError when a figure is not one a registry sends."""
        for name, value in (("rows_per_s", rows_per_s), ("capacity_rows_s", capacity_rows_s)):
            if not (math.isfinite(value) and 0 <= value <= MAX_ROWS_S):
                raise ValueError(f"budget {name} {value!r} is outside 0..{MAX_ROWS_S:g}")
        if not (math.isfinite(share) and 0 <= share <= 1):
            raise ValueError(f"budget share {share!r} is outside 0..1")
        return cls(bool(controlled), float(rows_per_s), float(capacity_rows_s), float(share))
