"""Probe rows stored compactly: never larger than the edge model they check, where rows allow.

A probe of 256 fp32 images (3x64x64) is ~3 MiB compressed, four times a small INT8 edge;
every node downloads it with the model. When the rows as they are would make the probe larger
than ``budget`` (the edge's size), each floating-point input is stored as ``uint8`` codes with a
per-channel affine (``{name}.scale`` and ``{name}.offset``, one value per index of axis 1:
channels of an NCHW image, features of a table): 8 bits keep an image what it was (its pixels
were 8-bit), and a node rebuilds exactly the same fp32 values, bit for bit
(:func:`unpack`). The references are computed on those rebuilt values, so the check stays
exact. When that is still too large, fewer rows are kept, but never fewer than ``min_rows``.
"""

from __future__ import annotations

import io

import numpy as np

Feeds = dict[str, np.ndarray]
SCALE, OFFSET = ".scale", ".offset"
LEVELS = 255
SLACK = 4096  # bytes: zip headers, the batch size, what compressing the references may add


def pack(feeds: Feeds) -> tuple[Feeds, Feeds]:
    """(the arrays to store, the model inputs they stand for): float inputs as codes."""
    stored: Feeds = {}
    used: Feeds = {}
    for name, values in feeds.items():
        if values.dtype.kind != "f":
            stored[name] = used[name] = values
            continue
        axes = tuple(i for i in range(values.ndim) if i != 1)
        lo = values.min(axis=axes).astype(np.float32).reshape(-1)
        hi = values.max(axis=axes).astype(np.float32).reshape(-1)
        scale = ((hi - lo) / np.float32(LEVELS)).astype(np.float32)
        scale[scale == 0] = 1  # a constant channel: every code 0, the offset is its value
        codes = np.rint((values - _along(lo, values.ndim)) / _along(scale, values.ndim))
        stored[name] = codes.clip(0, LEVELS).astype(np.uint8)
        stored[name + SCALE], stored[name + OFFSET] = scale, lo
        used[name] = unpack(stored[name], scale, lo, values.dtype)
    return stored, used


def unpack(codes: np.ndarray, scale: np.ndarray, offset: np.ndarray,
           dtype: np.dtype) -> np.ndarray:
    """The values the codes stand for: elementwise float32 arithmetic, the same on any CPU."""
    values = codes.astype(np.float32) * _along(scale, codes.ndim) + _along(offset, codes.ndim)
    return values.astype(dtype)


def _along(per_channel: np.ndarray, ndim: int) -> np.ndarray:
    """``[channels]`` shaped to broadcast along axis 1 of an ``ndim`` array."""
    return per_channel.reshape((1, -1) + (1,) * (ndim - 2)) if ndim >= 2 else per_channel


def fit(feeds: Feeds, budget: int, classes: int, min_rows: int) -> tuple[Feeds, Feeds]:
    """(the arrays to store, the model inputs they stand for) within ``budget`` bytes with the
    two reference logits of ``classes`` each: as they are, else packed, else fewer rows."""
    if size(feeds, classes) <= budget:
        return feeds, feeds
    rows = len(next(iter(feeds.values())))
    stored, used = pack(feeds)
    while rows > min_rows and (found := size(stored, classes)) > budget:
        rows = max(min_rows, min(rows - 1, int(rows * budget / found)))
        stored, used = pack({k: v[:rows] for k, v in feeds.items()})
    return stored, used


def size(stored: Feeds, classes: int) -> int:
    """Bytes of a probe holding ``stored`` (compressed as saved) and its references."""
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **stored)  # type: ignore[arg-type]
    rows = len(next(iter(stored.values())))
    return buffer.tell() + 2 * rows * classes * 4 + SLACK
