"""The image kind (``serving.inputs.image``, ``serving.inputs.pixels``) value by value: the
centre crop's place, each channel's mean and std, the pixel tensors' bounds, what warm-up and
calibration get. The tests that kill `make mutate`'s mutants the older tests let through."""

from __future__ import annotations

import io
from pathlib import Path

import msgspec
import numpy as np
import pytest
from PIL import Image

from serving.errors import BadRequest
from serving.inputs import pixels
from serving.inputs.base import Bounds
from serving.inputs.image import ImageCodec
from serving.protocol import v2
from serving.release.manifest import ImageInput, TensorSpec

GREY = ImageInput(height=8, width=8, channels=1, scale=16.0, mean=[0.5], std=[0.25],
                  max_pixels=4096)
RGB = ImageInput(height=2, width=2, channels=3, scale=100.0, mean=[0.1, 0.2, 0.3],
                 std=[0.5, 0.25, 2.0], max_pixels=4096)


def codec(spec: ImageInput = GREY, max_rows: int = 4,
          shape: list[int] | None = None) -> ImageCodec:
    model = [TensorSpec(spec.name, "FP32", shape or [-1, spec.channels, spec.height,
                                                     spec.width])]
    return ImageCodec(spec, model, Bounds(max_rows=max_rows), Path)


def ramp(width: int, height: int) -> np.ndarray:
    """Grey pixels ``[height, width, 1]`` whose value names their place: 16 * y + x."""
    y, x = np.mgrid[0:height, 0:width]
    return (16 * y + x).astype(np.uint8)[..., None]


def test_the_centre_crop_takes_the_middle_of_a_wide_and_of_a_tall_image() -> None:
    spec = msgspec.structs.replace(GREY, resize=8, scale=1.0, mean=[], std=[])
    wide = ramp(12, 8)  # resized to itself (short side 8), 2 columns cut each side
    (row,) = codec(spec).decode([v2.binary("image", "UINT8", wide[None])], {}).rows
    np.testing.assert_array_equal(row[0], wide[:, 2:10, 0])
    tall = ramp(8, 13)  # 5 rows too many: 2 cut above, 3 below
    (row,) = codec(spec).decode([v2.binary("image", "UINT8", tall[None])], {}).rows
    np.testing.assert_array_equal(row[0], tall[2:10, :, 0])


def test_a_resize_keeps_the_aspect_and_never_goes_below_the_models_size() -> None:
    spec = msgspec.structs.replace(GREY, height=4, width=4, resize=6, scale=1.0, mean=[],
                                   std=[])
    big = np.full((24, 12, 1), 7, np.uint8)  # short side 12 -> 6, long side 24 -> 12
    row = pixels.preprocess(big, spec)
    assert row.shape == (1, 4, 4) and (row == 7).all()
    straight = msgspec.structs.replace(spec, resize=0)
    stretched = pixels.preprocess(ramp(8, 4), straight)  # to 4x4, aspect not kept
    assert stretched.shape == (1, 4, 4)
    assert stretched[0, 0, 0] < stretched[0, 0, 3] and stretched[0, 0, 0] < stretched[0, 3, 0]


def test_each_channel_is_scaled_then_has_its_own_mean_and_std() -> None:
    image = np.array([[[10, 20, 30]] * 2] * 2, np.uint8)  # 2x2 RGB
    row = pixels.preprocess(image, RGB)
    assert row.shape == (3, 2, 2)  # NCHW
    expected = [(0.1 - 0.1) / 0.5, (0.2 - 0.2) / 0.25, (0.3 - 0.3) / 2.0]
    np.testing.assert_allclose(row[:, 0, 0], expected, atol=1e-6)
    other = np.array([[[60, 70, 80]] * 2] * 2, np.uint8)
    np.testing.assert_allclose(pixels.preprocess(other, RGB)[:, 1, 1],
                               [(0.6 - 0.1) / 0.5, (0.7 - 0.2) / 0.25, (0.8 - 0.3) / 2.0],
                               rtol=1e-6)
    nhwc = msgspec.structs.replace(RGB, layout="NHWC")
    np.testing.assert_allclose(pixels.preprocess(other, nhwc)[1, 1],
                               [(0.6 - 0.1) / 0.5, (0.7 - 0.2) / 0.25, (0.8 - 0.3) / 2.0],
                               rtol=1e-6)
    plain = msgspec.structs.replace(RGB, mean=[], std=[])
    np.testing.assert_allclose(pixels.preprocess(other, plain)[:, 0, 0], [0.6, 0.7, 0.8],
                               rtol=1e-6)


def test_pixels_round_trip_through_png_grey_and_rgb() -> None:
    grey = ramp(5, 3)
    for given in (grey, grey[..., 0]):
        back = np.asarray(Image.open(io.BytesIO(pixels.encode_png(given))))
        np.testing.assert_array_equal(back, grey[..., 0])
    rgb = np.stack([ramp(5, 3)[..., 0], 255 - ramp(5, 3)[..., 0], np.full((3, 5), 9)],
                   axis=-1).astype(np.uint8)
    data = pixels.encode_png(rgb)
    assert Image.open(io.BytesIO(data)).mode == "RGB"
    np.testing.assert_array_equal(pixels.decode(data, RGB), rgb)


