"""Images bounded before they are decoded (``serving.inputs.structure``): the security review's
attacks refused with 400 naming the bound at a small share of what decoding them costs, each
bound just inside (decoded, the same pixels) and just outside (refused), honest JPEG and PNG
decoded as before."""

from __future__ import annotations

import io
import itertools
import struct
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, PngImagePlugin

from serving.errors import InputRefused
from serving.inputs import pixels, structure
from serving.inputs.base import Bounds
from serving.inputs.image import ImageCodec
from serving.protocol import v2
from serving.release.manifest import ImageInput, TensorSpec
from tests import image_attacks as attack

GREY = ImageInput(height=8, width=8, channels=1)
RGB = ImageInput(height=8, width=8, channels=3, resize=8)


def cpu(call: Callable[[], object]) -> tuple[float, object]:
    """CPU seconds ``call`` took, and what it returned or raised."""
    started = time.process_time()
    try:
        outcome: object = call()
    except Exception as exc:
        outcome = exc
    return time.process_time() - started, outcome


def decoded(data: bytes, spec: ImageInput = GREY) -> np.ndarray:
    pixels.sizes([data], spec)
    return pixels.decode(data, spec, walked=True)


def refused(data: bytes, reason: str, spec: ImageInput = GREY) -> InputRefused:
    with pytest.raises(InputRefused) as caught:
        decoded(data, spec)
    assert caught.value.status == 400 and caught.value.reason == reason
    return caught.value


