"""The request input kinds (``serving/inputs``): what each takes, refuses and forwards, on both
sides of each bound."""

from __future__ import annotations

import io
import math
import zlib
from pathlib import Path

import msgspec
import numpy as np
import pytest
from PIL import Image

from serving import inputs
from serving.errors import BadRequest
from serving.inputs import pixels
from serving.inputs.base import Bounds
from serving.inputs.image import ImageCodec
from serving.inputs.tensor import TensorCodec
from serving.inputs.text import TextCodec
from serving.protocol import v2
from serving.release.manifest import (
    SCHEMA,
    ImageInput,
    Manifest,
    NewerSchema,
    TensorInput,
    TensorSpec,
    TextInput,
    decode,
    encode,
)
from tests.unit.serving.test_store import manifest

DIGIT = ImageInput(height=8, width=8, channels=1, scale=16.0, mean=[0.5], std=[0.25],
                   max_pixels=100)
IMAGE = [TensorSpec("image", "FP32", [-1, 1, 8, 8])]
FEATURES = [TensorSpec("features", "FP32", [-1, 3])]


def png(width: int, height: int, mode: str = "L", fmt: str = "PNG") -> bytes:
    out = io.BytesIO()
    values = np.arange(width * height * len(mode), dtype=np.uint8) % 17
    shape = (height, width, len(mode)) if len(mode) > 1 else (height, width)
    Image.fromarray(values.reshape(shape), mode).save(out, format=fmt)
    return out.getvalue()


def images(codec: ImageCodec, *data: bytes) -> v2.Decoded:
    return codec.decode([v2.binary("image", "BYTES", list(data))], {})


def image_codec(spec: ImageInput = DIGIT, max_rows: int = 4) -> ImageCodec:
    return ImageCodec(spec, IMAGE, Bounds(max_rows=max_rows), Path)


def test_an_encoded_image_is_decoded_scaled_normalised_and_laid_out_as_declared() -> None:
    codec = image_codec()
    (row,) = images(codec, png(8, 8)).rows
    grey = np.arange(64, dtype=np.uint8).reshape(8, 8) % 17
    assert row.shape == (1, 8, 8) and row.dtype == np.float32
    np.testing.assert_allclose(row[0], (grey / 16 - 0.5) / 0.25, rtol=1e-6)
    nhwc = ImageCodec(msgspec.structs.replace(DIGIT, layout="NHWC"),
                      [TensorSpec("image", "FP32", [-1, 8, 8, 1])], Bounds(), Path)
    assert images(nhwc, png(8, 8)).rows[0].shape == (8, 8, 1)


def test_png_uint8_and_fp32_requests_give_the_same_rows_and_forward_as_they_came() -> None:
    codec, data = image_codec(), png(8, 8)
    grey = np.asarray(Image.open(io.BytesIO(data)))
    encoded = images(codec, data, data)
    raw = codec.decode([v2.binary("image", "UINT8", np.stack([grey, grey])[..., None])], {})
    floats = codec.decode([v2.binary("image", "FP32", np.stack(encoded.rows))], {})
    for other in (raw, floats):
        np.testing.assert_array_equal(np.stack(other.rows), np.stack(encoded.rows))
    (sent,) = encoded.forward([1])  # the client's PNG, not its FP32 tensor
    assert sent.datatype == "BYTES" and v2.blobs(sent) == [data] and sent.shape == [1]
    (sent,) = raw.forward([0])
    assert sent.datatype == "UINT8" and sent.shape == [1, 8, 8, 1] and len(sent.raw or b"") == 64
    (sent,) = floats.forward([0, 1])
    assert sent.datatype == "FP32" and sent.shape == [2, 1, 8, 8]


def test_a_larger_image_is_resized_and_rgb_is_made_grey() -> None:
    codec = image_codec(msgspec.structs.replace(DIGIT, max_pixels=4096))
    (row,) = images(codec, png(20, 16, "RGB")).rows
    assert row.shape == (1, 8, 8)
    cropped = image_codec(msgspec.structs.replace(DIGIT, resize=10, max_pixels=4096))
    assert images(cropped, png(30, 12)).rows[0].shape == (1, 8, 8)


