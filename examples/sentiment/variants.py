"""Small changes to a release folder, as a team ships them between retrains: what chunked
releases are measured on (the sites test's thin link, ``tests/integration/test_chunks.py``).

``head_only``: the models' classifier heads changed (as a head-only fine-tune leaves them),
every other weight the same. ``recalibrated``: the same models, calibrated on the same rows in
another order (a new threshold and probe, the same model files).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from examples.sentiment.release import CALIBRATION, CENTER, EDGE
from serving.model import torchscript


def head_only(release: Path, out: Path, scale: float = 1.5) -> Path:
    """``release`` with every classifier weight multiplied by ``scale``."""
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(release, out)
    for name in (CENTER, EDGE):
        module = torchscript.load(out / name)
        with torch.no_grad():
            module.classifier.weight.mul_(scale)
        torchscript.save(module, out / name)
    return out


def recalibrated(release: Path, out: Path, shift: int = 10) -> Path:
    """``release`` with its calibration rows rotated by ``shift``."""
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(release, out)
    rows = (release / CALIBRATION).read_text(encoding="utf-8").splitlines(keepends=True)
    (out / CALIBRATION).write_text("".join(rows[shift:] + rows[:shift]), encoding="utf-8")
    return out
