"""Hostile images, crafted as the security review made them (docs/security.md, "Image
decoding"): a progressive JPEG's cheapest scan repeated, COM markers, EXIF segments, PNG
zTXt chunks that inflate; and honest ones to compare with."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
from PIL import Image

SOS = 0xDA


def jpeg(pixels: np.ndarray, **options: object) -> bytes:
    out = io.BytesIO()
    mode = "L" if pixels.ndim == 2 else "RGB"
    Image.fromarray(pixels, mode).save(out, format="JPEG", **options)
    return out.getvalue()


def progressive(size: int = 4096, channels: int = 1) -> bytes:
    """A flat progressive JPEG of ``size`` x ``size`` (small: its scans are mostly EOB runs)."""
    shape = (size, size) if channels == 1 else (size, size, channels)
    return jpeg(np.zeros(shape, np.uint8), progressive=True, quality=75)


def segments(data: bytes) -> list[tuple[int, int, int]]:
    """(marker, start, end) of each segment up to EOI, a scan's entropy-coded data included."""
    out, i = [], 2
    while True:
        marker = data[i + 1]
        if marker == 0xD9:
            out.append((marker, i, i + 2))
            return out
        end = i + 2 + int.from_bytes(data[i + 2:i + 4])
        if marker == SOS:
            while data[end] != 0xFF or data[end + 1] == 0 or 0xD0 <= data[end + 1] <= 0xD7:
                end += 1
        out.append((marker, i, end))
        i = end


def scans(data: bytes) -> int:
    return sum(1 for marker, _, _ in segments(data) if marker == SOS)


def scan_bomb(base: bytes, scans_added: int) -> bytes:
    """``base`` with its cheapest scan repeated ``scans_added`` more times before EOI."""
    found = segments(base)
    start, end = min(((s, e) for m, s, e in found if m == SOS), key=lambda se: se[1] - se[0])
    eoi = found[-1][1]
    return base[:eoi] + base[start:end] * scans_added + base[eoi:]


def scan_bomb_of(size_bytes: int, base: bytes | None = None) -> bytes:
    """A scan bomb of about ``size_bytes`` (the review's: 256 KB of a 4096x4096 grey one)."""
    base = base or progressive()
    found = segments(base)
    cheapest = min(e - s for m, s, e in found if m == SOS)
    return scan_bomb(base, (size_bytes - len(base)) // cheapest)


def with_segments(base: bytes, segment: bytes, count: int) -> bytes:
    """``base`` (a JPEG) with ``count`` copies of ``segment`` right after SOI."""
    return base[:2] + segment * count + base[2:]


def com(payload: bytes = b"") -> bytes:
    return b"\xff\xfe" + struct.pack(">H", len(payload) + 2) + payload


def exif(size: int = 65533) -> bytes:
    """An APP1 EXIF segment of ``size`` bytes after its marker (65533: the largest)."""
    tiff = b"MM\x00*\x00\x00\x00\x08"
    payload = b"Exif\x00\x00" + tiff + b"\x00" * (size - 2 - 6 - len(tiff))
    return b"\xff\xe1" + struct.pack(">H", size) + payload


def small_jpeg(size: int = 64) -> bytes:
    return jpeg(np.arange(size * size, dtype=np.uint8).reshape(size, size) % 200)


def chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png(size: int = 16, extra: bytes = b"") -> bytes:
    """A grey PNG with ``extra`` chunks right after IHDR."""
    out = io.BytesIO()
    Image.fromarray(np.arange(size * size, dtype=np.uint8).reshape(size, size), "L").save(
        out, format="PNG")
    data = out.getvalue()
    return data[:33] + extra + data[33:]  # signature (8) + IHDR (25)


def ztxt(key: int, inflated: int) -> bytes:
    return chunk(b"zTXt", b"k%d\x00\x00" % key + zlib.compress(b"\x00" * inflated, 9))


def ztxt_bomb(count: int = 60, inflated: int = 1 << 20) -> bytes:
    """The review's: ``count`` zTXt chunks inflating to 1 MB each."""
    return png(extra=b"".join(ztxt(i, inflated) for i in range(count)))
