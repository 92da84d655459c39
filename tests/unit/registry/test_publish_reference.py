"""``registry publish`` records the calibration rows' input statistics in the release manifest
(``input_reference``), the reference every node's input drift is measured against; a release
published without calibration rows carries none, and its manifest reads as before."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from serving.inputs import drift
from serving.inputs.base import Bounds
from serving.inputs.image import ImageCodec
from serving.release.manifest import ImageInput, encode
from tests.conftest import RegistryCli
from tests.kinds import image_release

FLAGS = ("--input", "image:FP32:-1,1,8,8", "--image", "scale=255", "--labels", "dark,bright")


def test_a_published_image_release_carries_its_calibration_rows_reference(
        registry_cli: RegistryCli, tmp_path: Path) -> None:
    model, calibration = image_release(tmp_path / "release")
    registry_cli("publish", model, "--name", "bright", *FLAGS, "--calibration", calibration,
                 timeout=300)
    registry_cli("publish", model, "--name", "plain", *FLAGS, timeout=300)
    catalog = registry_cli.catalog()
    manifest = catalog.resolve("bright", "1").manifest
    ref = manifest.input_reference
    assert ref is not None and ref.kind == "image" and ref.rows == 64
    assert ref.statistics[:3] == ["mean_c0", "std_c0", "max"]
    assert len(ref.mean) == len(ref.std) == len(ref.statistics) and min(ref.std) > 0
    # dark and bright rows alike (0..1 pixels, scale=255): the mean pixel is mid-grey
    assert 0.3 < ref.mean[0] < 0.7 and 0 <= ref.outliers < 0.1
    (request,) = manifest.request_inputs()
    assert isinstance(request, ImageInput)
    codec = ImageCodec(request, manifest.inputs, Bounds(), lambda name: tmp_path)
    measure = drift.InputDrift.of(codec, manifest)
    assert measure is not None  # this node computes the statistics the release recorded
    lines = calibration.read_text().splitlines()
    rows = codec.items([(calibration.parent / f"cal/{i:03d}.png").read_bytes()
                        for i in range(len(lines))])
    shift = measure.measure(rows).shift / len(rows)
    assert np.abs(shift).max() < 1e-3  # its own rows: no shift
    plain = catalog.resolve("plain", "1").manifest
    assert plain.input_reference is None and b"input_reference" not in encode(plain)
