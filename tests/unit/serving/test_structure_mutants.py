"""An encoded image's structure walked before Pillow decodes it (``serving.inputs.structure``),
as a client and an operator see it: each refusal's message naming the row and the bound, what
counts as a compressed iTXt chunk (and what is taken as plain metadata), iTXt chunks with empty
language tags, a compressed chunk inflated only as far as the bound, and the header segments
counted against the request's bound. The tests that kill `make mutate`'s mutants the older
tests let through."""

from __future__ import annotations

import functools
import zlib

import numpy as np
import pytest

from serving.errors import BadRequest, InputRefused
from serving.inputs import pixels, structure
from serving.release.manifest import ImageInput
from tests import image_attacks as attack

GREY = ImageInput(height=8, width=8, channels=1)


def decoded(data: bytes) -> np.ndarray:
    pixels.sizes([data], GREY)
    return pixels.decode(data, GREY, walked=True)[..., 0]


def honest() -> np.ndarray:
    return decoded(attack.png())


def refused(data: bytes, row: int = 0) -> InputRefused:
    with pytest.raises(InputRefused) as caught:
        structure.check(data, row)
    return caught.value


def itxt(keyword: bytes, flag: int, rest: bytes) -> bytes:
    return attack.chunk(b"iTXt", keyword + b"\x00" + bytes([flag]) + rest)


def test_too_many_compressed_chunks_are_refused_naming_the_row_and_the_bound() -> None:
    five = attack.png(extra=b"".join(attack.ztxt(i, 10) for i in range(5)))
    caught = refused(five, row=2)
    assert caught.reason == "compressed"
    assert str(caught) == ("image row 2: more than 4 compressed PNG chunks (zTXt, iTXt, iCCP); "
                           "the limit is 4")


def test_uncompressed_itxt_chunks_are_plain_metadata_not_compressed_chunks() -> None:
    plain = b"".join(itxt(b"k%d" % i, 0, b"\x00en\x00Key\x00text") for i in range(8))
    data = attack.png(extra=plain)
    found = structure.check(data, 0)
    assert (found.metadata, found.compressed) == (8, 0)
    np.testing.assert_array_equal(decoded(data), honest())


def test_a_compressed_itxt_with_an_empty_keyword_is_still_inflated_and_bounded() -> None:
    inside = attack.png(extra=itxt(b"", 1, b"\x00en\x00K\x00" + zlib.compress(b"x" * 65536)))
    assert structure.check(inside, 0).compressed == 1
    outside = attack.png(extra=itxt(b"", 1, b"\x00en\x00K\x00" + zlib.compress(b"x" * 65537)))
    caught = refused(outside)
    assert caught.reason == "compressed" and "inflates to more than 65536 bytes" in str(caught)


@pytest.mark.parametrize("size", [65536, 65537])
def test_an_itxt_with_empty_language_and_translated_keyword_is_inflated_from_its_text(
        size: int) -> None:
    data = attack.png(extra=itxt(b"key", 1, b"\x00\x00\x00" + zlib.compress(b"x" * size)))
    if size == structure.MAX_INFLATED:
        np.testing.assert_array_equal(decoded(data), honest())
    else:
        caught = refused(data)
        assert caught.reason == "compressed"
        assert "iTXt chunk inflates to more than 65536 bytes" in str(caught)


def test_an_itxt_cut_short_after_its_keyword_or_its_flag_is_walked_without_a_fault() -> None:
    for cut in (b"key\x00", b"key\x00\x00"):  # no flag, or not compressed: plain metadata
        data = attack.png(extra=attack.chunk(b"iTXt", cut))
        assert structure.check(data, 0).compressed == 0
        np.testing.assert_array_equal(decoded(data), honest())
    flagged = attack.chunk(b"iTXt", b"key\x00\x01")  # flagged compressed, nothing after: counted
    assert structure.check(attack.png(extra=flagged * 4), 0).compressed == 4
    assert refused(attack.png(extra=flagged * 5)).reason == "compressed"