def test_pixels_are_bounded_from_the_header_just_inside_and_just_outside() -> None:
    codec = image_codec()  # max_pixels 100
    assert len(images(codec, png(10, 10)).rows) == 1
    with pytest.raises(BadRequest, match="10x11 pixels; the limit is 100"):
        images(codec, png(10, 11))
    with pytest.raises(BadRequest, match="of at most 100 pixels"):
        codec.decode([v2.binary("image", "UINT8", np.zeros((1, 10, 11, 1), np.uint8))], {})


@pytest.mark.parametrize(("data", "message"), [
    (b"not an image", "not a decodable JPEG or PNG"),
    (png(8, 8)[:40], "not a decodable JPEG or PNG"),  # truncated
    (png(8, 8, fmt="GIF"), "not a decodable JPEG or PNG"),  # a format not taken
    (b"", "not a decodable JPEG or PNG"),
])
def test_what_is_not_a_jpeg_or_png_is_refused(data: bytes, message: str) -> None:
    with pytest.raises(BadRequest, match=message):
        images(image_codec(), data)


def test_a_jpeg_decodes() -> None:
    assert images(image_codec(), png(8, 8, "RGB", "JPEG")).rows[0].shape == (1, 8, 8)


@pytest.mark.parametrize(("tensor", "message"), [
    (v2.binary("image", "FP32", np.full((1, 1, 8, 8), np.nan, np.float32)), "NaN or infinite"),
    (v2.binary("image", "FP32", np.full((1, 1, 8, 8), np.inf, np.float32)), "NaN or infinite"),
    (v2.binary("image", "FP32", np.zeros((1, 8, 8), np.float32)), "takes [-1, 1, 8, 8]"),
    (v2.binary("image", "FP32", np.zeros((1, 1, 8, 9), np.float32)), "takes [-1, 1, 8, 8]"),
    (v2.binary("image", "INT64", np.zeros((1, 64), np.int64)), "INT64 is not taken"),
    (v2.binary("image", "UINT8", np.zeros((1, 8, 8, 3), np.uint8)), "takes [rows, height"),
    (v2.binary("pixels", "UINT8", np.zeros((1, 8, 8, 1), np.uint8)), "unknown input 'pixels'"),
])
def test_image_tensors_that_do_not_fit_are_refused_naming_what_is_taken(
        tensor: v2.Tensor, message: str) -> None:
    with pytest.raises(BadRequest, match=message.replace("[", r"\[")):
        image_codec().decode([tensor], {})


def test_rows_are_bounded_per_request_just_inside_and_outside() -> None:
    codec = image_codec(max_rows=2)
    assert len(images(codec, png(8, 8), png(8, 8)).rows) == 2
    with pytest.raises(BadRequest, match="3 rows; the limit is 2"):
        images(codec, png(8, 8), png(8, 8), png(8, 8))


def tensor_codec(**spec: float) -> TensorCodec:
    return TensorCodec(TensorInput("features", **spec), FEATURES, Bounds(max_rows=4), Path)


def test_features_pass_through_checked_by_datatype_shape_and_range() -> None:
    codec = tensor_codec(minimum=0.0, maximum=1.0)
    rows = codec.decode([v2.binary("features", "FP32", [[0.0, 0.5, 1.0]])], {})
    assert np.stack(rows.rows).tolist() == [[0.0, 0.5, 1.0]]  # the bounds themselves pass
    (sent,) = rows.forward([0])
    assert (sent.datatype, sent.shape) == ("FP32", [1, 3])
    for values in ([[-0.01, 0.5, 1.0]], [[0.0, 0.5, 1.01]]):
        with pytest.raises(BadRequest, match=r"must lie in \[0.0, 1.0\]"):
            codec.decode([v2.binary("features", "FP32", values)], {})
    for tensor in (v2.binary("features", "FP64", [[0.0, 0.5, 1.0]]),
                   v2.binary("features", "FP32", [[0.0, 0.5]]),
                   v2.binary("features", "FP32", [0.0, 0.5, 1.0])):
        with pytest.raises(BadRequest, match=r"this model takes FP32 \[-1, 3\]"):
            codec.decode([tensor], {})
    with pytest.raises(BadRequest, match="NaN or infinite"):
        codec.decode([v2.binary("features", "FP32", [[0.0, math.nan, 1.0]])], {})
    json = v2.Tensor("features", [1, 3], "FP32", json=b"[[1, 0.5, 0]]")  # nested JSON, ints
    assert np.stack(codec.decode([json], {}).rows).tolist() == [[1.0, 0.5, 0.0]]


