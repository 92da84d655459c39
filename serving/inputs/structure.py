"""An encoded image's structure, walked before Pillow sees a byte of it: what decoding it
would cost is bounded first, the pixels (``max_pixels``) being only one of the costs.

Measured (docs/security.md, "Image decoding"): a 4096x4096 grey progressive JPEG whose
cheapest scan (33 bytes) is repeated to fill 256 KB costs libjpeg-turbo 9 CPU-seconds, each
scan being a pass over every block; 200,000 empty COM markers cost Pillow's marker loop 0.3 s
per open; a PNG's zTXt chunks are inflated at open. Here a JPEG's marker segments are walked
(their lengths; a scan's entropy-coded data searched for the next marker in C, by ``re``) and
a PNG's chunks, each count and size checked as it is met, so walking costs at most the bound
plus one linear search: a request past one is refused with :class:`InputRefused`, naming it.
"""

from __future__ import annotations

import re
import struct
import zlib
from dataclasses import dataclass

from serving.errors import InputRefused

MAX_SCANS = 32  # SOS markers: libjpeg's progressive scripts write 6 (grey) or 10 (colour)
MAX_SEGMENTS = 128  # JPEG marker segments (a baseline JPEG has ~10, a progressive one ~30)
MAX_METADATA_SEGMENTS = 32  # JPEG APPn and COM segments, PNG ancillary chunks
MAX_METADATA_BYTES = 256 * 1024  # their bytes together (EXIF, XMP, ICC, text)
MAX_CHUNKS = 512  # PNG chunks (Pillow's encoder writes 64 KB IDATs, libpng's 8 KB)
MAX_COMPRESSED = 4  # PNG zTXt, compressed iTXt and iCCP chunks
MAX_INFLATED = 64 * 1024  # what one of them may inflate to (PngImagePlugin.MAX_TEXT_CHUNK)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PNG_COMPRESSED = (b"zTXt", b"iCCP")
# a marker: 0xFF then neither 0x00 (a stuffed 0xFF in entropy-coded data), a restart marker
# (inside a scan) nor 0xFF (a fill byte: the marker is at the last 0xFF of a run)
MARKER = re.compile(rb"\xff[^\x00\xd0-\xd7\xff]")
STANDALONE = frozenset({0x01, *range(0xD0, 0xD9)})  # TEM, RSTn, SOI: no length field
SOS, EOI, COM = 0xDA, 0xD9, 0xFE


@dataclass
class Structure:
    """What the walk counted in one image (``segments``: JPEG segments or PNG chunks;
    ``in_python``: those of them Pillow reads in Python, a few microseconds each: a JPEG's
    before its first scan, libjpeg reading the rest, and every PNG chunk)."""

    segments: int = 0
    in_python: int = 0
    scans: int = 0
    metadata: int = 0
    metadata_bytes: int = 0
    compressed: int = 0


def check(data: bytes, row: int) -> Structure:
    """The structure of a JPEG or PNG, :class:`InputRefused` past a bound; anything else is left
    to Pillow (which refuses what is neither)."""
    if data.startswith(b"\xff\xd8"):
        return _jpeg(data, row)
    if data.startswith(PNG_SIGNATURE):
        return _png(data, row)
    return Structure()


def _refuse(row: int, what: str, limit: int, reason: str) -> InputRefused:
    return InputRefused(f"image row {row}: more than {limit} {what}; the limit is {limit}", reason)


def _metadata(found: Structure, row: int, length: int) -> None:
    found.metadata += 1
    found.metadata_bytes += length
    if found.metadata > MAX_METADATA_SEGMENTS:
        raise _refuse(row, "metadata segments (APPn, COM, ancillary chunks)",
                      MAX_METADATA_SEGMENTS, "metadata")
    if found.metadata_bytes > MAX_METADATA_BYTES:
        raise _refuse(row, "bytes of metadata (APPn, COM, ancillary chunks)",
                      MAX_METADATA_BYTES, "metadata")


def _jpeg(data: bytes, row: int) -> Structure:
    found, i, end = Structure(), 2, len(data)
    while (match := MARKER.search(data, i)) is not None:  # junk and fill bytes skipped, as
        i, marker = match.start(), data[match.start() + 1]  # libjpeg skips them
        if marker == EOI:
            break  # what follows (an MPO's second image, a phone's trailer) is not decoded
        if marker in STANDALONE:
            i += 2
            continue
        if i + 4 > end:
            break  # truncated: Pillow refuses it (LOAD_TRUNCATED_IMAGES is off)
        found.segments += 1
        found.in_python += found.scans == 0
        if found.segments > MAX_SEGMENTS:
            raise _refuse(row, "JPEG marker segments", MAX_SEGMENTS, "segments")
        length = int.from_bytes(data[i + 2:i + 4])
        if 0xE0 <= marker <= 0xEF or marker == COM:
            _metadata(found, row, length)
        elif marker == SOS:  # its entropy-coded data follows, up to the next marker
            found.scans += 1
            if found.scans > MAX_SCANS:
                raise _refuse(row, "JPEG scans", MAX_SCANS, "scans")
        i += 2 + length
    return found


def _png(data: bytes, row: int) -> Structure:
    found, i, end = Structure(), len(PNG_SIGNATURE), len(data)
    while i + 12 <= end:
        length, kind = struct.unpack_from(">I4s", data, i)
        found.segments += 1
        found.in_python += 1
        if found.segments > MAX_CHUNKS:
            raise _refuse(row, "PNG chunks", MAX_CHUNKS, "chunks")
        if kind == b"IEND":
            break
        if kind[0] & 0x20:  # lower-case first letter: an ancillary chunk
            _metadata(found, row, length)
            body = data[i + 8:i + 8 + length]
            if kind in PNG_COMPRESSED or (kind == b"iTXt" and _itxt_compressed(body)):
                _inflated(found, row, kind, body)
        i += 12 + length
    return found


def _itxt_compressed(body: bytes) -> bool:
    keyword = body.find(b"\x00")
    return 0 <= keyword < len(body) - 1 and body[keyword + 1] == 1


def _inflated(found: Structure, row: int, kind: bytes, body: bytes) -> None:
    """A compressed chunk: counted, and inflated here only as far as the bound."""
    found.compressed += 1
    if found.compressed > MAX_COMPRESSED:
        raise _refuse(row, "compressed PNG chunks (zTXt, iTXt, iCCP)", MAX_COMPRESSED,
                      "compressed")
    start = body.find(b"\x00") + 2  # past the keyword, its NUL and the method
    if kind == b"iTXt":  # and the flag, the language tag and the translated keyword
        start = body.find(b"\x00", body.find(b"\x00", start + 1) + 1) + 1
    try:
        inflated = zlib.decompressobj().decompress(body[start:], MAX_INFLATED + 1)
    except zlib.error:
        return  # Pillow refuses it
    if len(inflated) > MAX_INFLATED:
        raise InputRefused(f"image row {row}: a {kind.decode()} chunk inflates to more than "
                      f"{MAX_INFLATED} bytes; the limit is {MAX_INFLATED}", "compressed")
