"""Input drift: a version's rows measured against its release's calibration rows.

Each input kind's codec gives per-row statistics (``Codec.stats``: text lengths, image pixel
and orientation statistics, tensor features). At publish, :func:`reference` records their mean
and standard deviation over the calibration rows in the manifest (``InputReference``); a node
serving the version standardises each row's statistics by them (:class:`InputDrift`), and its
quality window sums them (``serving.telemetry.quality``): the window's ``input_shift`` is the
largest ``|mean z|`` over the statistics, ``input_outliers`` the share of rows with some
``|z| > OUTLIER_STD``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from serving.inputs.base import Codec
from serving.release.manifest import InputReference, Manifest

log = logging.getLogger(__name__)

OUTLIER_STD = 4.0
"""A row is an outlier when one of its statistics lies this many reference stds out."""
STD_FLOOR = 1e-3
"""A statistic's reference std is at least this x max(1, |mean|): one constant in the
calibration rows (a blank corner) does not turn a rounding difference into a drift."""
BATCH = 256  # calibration rows per stats call at publish


@dataclass(frozen=True)
class InputSums:
    """Some rows' standardised statistics, summed (what a quality window adds up)."""

    shift: np.ndarray  # per statistic: sum over the rows of (value - ref mean) / ref std
    outliers: int  # rows with some statistic beyond OUTLIER_STD
    rows: int


def reference(codec: Codec, rows: list[np.ndarray]) -> InputReference | None:
    """The statistics of a release's calibration ``rows`` (None without rows)."""
    if not rows:
        return None
    values = np.concatenate([codec.stats(rows[i:i + BATCH])
                             for i in range(0, len(rows), BATCH)])
    mean = values.mean(0)
    std = np.maximum(values.std(0), STD_FLOOR * np.maximum(1.0, np.abs(mean)))
    outliers = (np.abs(values - mean) > OUTLIER_STD * std).any(1).mean()
    return InputReference(kind=codec.kind,  # type: ignore[arg-type]
                          statistics=list(codec.statistics), mean=_rounded(mean),
                          std=_rounded(std), rows=len(rows), outliers=round(float(outliers), 6))


def _rounded(values: np.ndarray) -> list[float]:
    return [float(f"{v:.7g}") for v in values.tolist()]


class InputDrift:
    """One resident version's measure (built when it loads; None when it cannot measure)."""

    def __init__(self, codec: Codec, ref: InputReference) -> None:
        self.codec = codec
        self.mean = np.asarray(ref.mean, np.float64)
        # floored again: a hand-written manifest's 0 must not divide
        self.std = np.maximum(np.asarray(ref.std, np.float64),
                              STD_FLOOR * np.maximum(1.0, np.abs(self.mean)))

    @classmethod
    def of(cls, codec: Codec, manifest: Manifest) -> InputDrift | None:
        """None for a release without a reference, or one whose statistics this node's codec
        does not compute (published by other code): nothing is compared then."""
        ref = manifest.input_reference
        if ref is None:
            return None
        if ref.kind != codec.kind or ref.statistics != codec.statistics or \
                len(ref.mean) != len(ref.statistics) or len(ref.std) != len(ref.statistics):
            log.warning("%s version %s: its input reference holds statistics this node does "
                        "not compute (%s); input drift is not measured", manifest.name,
                        manifest.version, ", ".join(ref.statistics[:5]))
            return None
        return cls(codec, ref)

    def measure(self, rows: list[np.ndarray]) -> InputSums:
        z = (self.codec.stats(rows) - self.mean) / self.std
        return InputSums(z.sum(0), int((np.abs(z) > OUTLIER_STD).any(1).sum()), len(rows))