@functools.cache
def deflated_zeros(megabytes: int) -> bytes:
    deflate = zlib.compressobj(9)
    block = bytes(1 << 20)
    return b"".join(deflate.compress(block) for _ in range(megabytes)) + deflate.flush()


def test_a_ztxt_bomb_is_refused_having_inflated_only_up_to_the_bound(
        monkeypatch: pytest.MonkeyPatch) -> None:
    body = deflated_zeros(192)  # 192 MiB of zeros, ~190 KB deflated: within the metadata bytes
    assert len(body) < structure.MAX_METADATA_BYTES - 1000
    inflated: list[int] = []  # the bytes each inflate call produced: the CPU the bomb costs
    real = zlib.decompressobj

    class Counting:
        def __init__(self) -> None:
            self.inner = real()

        def decompress(self, data: bytes, max_length: int = 0) -> bytes:
            out = self.inner.decompress(data, max_length)
            inflated.append(len(out))
            return out

    monkeypatch.setattr(zlib, "decompressobj", Counting)
    caught = refused(attack.png(extra=attack.chunk(b"zTXt", b"bomb\x00\x00" + body)))
    assert caught.reason == "compressed" and "a zTXt chunk inflates to more than 65536" in \
        str(caught)
    assert inflated and sum(inflated) == structure.MAX_INFLATED + 1  # 64 KiB + 1, not 192 MiB


@pytest.mark.parametrize("make, reason, message", [
    (lambda: attack.scan_bomb(attack.progressive(64), 30), "scans",
     "image row 5: more than 32 JPEG scans; the limit is 32"),
    (lambda: attack.with_segments(attack.small_jpeg(), attack.com(), 40), "metadata",
     "image row 5: more than 32 metadata segments (APPn, COM, ancillary chunks); the limit "
     "is 32"),
    (lambda: attack.with_segments(attack.small_jpeg(), attack.exif(), 5), "metadata",
     "image row 5: more than 262144 bytes of metadata (APPn, COM, ancillary chunks); the "
     "limit is 262144"),
    (lambda: attack.with_segments(attack.small_jpeg(), b"\xff\xdb\x00\x02", 130), "segments",
     "image row 5: more than 128 JPEG marker segments; the limit is 128"),
    (lambda: attack.png(extra=attack.chunk(b"IDAT", b"") * 520), "chunks",
     "image row 5: more than 512 PNG chunks; the limit is 512"),
    (lambda: attack.png(extra=attack.ztxt(0, 70_000)), "compressed",
     "image row 5: a zTXt chunk inflates to more than 65536 bytes; the limit is 65536"),
], ids=["scans", "metadata count", "metadata bytes", "segments", "chunks", "inflated"])
def test_each_refusal_names_the_row_and_its_bound(make: object, reason: str,
                                                   message: str) -> None:
    assert callable(make)
    caught = refused(make(), row=5)
    assert caught.status == 400 and caught.reason == reason
    assert str(caught) == message


def test_only_a_jpegs_header_segments_count_as_read_in_python() -> None:
    data = attack.progressive(64)  # 6 scans, each a segment; libjpeg reads them in C
    found = structure.check(data, 0)
    before = [m for m, _, _ in attack.segments(data)]
    header = before[:before.index(0xDA) + 1]  # up to the first scan, which Pillow reads
    assert found.scans == 6 and found.segments == len(before) - 1  # EOI is no segment
    assert found.in_python == len(header)
    png = attack.png(extra=attack.ztxt(0, 10))
    assert structure.check(png, 0).in_python == structure.check(png, 0).segments == 4


def test_what_is_neither_jpeg_nor_png_is_left_to_pillow_to_refuse() -> None:
    assert structure.check(b"GIF89a" + b"\x00" * 100, 0) == structure.Structure()
    with pytest.raises(BadRequest, match="not a decodable JPEG or PNG"):
        decoded(b"GIF89a" + b"\x00" * 100)