def test_a_text_model_with_token_type_ids_gets_them_and_one_without_does_not() -> None:
    from examples.sentiment.encoder import tokenizer_path

    three = [TensorSpec(n, "INT64", [-1, -1]) for n in ("input_ids", "attention_mask",
                                                         "token_type_ids")]
    codec = TextCodec(TextInput(max_length=16), three, Bounds(), lambda _: tokenizer_path())
    rows = codec.decode([v2.binary("text", "BYTES", ["a fine film", "dull"])], {}).rows
    feeds = codec.collate(rows)
    assert sorted(feeds) == sorted(n.name for n in three)
    assert feeds["token_type_ids"].shape == feeds["input_ids"].shape
    assert not feeds["token_type_ids"].any()
    two = TextCodec(TextInput(max_length=16), three[:2], Bounds(), lambda _: tokenizer_path())
    assert "token_type_ids" not in two.collate(rows)
    with pytest.raises(ValueError, match="a text model takes"):
        TextCodec(TextInput(), [TensorSpec("image", "FP32", [-1, 3])], Bounds(), Path)


def test_a_schema_1_manifest_encodes_as_old_nodes_read_it_and_serves_as_text(
        tmp_path: Path) -> None:
    from examples.sentiment.encoder import tokenizer_path

    old = manifest(1)
    assert b'"request"' not in encode(old) and old.schema == 1
    assert decode(encode(old)) == old
    (kind,) = old.request_inputs()
    assert isinstance(kind, TextInput) and kind.tokenizer == "tokenizer.json"
    assert kind.max_length == old.preprocessing.max_length
    (tmp_path / "tokenizer.json").write_bytes(tokenizer_path().read_bytes())
    codec = inputs.for_manifest(old, tmp_path, Bounds())
    assert isinstance(codec, TextCodec) and codec.metadata()[0]["name"] == "text"


def test_a_schema_2_manifest_round_trips_its_kind_and_a_newer_one_is_refused_by_name() -> None:
    image = msgspec.structs.replace(manifest(2), schema=SCHEMA, inputs=IMAGE, request=[DIGIT])
    data = encode(image)
    assert b'"kind": "image"' in data
    assert decode(data).request == [DIGIT]
    newer = msgspec.json.encode({**msgspec.to_builtins(image), "schema": SCHEMA + 1,
                                 "video": {"fps": 30}})
    with pytest.raises(NewerSchema, match=f"schema {SCHEMA + 1}: this node reads up to "
                                          f"schema {SCHEMA}; upgrade it"):
        decode(newer)
    assert isinstance(decode(data), Manifest)


def claiming(width: int, height: int) -> bytes:
    """A 1x1 PNG whose header (IHDR, CRC fixed) claims ``width`` x ``height`` pixels."""
    data = bytearray(png(1, 1))
    data[16:24] = width.to_bytes(4, "big") + height.to_bytes(4, "big")
    data[29:33] = zlib.crc32(bytes(data[12:29])).to_bytes(4, "big")
    return bytes(data)


def test_a_bomb_is_refused_from_its_header_before_decoding() -> None:
    with pytest.raises(BadRequest, match="5000x5000 pixels; the limit is 100"):
        pixels.decode(claiming(5000, 5000), DIGIT)  # ours: before a pixel is decoded
    unbounded = msgspec.structs.replace(DIGIT, max_pixels=1 << 40)
    with pytest.raises(BadRequest, match="claims more pixels than the limit"):
        pixels.decode(claiming(20000, 20000), unbounded)  # Pillow's own guard, as a 400


def test_a_requests_images_are_bounded_together_from_their_headers() -> None:
    """64 highly compressed 4096x4096 PNGs fit in a 1 MiB body; their pixels together are
    bounded before any is decoded."""
    spec = msgspec.structs.replace(DIGIT, max_pixels=4096 * 4096)
    full = [claiming(4096, 4096)] * 2  # exactly MAX_REQUEST_PIXELS
    assert pixels.sizes(full, spec) == [(4096, 4096)] * 2
    with pytest.raises(BadRequest, match="more than 33554432 pixels together"):
        pixels.sizes([*full, claiming(1, 1)], spec)
    codec = image_codec(spec, max_rows=8)
    with pytest.raises(BadRequest, match="pixels together"):
        images(codec, *full, claiming(1, 1))
    assert codec.inline_bytes == 0  # images are always decoded off the event loop