def test_uint8_pixels_grey_or_rgb_bounded_before_their_data_is_read() -> None:
    grey = codec()
    three = v2.binary("image", "UINT8", ramp(8, 8)[None, ..., 0])  # [rows, h, w]: grey
    four = v2.binary("image", "UINT8", ramp(8, 8)[None])
    np.testing.assert_array_equal(grey.decode([three], {}).rows[0],
                                  grey.decode([four], {}).rows[0])
    for shape in ([1, 0, 8, 1], [1, 8, 0, 1]):
        with pytest.raises(BadRequest, match="of at most 4096 pixels"):
            grey.decode([v2.Tensor("image", shape, "UINT8", raw=b"")], {})
    wide = msgspec.structs.replace(GREY, max_pixels=4096 * 4096)
    with pytest.raises(BadRequest, match=r"\[5, 4096, 4096, 1\] is more than 64 MiB"):
        codec(wide, max_rows=8).decode(
            [v2.Tensor("image", [5, 4096, 4096, 1], "UINT8", raw=b"")], {})
    with pytest.raises(BadRequest) as inside:  # exactly 64 MiB: on to its (missing) data
        codec(wide, max_rows=8).decode(
            [v2.Tensor("image", [4, 4096, 4096, 1], "UINT8", raw=b"")], {})
    assert "64 MiB" not in str(inside.value)
    rgb = codec(RGB)
    (row,) = rgb.decode([v2.binary("image", "UINT8", np.full((1, 2, 2, 3), 50, np.uint8))],
                        {}).rows
    np.testing.assert_allclose(row[:, 0, 0], [0.8, 1.2, 0.1], rtol=1e-6)
    with pytest.raises(BadRequest, match=r"takes \[rows, height, width, 3\] of at most"):
        rgb.decode([v2.binary("image", "UINT8", np.zeros((1, 2, 2, 1), np.uint8))], {})


def test_encoded_images_come_as_rows_or_a_column_of_rows() -> None:
    c = codec()
    data = pixels.encode_png(ramp(8, 8))
    column = v2.binary("image", "BYTES", [data, data], shape=[2, 1])
    assert len(c.decode([column], {}).rows) == 2
    with pytest.raises(BadRequest, match=r"input 'image': shape must be \[rows\] or "
                                         r"\[rows, 1\]"):
        c.decode([v2.binary("image", "BYTES", [data, data], shape=[1, 2])], {})


def test_a_model_or_declaration_that_does_not_fit_is_refused_when_the_codec_is_made() -> None:
    assert codec(shape=[-1, -1, -1, -1]).metadata() == \
        [{"name": "image", "datatype": "FP32", "shape": [-1, 1, 8, 8]}]
    with pytest.raises(ValueError, match=r"the model takes FP32 \[-1, 1, 8, 9\], the release "
                                         r"declares FP32 \[-1, 1, 8, 8\]"):
        codec(shape=[-1, 1, 8, 9])
    with pytest.raises(ValueError, match=r"the model takes FP16"):
        ImageCodec(GREY, [TensorSpec("image", "FP16", [-1, 1, 8, 8])], Bounds(), Path)
    nhwc = msgspec.structs.replace(GREY, layout="NHWC")
    assert codec(nhwc, shape=[-1, 8, 8, 1]).metadata()[0]["shape"] == [-1, 8, 8, 1]
    for bad in ({"mean": [0.5, 0.5]}, {"std": [0.25, 0.25]}, {"std": [0.0]},
                {"scale": 0.0}):
        with pytest.raises(ValueError, match="mean and std need 1 values each"):
            codec(msgspec.structs.replace(GREY, **bad))
    assert codec(msgspec.structs.replace(GREY, mean=[], std=[])).spec.mean == []


def test_collate_cost_sample_and_items_are_the_rows_serving_sees() -> None:
    c = codec()
    data = pixels.encode_png(ramp(8, 8))
    rows = c.decode([v2.binary("image", "BYTES", [data])], {}).rows
    assert [r.tolist() for r in c.items([data])] == [r.tolist() for r in rows]
    feeds = c.collate([rows[0], rows[0] * 2])
    assert list(feeds) == ["image"] and feeds["image"].dtype == np.float32
    np.testing.assert_array_equal(feeds["image"][1], rows[0] * 2)
    assert c.cost(rows[0]) == 64
    sample = c.sample(30, seed=5)
    assert len(sample) == 30 and all(r.shape == (1, 8, 8) for r in sample)
    values = np.stack(sample)
    low, high = (0 / 16 - 0.5) / 0.25, (255 / 16 - 0.5) / 0.25
    assert low <= values.min() < low + 0.1 and high - 0.1 < values.max() <= high
    np.testing.assert_array_equal(np.stack(c.sample(30, seed=5)), values)
    assert not np.array_equal(np.stack(c.sample(30, seed=6)), values)
    with pytest.raises(BadRequest, match="image row 1 is not a decodable JPEG or PNG"):
        c.items([data, b"junk"])


