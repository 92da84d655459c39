"""Probe rows stored compactly: a probe that would be larger than the edge model keeps its
float inputs as 8-bit codes, then fewer rows, never fewer than the floor; a node rebuilds
exactly the values the references were computed on; probes written before still load."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from serving.errors import ProbeError
from serving.release import compact, probe
from serving.release.manifest import TensorSpec

IMAGE = [TensorSpec("image", "FP32", [-1, 3, 16, 16])]


def images(rows: int = 128) -> probe.Feeds:
    """Normalised 8-bit pixels, per channel, as an image codec makes them."""
    pixels = np.random.default_rng(0).integers(0, 256, (rows, 3, 16, 16)).astype(np.float32)
    mean = np.array([0.485, 0.456, 0.406], np.float32).reshape(1, 3, 1, 1)
    std = np.array([0.229, 0.224, 0.225], np.float32).reshape(1, 3, 1, 1)
    return {"image": ((pixels / np.float32(255) - mean) / std).astype(np.float32)}


def logits(rows: int) -> np.ndarray:
    return np.random.default_rng(1).normal(size=(rows, 2)).astype(np.float32)


def save(path: Path, stored: probe.Feeds) -> Path:
    rows = len(next(iter(stored.values())))
    probe.save(path, stored, logits(rows), logits(rows))
    return path


def test_a_probe_within_the_budget_is_stored_as_it_is() -> None:
    feeds = images()
    stored, used = compact.fit(feeds, budget=10 << 20, classes=2, min_rows=64)
    assert stored is feeds and used is feeds


def test_a_probe_over_the_budget_keeps_its_rows_as_codes_a_node_rebuilds_bit_for_bit(
        tmp_path: Path) -> None:
    feeds = images()
    plain = compact.size(feeds, 2)
    stored, used = compact.fit(feeds, budget=plain - 1, classes=2, min_rows=64)
    assert stored["image"].dtype == np.uint8 and len(stored["image"]) == 128
    assert compact.size(stored, 2) < plain * 0.7  # random pixels: no better than 8 bits
    # 8 bits keep 8-bit pixels: every value within half a step of what it was
    step = stored["image" + compact.SCALE].reshape(1, 3, 1, 1)
    assert (np.abs(used["image"] - feeds["image"]) <= step / 2 + 1e-6).all()
    loaded = probe.load(save(tmp_path / "probe.npz", stored), IMAGE)
    assert loaded.feeds["image"].dtype == np.float32
    assert loaded.feeds["image"].tobytes() == used["image"].tobytes()


def test_fewer_rows_when_codes_are_still_too_large_but_never_below_the_floor() -> None:
    feeds = images()
    packed = compact.size(compact.pack(feeds)[0], 2)
    stored, used = compact.fit(feeds, budget=packed - 1, classes=2, min_rows=64)
    assert 64 <= len(stored["image"]) < 128 and len(used["image"]) == len(stored["image"])
    assert compact.size(stored, 2) <= packed - 1
    tiny, _ = compact.fit(feeds, budget=1000, classes=2, min_rows=64)
    assert len(tiny["image"]) == 64  # over the budget: the floor wins


def test_integer_inputs_are_kept_as_they_are() -> None:
    feeds = {"input_ids": np.arange(64 * 8, dtype=np.int64).reshape(64, 8)}
    stored, used = compact.pack(feeds)
    assert stored == {"input_ids": feeds["input_ids"]} and used["input_ids"] is feeds["input_ids"]


def test_a_constant_channel_comes_back_exactly() -> None:
    feeds = {"features": np.tile(np.array([[3.25, -1.0]], np.float32), (10, 1))}
    feeds["features"][:, 1] = np.linspace(-1, 1, 10)
    _, used = compact.pack(feeds)
    assert (used["features"][:, 0] == 3.25).all()
    assert np.abs(used["features"][:, 1] - feeds["features"][:, 1]).max() <= 1 / 255


def test_a_probe_written_before_codes_still_loads(tmp_path: Path) -> None:
    feeds = images(40)
    loaded = probe.load(save(tmp_path / "old.npz", feeds), IMAGE)
    assert loaded.feeds["image"].tobytes() == feeds["image"].tobytes() and loaded.rows == 40


@pytest.mark.parametrize(("change", "message"), [
    (lambda a: a.update({"image.scale": a["image.scale"][:2]}), "scale of shape [2]"),
    (lambda a: a.update({"image.offset": np.full(3, np.nan, np.float32)}), "offset"),
    (lambda a: a.update({"image": a["image"].astype(np.int16)}), "expected uint8"),
    (lambda a: a.update({"image.scale": a["image.scale"].astype(np.float64)}),
     "expected float32"),
    (lambda a: a.pop("image.offset"), "expected the arrays"),
])
def test_malformed_codes_are_refused(tmp_path: Path, change: object, message: str) -> None:
    stored, _ = compact.pack(images(16))
    arrays = dict(stored)
    change(arrays)  # type: ignore[operator]
    with pytest.raises(ProbeError, match=message.replace("[", r"\[")):
        probe.load(save(tmp_path / "bad.npz", arrays), IMAGE)


def test_codes_for_an_integer_input_are_refused(tmp_path: Path) -> None:
    ids = [TensorSpec("input_ids", "INT64", [-1, -1])]
    arrays: probe.Feeds = {"input_ids": np.zeros((8, 4), np.uint8),
                           "input_ids.scale": np.ones(4, np.float32),
                           "input_ids.offset": np.zeros(4, np.float32)}
    with pytest.raises(ProbeError, match="expected the arrays"):
        probe.load(save(tmp_path / "ids.npz", arrays), ids)