RGB = ImageInput(height=8, width=8, channels=3, resize=10, scale=255.0,
                 mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225], max_pixels=4096)


def rgb(width: int, height: int, seed: int) -> np.ndarray:
    """``uint8`` RGB pixels, each channel its own values."""
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def reference(image: np.ndarray, resized: tuple[int, int], spec: ImageInput) -> np.ndarray:
    """torchvision's ``Resize(spec.resize)``, ``CenterCrop``, ``ToTensor`` and ``Normalize`` on
    a PIL image, written out: Pillow's bilinear resize to ``resized`` (the shorter side to
    ``resize``), the crop at ``round(margin / 2)`` from the top left, each channel scaled,
    less its own mean, over its own std; ``[H, W, C]``."""
    width, height = resized
    scaled = np.asarray(Image.fromarray(image, "RGB").resize(resized, Image.Resampling.BILINEAR))
    top, left = round((height - spec.height) / 2), round((width - spec.width) / 2)
    crop = scaled[top:top + spec.height, left:left + spec.width].astype(np.float64)
    return (crop / spec.scale - np.array(spec.mean)) / np.array(spec.std)


@pytest.mark.parametrize(("size", "resized"), [
    ((26, 20), (13, 10)),  # landscape: margins of 5 (left 2) and 2 (top 1)
    ((20, 34), (10, 17)),  # portrait: margins of 2 (left 1) and 9 (top 4)
    ((22, 20), (11, 10)),  # a margin of 3: torchvision crops from column 2, a floor from 1
    ((27, 20), (13, 10)),  # 13.5 columns: torchvision truncates to 13, rounding makes 14
    ((20, 31), (10, 15)),  # 15.5 rows truncated to 15, a margin of 7: top 4 (a floor: 3)
    ((8, 8), (10, 10)),  # the model's size already, but resize 10: enlarged, then cropped
])
def test_an_rgb_image_is_resized_centre_cropped_and_normalised_per_channel(
        size: tuple[int, int], resized: tuple[int, int]) -> None:
    """Each channel's values exactly as torchvision computes them (its truncated longer side,
    its crop offset rounded half to even), from PNG and from UINT8 pixels, in both layouts."""
    image = rgb(*size, seed=sum(size))
    expected = reference(image, resized, RGB)
    nchw = ImageCodec(RGB, [TensorSpec("image", "FP32", [-1, 3, 8, 8])], Bounds(), Path)
    (row,) = images(nchw, pixels.encode_png(image)).rows
    assert row.shape == (3, 8, 8)
    for c in range(3):
        np.testing.assert_allclose(row[c], expected[:, :, c], rtol=1e-5, atol=1e-5)
    (raw,) = nchw.decode([v2.binary("image", "UINT8", image[None])], {}).rows
    np.testing.assert_array_equal(raw, row)
    nhwc = ImageCodec(msgspec.structs.replace(RGB, layout="NHWC"),
                      [TensorSpec("image", "FP32", [-1, 8, 8, 3])], Bounds(), Path)
    (row,) = images(nhwc, pixels.encode_png(image)).rows
    np.testing.assert_allclose(row, expected, rtol=1e-5, atol=1e-5)


def test_without_resize_an_rgb_image_goes_straight_to_the_models_size_per_channel() -> None:
    """Of the model's size: only scaled and normalised; of another: torchvision's
    ``Resize((8, 8))`` (Pillow's bilinear) first."""
    codec = ImageCodec(msgspec.structs.replace(RGB, resize=0), [TensorSpec(
        "image", "FP32", [-1, 3, 8, 8])], Bounds(), Path)
    image = rgb(8, 8, seed=3)
    other = rgb(13, 10, seed=4)
    resized = np.asarray(Image.fromarray(other, "RGB").resize((8, 8),
                                                              Image.Resampling.BILINEAR))
    for given, pixels_8x8 in ((image, image), (other, resized)):
        (row,) = images(codec, pixels.encode_png(given)).rows
        for c in range(3):
            np.testing.assert_allclose(row[c], (pixels_8x8[:, :, c] / 255 - RGB.mean[c])
                                       / RGB.std[c], rtol=1e-5, atol=1e-5)