def test_rows_go_on_to_the_center_under_the_input_name_in_the_form_they_came_in() -> None:
    c = codec(msgspec.structs.replace(GREY, name="pixels"))
    first, second = ramp(8, 8), 255 - ramp(8, 8)
    uint8 = c.decode([v2.binary("pixels", "UINT8", np.stack([first, second]))], {})
    (sent,) = uint8.forward([1])
    assert (sent.name, sent.datatype, sent.shape) == ("pixels", "UINT8", [1, 8, 8, 1])
    np.testing.assert_array_equal(v2.array(sent)[0], second)
    floats = np.stack(uint8.rows)
    fp32 = c.decode([v2.binary("pixels", "FP32", floats)], {})
    (sent,) = fp32.forward([0, 1])
    assert (sent.name, sent.datatype, sent.shape) == ("pixels", "FP32", [2, 1, 8, 8])
    np.testing.assert_array_equal(v2.array(sent), floats)
    pngs = [pixels.encode_png(first), pixels.encode_png(second)]
    (sent,) = c.decode([v2.binary("pixels", "BYTES", pngs)], {}).forward([1])
    assert (sent.name, sent.datatype) == ("pixels", "BYTES")
    assert v2.blobs(sent) == [pngs[1]]


def test_uint8_pixels_are_bounded_at_64_mib_counting_every_channel() -> None:
    big = msgspec.structs.replace(RGB, max_pixels=8193 * 8192)
    rgb = codec(big, max_rows=8)
    with pytest.raises(BadRequest, match=r"\[2, 4096, 4096, 3\] is more than 64 MiB"):
        rgb.decode([v2.Tensor("image", [2, 4096, 4096, 3], "UINT8", raw=b"")], {})
    with pytest.raises(BadRequest) as inside:  # 48 MiB: on to its (missing) data
        rgb.decode([v2.Tensor("image", [1, 4096, 4096, 3], "UINT8", raw=b"")], {})
    assert "64 MiB" not in str(inside.value)
    grey = codec(msgspec.structs.replace(GREY, max_pixels=8193 * 8192), max_rows=8)
    with pytest.raises(BadRequest, match=r"\[1, 8193, 8192, 1\] is more than 64 MiB"):
        grey.decode([v2.Tensor("image", [1, 8193, 8192, 1], "UINT8", raw=b"")], {})


def test_a_stored_release_serves_one_request_input_under_the_nodes_row_bound(
        tmp_path: Path) -> None:
    from serving import inputs
    from serving.release.manifest import SCHEMA
    from tests.unit.serving.test_store import manifest

    model = [TensorSpec("image", "FP32", [-1, 1, 8, 8])]
    release = msgspec.structs.replace(manifest(2), schema=SCHEMA, inputs=model, request=[GREY])
    served = inputs.for_manifest(release, tmp_path, Bounds(max_rows=2))
    png = pixels.encode_png(ramp(8, 8))
    assert len(served.decode([v2.binary("image", "BYTES", [png] * 2)], {}).rows) == 2
    with pytest.raises(BadRequest, match=r"^input 'image' has 3 rows; the limit is 2$"):
        served.decode([v2.binary("image", "BYTES", [png] * 3)], {})
    made = inputs.codec([GREY], model, Bounds(max_rows=1), Path)
    with pytest.raises(BadRequest, match=r"has 2 rows; the limit is 1$"):
        made.decode([v2.binary("image", "BYTES", [png] * 2)], {})
    with pytest.raises(ValueError, match=r"^a release declares 2 request inputs; this version "
                                         r"serves exactly one \(its kind feeds every model "
                                         r"input\)$"):
        inputs.codec([GREY, GREY], model, Bounds(), Path)


def test_a_wrong_input_or_datatype_is_refused_naming_every_form_the_model_takes() -> None:
    c = codec()
    with pytest.raises(BadRequest) as none:
        c.decode([], {})
    assert str(none.value) == ("no inputs: this model takes 'image' (JPEG/PNG as BYTES, UINT8 "
                               "[rows, height, width, 1] or FP32 [-1, 1, 8, 8])")
    with pytest.raises(BadRequest) as two:
        c.decode([v2.binary("image", "BYTES", [b"x"])] * 2, {})
    assert str(two.value) == ("send one input: 'image' (JPEG/PNG as BYTES, UINT8 [rows, height, "
                              "width, 1] or FP32 [-1, 1, 8, 8])")
    with pytest.raises(BadRequest) as unknown:
        c.decode([v2.binary("photo", "BYTES", [b"x"])], {})
    assert str(unknown.value) == ("unknown input 'photo': this model takes 'image' (JPEG/PNG as "
                                  "BYTES, UINT8 [rows, height, width, 1] or FP32 "
                                  "[-1, 1, 8, 8])")
    with pytest.raises(BadRequest) as datatype:
        c.decode([v2.binary("image", "INT32", np.zeros((1, 8, 8, 1), np.int32))], {})
    assert str(datatype.value) == ("input 'image': datatype INT32 is not taken; send JPEG/PNG "
                                   "as BYTES, UINT8 pixels or FP32 [-1, 1, 8, 8]")