def tem_between_scans(data: bytes) -> bytes:
    """``data`` (a progressive JPEG) with a TEM marker (standalone, no length) before each scan
    after the first, where libjpeg reads and skips it."""
    out, scans = data[:2], 0
    for marker, start, end in attack.segments(data):
        scans += marker == 0xDA
        out += (b"\xff\x01" if marker == 0xDA and scans > 1 else b"") + data[start:end]
    return out


def test_standalone_markers_between_scans_are_stepped_over_and_every_scan_counted() -> None:
    base = attack.progressive(64)
    marked = tem_between_scans(base)
    assert structure.check(marked, 0) == structure.check(base, 0)
    np.testing.assert_array_equal(decoded(marked), decoded(base))
    inside = tem_between_scans(attack.scan_bomb(base, structure.MAX_SCANS - 6))
    np.testing.assert_array_equal(decoded(inside), decoded(base))
    bomb = tem_between_scans(attack.scan_bomb(base, structure.MAX_SCANS - 5))
    caught = refused(bomb)
    assert caught.reason == "scans" and "more than 32 JPEG scans" in str(caught)


def test_a_jpeg_cut_right_after_a_marker_counts_only_its_whole_segments() -> None:
    head = attack.small_jpeg()[:2] + attack.com() * 3
    for cut in (b"\xff\xdb", b"\xff\xdb\x00"):  # a marker with no (whole) length after it
        found = structure.check(head + cut, 0)
        assert (found.segments, found.metadata) == (3, 3)
        with pytest.raises(BadRequest, match="not a decodable JPEG or PNG"):
            decoded(head + cut)
    found = structure.check(head + attack.com(), 0)  # a whole (empty) segment ends the data
    assert (found.segments, found.metadata) == (4, 4)


def test_app15_is_metadata_and_the_jpg_extension_markers_past_it_are_not() -> None:
    base = attack.small_jpeg()
    app15 = b"\xff\xef\x00\x04ab"
    np.testing.assert_array_equal(decoded(attack.with_segments(base, app15, 31)),
                                  decoded(base))  # with its JFIF APP0: 32, the bound
    assert refused(attack.with_segments(base, app15, 32)).reason == "metadata"
    jpg0 = b"\xff\xf0\x00\x04ab"  # JPG0: a segment, not metadata (Pillow refuses it)
    found = structure.check(attack.with_segments(base, jpg0, 33), 0)
    assert (found.segments, found.metadata) == (39, 1)


def test_what_follows_a_pngs_iend_is_not_walked_as_pillow_never_reads_it() -> None:
    trailer = b"".join(attack.ztxt(i, 70_000) for i in range(8)) + attack.chunk(b"IDAT", b"") * 600
    data = attack.png() + trailer
    assert structure.check(data, 0) == structure.check(attack.png(), 0)
    np.testing.assert_array_equal(decoded(data), honest())


def test_too_much_png_metadata_is_refused_naming_the_row() -> None:
    many = attack.png(extra=b"".join(attack.chunk(b"tEXt", b"k%d\x00t" % i) for i in range(33)))
    caught = refused(many, row=7)
    assert caught.reason == "metadata"
    assert str(caught) == ("image row 7: more than 32 metadata segments (APPn, COM, ancillary "
                           "chunks); the limit is 32")


def test_a_chunks_body_ends_at_its_length_its_crc_is_not_read_as_a_compression_flag() -> None:
    # iTXt chunks whose body ends at the keyword's NUL and whose CRC's first byte is 1: were
    # the CRC read as the body's next byte, each would count as a compressed chunk
    keywords = [k for k in (b"k%d" % i for i in range(5000))
                if zlib.crc32(b"iTXt" + k + b"\x00") >> 24 == 1][:5]
    chunks = [attack.chunk(b"iTXt", k + b"\x00") for k in keywords]
    assert len(chunks) == 5 and all(c[-4] == 1 for c in chunks)
    data = attack.png(extra=b"".join(chunks))
    assert structure.check(data, 0).compressed == 0
    np.testing.assert_array_equal(decoded(data), honest())
