"""Images to model rows (``serving.inputs.pixels``) as a client and an operator see them: the
row a refusal names in a request of several images and the bound it names, every image walked
once (the walk's cost is what bounds a request), calibration items walked like requests, and
normalisation in float32 bit for bit as torch computes it. The tests that kill `make mutate`'s
mutants the older tests let through."""

from __future__ import annotations

import io
from pathlib import Path

import msgspec
import numpy as np
import pytest
import torch
from PIL import Image

from serving.errors import BadRequest, InputRefused
from serving.inputs import pixels, structure
from serving.inputs.base import Bounds
from serving.inputs.image import ImageCodec
from serving.protocol import v2
from serving.release.manifest import ImageInput, TensorSpec
from tests import image_attacks as attack

GREY = ImageInput(height=8, width=8, channels=1, scale=1.0, max_pixels=256)


def codec(spec: ImageInput = GREY) -> ImageCodec:
    model = [TensorSpec(spec.name, "FP32", [-1, spec.channels, spec.height, spec.width])]
    return ImageCodec(spec, model, Bounds(max_rows=8), Path)


def grey_png(width: int, height: int) -> bytes:
    return pixels.encode_png(np.full((height, width, 1), 9, np.uint8))


def truncated_png() -> bytes:
    """A PNG whose header is whole (its size is read) but whose pixel data is cut short."""
    noise = np.random.default_rng(1).integers(0, 256, (16, 16, 1), dtype=np.uint8)
    data = pixels.encode_png(noise)
    return data[:len(data) // 2]


def refusal(images: list[bytes], spec: ImageInput = GREY) -> BadRequest:
    with pytest.raises(BadRequest) as caught:
        codec(spec).decode([v2.binary("image", "BYTES", images)], {})
    return caught.value


def test_a_refusal_names_the_row_of_the_image_it_refuses_and_its_bound() -> None:
    good = grey_png(8, 8)
    bomb = attack.scan_bomb(attack.progressive(64), 30)
    scans = refusal([good, bomb])
    assert isinstance(scans, InputRefused) and scans.reason == "scans"
    assert str(scans).startswith("image row 1: more than 32 JPEG scans")
    assert str(refusal([good, good, grey_png(17, 16)])) == \
        "image row 2: 17x16 pixels; the limit is 256 pixels"
    assert str(refusal([grey_png(16, 16), grey_png(16, 17)])) == \
        "image row 1: 16x17 pixels; the limit is 256 pixels"  # 16x16, the bound, is taken
    assert str(refusal([good, b"junk"])) == \
        "image row 1 is not a decodable JPEG or PNG image (UnidentifiedImageError)"
    assert str(refusal([good, good, truncated_png()])) == \
        "image row 2 is not a decodable JPEG or PNG image (OSError)"


def test_a_request_past_its_segments_is_refused_as_segments() -> None:
    full = attack.png()  # 3 chunks; 1024 of them are 3072, the bound
    spec = msgspec.structs.replace(GREY, max_pixels=4096)
    many = ImageCodec(spec, [TensorSpec("image", "FP32", [-1, 1, 8, 8])],
                      Bounds(max_rows=2048), Path)
    assert len(many.decode([v2.binary("image", "BYTES", [full] * 1024)], {}).rows) == 1024
    with pytest.raises(InputRefused) as caught:
        many.decode([v2.binary("image", "BYTES", [full] * 1025)], {})
    assert caught.value.reason == "segments"
    assert "(row 1024); the limit is 3072: send fewer rows per request" in str(caught.value)


def test_each_image_of_a_request_is_walked_once(monkeypatch: pytest.MonkeyPatch) -> None:
    walked: list[int] = []
    real = structure.check

    def check(data: bytes, row: int) -> structure.Structure:
        walked.append(row)
        return real(data, row)

    monkeypatch.setattr(structure, "check", check)
    images = [grey_png(8, 8), attack.png(), attack.small_jpeg(16)]
    assert len(codec().decode([v2.binary("image", "BYTES", images)], {}).rows) == 3
    assert walked == [0, 1, 2]
    walked.clear()
    assert len(codec().items(images)) == 3  # calibration items: each walked once as well
    assert walked == [0, 1, 2]


def test_calibration_items_are_walked_and_bounded_like_a_request() -> None:
    bomb = attack.scan_bomb(attack.progressive(64), 30)
    with pytest.raises(InputRefused) as caught:
        codec().items([grey_png(8, 8), bomb])
    assert caught.value.reason == "scans" and str(caught.value).startswith("image row 1:")
    with pytest.raises(BadRequest, match=r"^image row 1: 17x16 pixels; the limit is 256"):
        codec().items([grey_png(8, 8), grey_png(17, 16)])
    with pytest.raises(BadRequest, match=r"^image row 0 is not a decodable JPEG or PNG image "
                                         r"\(OSError\)"):
        pixels.decode(truncated_png(), GREY)
    with pytest.raises(InputRefused, match=r"^image row 0: more than 32 JPEG scans"):
        pixels.decode(bomb, GREY)


def test_normalisation_is_torchs_float32_arithmetic_bit_for_bit() -> None:
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    spec = ImageInput(height=16, width=16, channels=3, mean=mean, std=std)
    values = np.arange(256, dtype=np.uint8).reshape(16, 16)
    image = np.stack([values, values[::-1], values.T], axis=-1)  # every value, each channel
    row = pixels.preprocess(image, spec)
    tensor = torch.from_numpy(image).permute(2, 0, 1).float().div(255)
    expected = (tensor - torch.tensor(mean)[:, None, None]) / torch.tensor(std)[:, None, None]
    assert row.dtype == np.float32
    np.testing.assert_array_equal(row, expected.numpy())
    for channel in range(3):
        np.testing.assert_array_equal(row[channel], expected[channel].numpy())


def test_encode_png_writes_a_png_pillow_reads_back() -> None:
    grey = np.arange(15, dtype=np.uint8).reshape(3, 5, 1) * 17
    data = pixels.encode_png(grey)
    assert data.startswith(structure.PNG_SIGNATURE)
    with Image.open(io.BytesIO(data)) as image:
        assert image.format == "PNG" and image.mode == "L"
        np.testing.assert_array_equal(np.asarray(image), grey[..., 0])