def test_an_rgb_model_refuses_grey_pixels_and_encoded_images_two_to_a_row() -> None:
    codec = ImageCodec(RGB, [TensorSpec("image", "FP32", [-1, 3, 8, 8])], Bounds(), Path)
    assert len(codec.decode([v2.binary("image", "UINT8", rgb(8, 8, 1)[None])], {}).rows) == 1
    for grey in (np.zeros((1, 8, 8, 1), np.uint8), np.zeros((1, 8, 8), np.uint8)):
        with pytest.raises(BadRequest, match=r"takes \[rows, height, width, 3\]"):
            codec.decode([v2.binary("image", "UINT8", grey)], {})
    data = pixels.encode_png(rgb(8, 8, 1))
    rows = codec.decode([v2.binary("image", "BYTES", [data, data], shape=[2, 1])], {}).rows
    assert len(rows) == 2
    with pytest.raises(BadRequest, match=r"shape must be \[rows\] or \[rows, 1\]"):
        codec.decode([v2.binary("image", "BYTES", [data, data], shape=[1, 2])], {})


@pytest.mark.parametrize(("changes", "valid"), [
    ({"std": [0.2, 1e-6, 0.2]}, True), ({"std": [0.2, 0.0, 0.2]}, False),
    ({"scale": 1e-6}, True), ({"scale": 0.0}, False),
    ({"mean": [0.5, 0.5]}, False), ({"std": [0.2, 0.2, 0.2, 0.2]}, False),
])
def test_an_image_release_needs_a_mean_and_std_per_channel_and_no_zero_divisor(
        changes: dict[str, object], valid: bool) -> None:
    spec = msgspec.structs.replace(RGB, **changes)
    model = [TensorSpec("image", "FP32", [-1, 3, 8, 8])]
    if valid:
        assert ImageCodec(spec, model, Bounds(), Path).spec == spec
    else:
        with pytest.raises(ValueError, match="mean and std need 3 values each, std and scale "
                                             "non-zero"):
            ImageCodec(spec, model, Bounds(), Path)


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
@pytest.mark.parametrize("datatype", ["FP32", "FP64"])
def test_features_that_are_not_finite_are_refused_in_every_float_datatype(
        value: float, datatype: str) -> None:
    codec = TensorCodec(TensorInput("features"), [TensorSpec("features", datatype, [-1, 3])],
                        Bounds(max_rows=4), Path)
    finite = np.finfo(np.float32 if datatype == "FP32" else np.float64).max
    ok = codec.decode([v2.binary("features", datatype, [[finite, -finite, 0.0]])], {})
    assert np.stack(ok.rows).tolist() == [[float(finite), -float(finite), 0.0]]
    with pytest.raises(BadRequest, match="NaN or infinite"):
        codec.decode([v2.binary("features", datatype, [[0.0, value, 1.0]])], {})


def test_a_variable_row_is_bounded_at_max_row_elements_just_inside_and_just_outside() -> None:
    from serving.inputs.tensor import MAX_ROW_ELEMENTS

    codec = TensorCodec(TensorInput("features"), [TensorSpec("features", "FP32", [-1, -1])],
                        Bounds(max_rows=4), Path)
    (row,) = codec.decode([v2.Tensor("features", [1, MAX_ROW_ELEMENTS], "FP32",
                                     raw=bytes(4 * MAX_ROW_ELEMENTS))], {}).rows
    assert row.shape == (MAX_ROW_ELEMENTS,) and not row.any()
    with pytest.raises(BadRequest, match=r"shape \[1, 4194305\]; this model takes"):
        codec.decode([v2.Tensor("features", [1, MAX_ROW_ELEMENTS + 1], "FP32", raw=b"")], {})


def test_a_tensor_input_feeds_a_model_of_exactly_one_input() -> None:
    two = [*FEATURES, TensorSpec("other", "FP32", [-1, 3])]
    with pytest.raises(ValueError, match=r"a tensor input feeds a model with one input; this one "
                                         r"takes \['features', 'other'\]"):
        TensorCodec(TensorInput("features"), two, Bounds(), Path)
    assert TensorCodec(TensorInput("features"), FEATURES, Bounds(), Path).metadata() == [
        {"name": "features", "datatype": "FP32", "shape": [-1, 3]}]
