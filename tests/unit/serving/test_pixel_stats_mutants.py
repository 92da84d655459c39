"""An image's drift statistics are exactly what their definitions say, on a non-square image
(height and width differ, so a swapped or shifted axis shows), checked against a plain loop;
and a row exactly at the outlier bound (4 reference stds) is not an outlier."""

from __future__ import annotations

import math

import numpy as np
import pytest

from serving.inputs.drift import OUTLIER_STD, InputDrift
from serving.inputs.pixel_stats import PixelStats
from serving.release.manifest import ImageInput, InputReference


def by_definition(grey: np.ndarray) -> dict[str, float]:
    """The layout statistics of one grey image, pixel by pixel."""
    h, w = grey.shape
    horizontal = sum((grey[i, j + 1] - grey[i, j]) ** 2 for i in range(h)
                     for j in range(w - 1)) / (h * (w - 1))
    vertical = sum((grey[i + 1, j] - grey[i, j]) ** 2 for i in range(h - 1)
                   for j in range(w)) / ((h - 1) * w)
    mass = grey - grey.min()
    total = mass.sum()
    ys = [(i + 0.5) / h - 0.5 for i in range(h)]
    xs = [(j + 0.5) / w - 0.5 for j in range(w)]
    cy = sum(mass[i, j] * ys[i] for i in range(h) for j in range(w)) / total
    cx = sum(mass[i, j] * xs[j] for i in range(h) for j in range(w)) / total
    vy = sum(mass[i, j] * ys[i] ** 2 for i in range(h) for j in range(w)) / total - cy ** 2
    vx = sum(mass[i, j] * xs[j] ** 2 for i in range(h) for j in range(w)) / total - cx ** 2
    top = sum(mass[i, j] for i in range(h) for j in range(w) if ys[i] < 0)
    bottom = sum(mass[i, j] for i in range(h) for j in range(w) if ys[i] > 0)
    left = sum(mass[i, j] for i in range(h) for j in range(w) if xs[j] < 0)
    right = sum(mass[i, j] for i in range(h) for j in range(w) if xs[j] > 0)
    return {"max": float(grey.max()), "gradient_ratio": math.log(horizontal / vertical),
            "centre_x": cx, "centre_y": cy, "spread_ratio": math.log(vy / vx),
            "top_bottom": (top - bottom) / total, "left_right": (left - right) / total}


@pytest.mark.parametrize(("height", "width"), [(5, 7), (7, 4)])
def test_every_layout_statistic_of_a_non_square_image_is_its_definition(height: int,
                                                                        width: int) -> None:
    grey = np.random.default_rng(height).random((height, width))
    grey[0, 0] = 0.0  # the darkest pixel: the mass's zero
    stats = PixelStats(ImageInput(height=height, width=width, channels=1))
    row = stats([grey[None].astype(np.float32)])[0]
    found = dict(zip(stats.names, row.tolist(), strict=True))
    for name, value in by_definition(grey.astype(np.float32).astype(float)).items():
        assert found[name] == pytest.approx(value, rel=1e-4, abs=1e-5), name
    assert found["mean_c0"] == pytest.approx(grey.mean(), rel=1e-5)
    assert found["std_c0"] == pytest.approx(grey.std(), rel=1e-4)


def test_a_statistic_exactly_four_reference_stds_out_is_not_an_outlier_just_over_it_is() -> None:
    class One:
        kind, statistics = "tensor", ["v"]

        def stats(self, rows: list[np.ndarray]) -> np.ndarray:
            return np.asarray([[float(r[0])] for r in rows])

    ref = InputReference(kind="tensor", statistics=["v"], mean=[1.0], std=[0.5], rows=10,
                         outliers=0.0)
    drift = InputDrift(One(), ref)  # type: ignore[arg-type]
    at, over = 1.0 + OUTLIER_STD * 0.5, 1.0 + OUTLIER_STD * 0.5 + 1e-6
    measured = drift.measure([np.asarray([at]), np.asarray([over]), np.asarray([1.0])])
    assert measured.outliers == 1 and measured.rows == 3
    assert measured.shift.tolist() == pytest.approx([2 * OUTLIER_STD + 2e-6])


def test_a_colour_images_layout_is_the_channels_average_and_each_row_is_its_own() -> None:
    rng = np.random.default_rng(3)
    images = rng.random((2, 3, 5, 7)).astype(np.float32)  # two rows, channels unlike each other
    images[:, 1] *= 0.2
    images[1, :, 0, 0] = 0.0
    images[1, 2, 4, 6] = 3.0  # the second row's largest value, above the first row's
    stats = PixelStats(ImageInput(height=5, width=7, channels=3))
    rows = stats(list(images))
    for k in range(2):
        found = dict(zip(stats.names, rows[k].tolist(), strict=True))
        expected = by_definition(images[k].astype(float).mean(0))
        expected["max"] = float(images[k].max())  # over every channel, not the average
        for name, value in expected.items():
            assert found[name] == pytest.approx(value, rel=1e-4, abs=1e-5), (k, name)
        for c in range(3):
            assert found[f"mean_c{c}"] == pytest.approx(images[k, c].mean(), rel=1e-5)
    assert rows[0, stats.names.index("max")] < 3.0 == rows[1, stats.names.index("max")]