def pillow(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(image.convert("L"))


def test_the_reviews_scan_bomb_is_refused_for_a_fraction_of_its_decoding_cost() -> None:
    base = attack.progressive(4096)
    bomb = attack.scan_bomb_of(256 * 1024, base)  # the review's: 9 CPU-s to decode
    assert len(bomb) > 250_000 and attack.scans(bomb) > 5000
    seconds, outcome = cpu(lambda: decoded(bomb))
    assert isinstance(outcome, InputRefused) and "more than 32 JPEG scans" in str(outcome)
    assert seconds < 0.25, seconds  # generous: the walk stops at scan 33 (~0.2 ms here)
    # a smaller bomb, that Pillow decodes in a test's time, costs it 10x more than the refusal
    small = attack.scan_bomb(attack.progressive(1024), 400)
    decoding, _ = cpu(lambda: pillow(small))
    refusing, outcome = cpu(lambda: decoded(small))
    assert isinstance(outcome, InputRefused) and refusing * 10 < decoding, (refusing, decoding)


@pytest.mark.parametrize("make, reason, words", [
    (lambda: attack.with_segments(attack.small_jpeg(), attack.com(), 200_000), "metadata",
     "more than 32 metadata segments"),
    (lambda: attack.with_segments(attack.small_jpeg(), attack.exif(), 15), "metadata",
     "more than 262144 bytes of metadata"),
    (attack.ztxt_bomb, "compressed", "a zTXt chunk inflates to more than 65536 bytes"),
], ids=["200k COM markers", "15 x 64 KB EXIF", "60 zTXt x 1 MB"])
def test_the_reviews_metadata_attacks_are_refused_cheaply(
        make: Callable[[], bytes], reason: str, words: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    data = make()
    seconds, _ = cpu(lambda: refused(data, reason))
    assert words in str(refused(data, reason))
    assert seconds < 0.05, seconds  # the walk stops at the bound; Pillow never sees them
    assert PngImagePlugin.MAX_TEXT_CHUNK == structure.MAX_INFLATED  # its own guard, behind
    if b"\xff\xe1" not in data[:8]:  # what Pillow with its defaults spends on COM and zTXt
        monkeypatch.setattr(PngImagePlugin, "MAX_TEXT_CHUNK", 1 << 20)
        monkeypatch.setattr(PngImagePlugin, "MAX_TEXT_MEMORY", 64 << 20)
        pillow_s, _ = cpu(lambda: pillow(data))
        assert seconds * 10 < pillow_s, (seconds, pillow_s)


def test_scans_just_inside_decode_to_the_same_pixels_and_one_more_is_refused() -> None:
    base = attack.progressive(64)
    inside = attack.scan_bomb(base, structure.MAX_SCANS - attack.scans(base))
    assert attack.scans(inside) == structure.MAX_SCANS == 32
    np.testing.assert_array_equal(decoded(inside)[..., 0], pillow(base))
    assert "more than 32 JPEG scans" in str(refused(attack.scan_bomb(base, 27), "scans"))


def test_jpeg_segments_just_inside_and_just_outside() -> None:
    base = attack.small_jpeg()
    (dqt,) = [base[s:e] for m, s, e in attack.segments(base) if m == 0xDB]
    have = structure.check(base, 0).segments
    inside = attack.with_segments(base, dqt, structure.MAX_SEGMENTS - have)
    np.testing.assert_array_equal(decoded(inside)[..., 0], pillow(base))
    refused(attack.with_segments(base, dqt, structure.MAX_SEGMENTS - have + 1), "segments")


def test_jpeg_metadata_count_and_bytes_just_inside_and_just_outside() -> None:
    base = attack.small_jpeg()
    found = structure.check(base, 0)
    assert found.metadata == 1  # its JFIF APP0
    count = structure.MAX_METADATA_SEGMENTS - found.metadata
    np.testing.assert_array_equal(decoded(attack.with_segments(base, attack.com(), count))[..., 0],
                                  pillow(base))
    refused(attack.with_segments(base, attack.com(), count + 1), "metadata")
    three = attack.exif() * 3  # and one COM filling the bytes up to the bound exactly
    rest = structure.MAX_METADATA_BYTES - found.metadata_bytes - 3 * 65533
    inside = attack.with_segments(base, three + attack.com(b"c" * (rest - 2)), 1)
    assert structure.check(inside, 0).metadata_bytes == structure.MAX_METADATA_BYTES
    np.testing.assert_array_equal(decoded(inside)[..., 0], pillow(base))
    refused(attack.with_segments(base, three + attack.com(b"c" * (rest - 1)), 1), "metadata")


def idat_split(size: int, pieces: int) -> bytes:
    """A ``size`` x ``size`` PNG of noise with its image data in ``pieces`` IDAT chunks."""
    grey = np.random.default_rng(0).integers(0, 256, (size, size), dtype=np.uint8)
    stream = zlib.compress(b"".join(b"\x00" + row.tobytes() for row in grey))
    cut = np.linspace(0, len(stream), pieces + 1).astype(int)
    ihdr = attack.chunk(b"IHDR", struct.pack(">IIBBBBB", size, size, 8, 0, 0, 0, 0))
    return (structure.PNG_SIGNATURE + ihdr + b"".join(
        attack.chunk(b"IDAT", stream[a:b]) for a, b in itertools.pairwise(cut))
        + attack.chunk(b"IEND", b""))


def test_png_chunks_just_inside_and_just_outside() -> None:
    inside = idat_split(32, structure.MAX_CHUNKS - 2)  # with IHDR and IEND: 512
    assert structure.check(inside, 0).segments == structure.MAX_CHUNKS
    np.testing.assert_array_equal(decoded(inside)[..., 0], pillow(idat_split(32, 1)))
    refused(idat_split(32, structure.MAX_CHUNKS - 1), "chunks")


def text(key: int, size: int) -> bytes:
    return attack.chunk(b"tEXt", b"k%d\x00" % key + b"t" * (size - len(b"k%d\x00" % key)))


def test_png_ancillary_count_and_bytes_just_inside_and_just_outside() -> None:
    honest = attack.png()
    assert structure.check(honest, 0).metadata == 0
    many = structure.MAX_METADATA_SEGMENTS
    inside = attack.png(extra=b"".join(text(i, 8) for i in range(many)))
    np.testing.assert_array_equal(decoded(inside)[..., 0], pillow(honest))
    refused(attack.png(extra=b"".join(text(i, 8) for i in range(many + 1))), "metadata")
    big = structure.MAX_METADATA_BYTES // 4
    inside = attack.png(extra=b"".join(text(i, big) for i in range(4)))
    np.testing.assert_array_equal(decoded(inside)[..., 0], pillow(honest))
    refused(attack.png(extra=b"".join(text(i, big + (i == 3)) for i in range(4))), "metadata")


def itxt(inflated: int) -> bytes:
    return attack.chunk(b"iTXt", b"key\x00\x01\x00en\x00Key\x00"
                        + zlib.compress(b"x" * inflated))


def iccp(inflated: int) -> bytes:
    return attack.chunk(b"iCCP", b"icc\x00\x00" + zlib.compress(b"\x00" * inflated))


@pytest.mark.parametrize("make", [lambda n: attack.ztxt(0, n), itxt, iccp],
                         ids=["zTXt", "iTXt", "iCCP"])
def test_a_compressed_chunk_inflating_just_to_the_bound_is_taken_one_byte_more_refused(
        make: Callable[[int], bytes]) -> None:
    honest = attack.png()
    inside = attack.png(extra=make(structure.MAX_INFLATED))
    if make is not iccp:  # Pillow takes no made-up ICC profile; the walk's bound still holds
        np.testing.assert_array_equal(decoded(inside)[..., 0], pillow(honest))
    else:
        assert structure.check(inside, 0).compressed == 1
    message = str(refused(attack.png(extra=make(structure.MAX_INFLATED + 1)), "compressed"))
    assert f"inflates to more than {structure.MAX_INFLATED} bytes" in message


def test_compressed_chunks_are_counted_just_inside_and_just_outside() -> None:
    count = structure.MAX_COMPRESSED
    inside = attack.png(extra=b"".join(attack.ztxt(i, 10) for i in range(count)))
    np.testing.assert_array_equal(decoded(inside)[..., 0], pillow(attack.png()))
    refused(attack.png(extra=b"".join(attack.ztxt(i, 10) for i in range(count + 1))),
            "compressed")


def test_a_requests_segments_are_bounded_together_just_inside_and_outside() -> None:
    codec = ImageCodec(GREY, [TensorSpec("image", "FP32", [-1, 1, 8, 8])],
                       Bounds(max_rows=8), Path)
    full = idat_split(32, structure.MAX_CHUNKS - 2)  # 512 chunks, read by Pillow in Python
    small = attack.png()  # IHDR, IDAT, IEND
    assert structure.check(small, 0).segments == 3 and pixels.MAX_REQUEST_SEGMENTS == 3072

    def request(last: int) -> list[bytes]:  # 5 x 512 + (last + 2) + 3 chunks
        return [full] * 5 + [idat_split(32, last), small]

    taken = codec.decode([v2.binary("image", "BYTES", request(507))], {})  # 3072
    assert len(taken.rows) == 7
    with pytest.raises(InputRefused, match="more than 3072 JPEG header segments and PNG chunks"):
        codec.decode([v2.binary("image", "BYTES", request(508))], {})  # 3073


def test_an_honest_progressive_rgb_jpeg_with_metadata_decodes_to_pillows_pixels() -> None:
    rng = np.random.default_rng(3)
    photo = rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)
    exif = Image.Exif()
    exif[0x010F] = "camera"
    data = attack.jpeg(photo, progressive=True, quality=90, exif=exif.tobytes(),
                       comment=b"honest")
    found = structure.check(data, 0)
    assert found.scans == 10 and found.metadata == 3  # colour progression; JFIF, EXIF, COM
    with Image.open(io.BytesIO(data)) as image:
        expected = np.asarray(image.convert("RGB"))
    got = decoded(data, RGB)
    assert got.shape == (48, 64, 3)
    np.testing.assert_array_equal(got, expected)
    png = io.BytesIO()
    Image.fromarray(photo, "RGB").save(png, format="PNG")
    np.testing.assert_array_equal(decoded(png.getvalue(), RGB), photo)


def test_fill_bytes_and_trailing_data_are_walked_as_libjpeg_reads_them() -> None:
    base = attack.small_jpeg()
    sos = next(s for m, s, _ in attack.segments(base) if m == 0xDA)
    filled = base[:sos] + b"\xff" * 100_000 + base[sos:] + b"trailer" * 1000
    seconds, found = cpu(lambda: structure.check(filled, 0))
    assert isinstance(found, structure.Structure) and found.scans == 1
    assert seconds < 0.05, seconds  # a run of fill bytes is searched past in C
    np.testing.assert_array_equal(decoded(filled)[..., 0], pillow(base))
