"""Images to model inputs: decoding (JPEG/PNG, bounded before decoding), resizing, centre
cropping, scaling and normalising as the release declares (``ImageInput``), the same way in
publish, edge and center.

An encoded image is untrusted: its structure is walked first (``serving.inputs.structure``:
scans, marker segments, chunks, metadata, each bounded), then its header is read
(``Image.open`` reads only that), and an image claiming more than ``max_pixels`` pixels (a
decompression bomb: a few KB of PNG that inflate to gigabytes) is refused before a pixel is
decoded. Pillow's own guards are set as well, for what the walk leaves to it.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from collections.abc import Iterator

import numpy as np
from PIL import Image, ImageFile, PngImagePlugin, UnidentifiedImageError

from serving.errors import BadRequest, InputRefused
from serving.inputs import structure
from serving.release.manifest import ImageInput

FORMATS = ("JPEG", "PNG")
MODES = {1: "L", 3: "RGB"}
MAX_REQUEST_PIXELS = 32 << 20
"""Pixels one request's encoded images may decode to, all rows together (the body's size
does not bound them: 64 highly compressed 4096x4096 PNGs fit in 1 MiB)."""
MAX_REQUEST_SEGMENTS = 3072
"""JPEG header segments and PNG chunks of one request's images together (``in_python`` of
``structure.Structure``): Pillow reads each in Python (~10 microseconds, twice), and 256
rows each under ``structure.MAX_SEGMENTS`` would be 32,768. Honest images have 3-10."""

ImageFile.LOAD_TRUNCATED_IMAGES = False  # a truncated image is refused, never half-decoded
PngImagePlugin.MAX_TEXT_CHUNK = structure.MAX_INFLATED  # Pillow's defaults: 1 MB and 64 MB
PngImagePlugin.MAX_TEXT_MEMORY = structure.MAX_COMPRESSED * structure.MAX_INFLATED


def sizes(images: list[bytes], spec: ImageInput) -> list[tuple[int, int]]:
    """Each encoded image's (width, height) from its structure and header alone; refused past
    a bound of ``structure``, ``max_pixels`` for one image, ``MAX_REQUEST_PIXELS`` or
    ``MAX_REQUEST_SEGMENTS`` for all of them, before any pixel is decoded."""
    out, total, segments = [], 0, 0
    for row, data in enumerate(images):
        segments += structure.check(data, row).in_python
        if segments > MAX_REQUEST_SEGMENTS:
            raise InputRefused(f"the request's images hold more than {MAX_REQUEST_SEGMENTS} JPEG "
                          f"header segments and PNG chunks together (row {row}); the limit "
                          f"is {MAX_REQUEST_SEGMENTS}: send fewer rows per request",
                          "segments")
        with _opened(data, row, walked=True) as image:
            width, height = _bounded(image.size, spec, row)
        total += width * height
        if total > MAX_REQUEST_PIXELS:
            raise BadRequest(f"the request's images hold more than {MAX_REQUEST_PIXELS} "
                             f"pixels together (row {row}); send fewer rows per request")
        out.append((width, height))
    return out


def _bounded(size: tuple[int, int], spec: ImageInput, row: int) -> tuple[int, int]:
    width, height = size
    if width * height > spec.max_pixels:
        raise BadRequest(f"image row {row}: {width}x{height} pixels; the limit is "
                         f"{spec.max_pixels} pixels")
    return width, height


@contextlib.contextmanager
def _opened(data: bytes, row: int, walked: bool = False) -> Iterator[Image.Image]:
    """The image's structure walked (unless ``walked`` already) and header read (``Image.open``
    decodes nothing yet); undecodable data, other formats and Pillow's own bomb guard become a
    ``BadRequest``."""
    if not walked:
        structure.check(data, row)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data), formats=FORMATS) as image:
                yield image
    except BadRequest:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise BadRequest(f"image row {row}: its header claims more pixels than the limit") \
            from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, Warning) as exc:
        raise BadRequest(f"image row {row} is not a decodable JPEG or PNG image "
                         f"({type(exc).__name__})") from None


def decode(data: bytes, spec: ImageInput, row: int = 0, walked: bool = False) -> np.ndarray:
    """An encoded JPEG or PNG as ``uint8`` pixels ``[height, width, channels]`` in the
    release's channels (grey or RGB); its structure (unless ``walked`` by :func:`sizes`
    already) and size checked first."""
    with _opened(data, row, walked) as image:
        _bounded(image.size, spec, row)  # from the header, before a pixel is decoded
        try:
            image.load()
            pixels = np.asarray(image.convert(MODES[spec.channels]), dtype=np.uint8)
        except (OSError, ValueError, SyntaxError) as exc:
            raise BadRequest(f"image row {row} is not a decodable JPEG or PNG image "
                             f"({type(exc).__name__})") from None
    return pixels.reshape(pixels.shape[0], pixels.shape[1], spec.channels)


def preprocess(pixels: np.ndarray, spec: ImageInput) -> np.ndarray:
    """``uint8`` pixels ``[height, width, channels]`` as one model row: resized (the shorter
    side to ``resize`` then centre-cropped, or straight to the model's size), scaled, minus
    the mean over the std, in the model's layout (``[C, H, W]`` for NCHW). An image of the
    model's size is left as it is only where torchvision's transforms would leave it: with
    ``resize`` larger than the model's size it is enlarged and cropped like any other."""
    if pixels.shape[:2] != (spec.height, spec.width) or \
            (spec.resize and spec.resize != min(spec.height, spec.width)):
        pixels = _resize(pixels, spec)
    values = pixels.astype(np.float32) / np.float32(spec.scale)
    if spec.mean:
        values -= np.asarray(spec.mean, dtype=np.float32)
    if spec.std:
        values /= np.asarray(spec.std, dtype=np.float32)
    return np.ascontiguousarray(values.transpose(2, 0, 1) if spec.layout == "NCHW" else values)


def _resize(pixels: np.ndarray, spec: ImageInput) -> np.ndarray:
    image = Image.fromarray(pixels[:, :, 0] if spec.channels == 1 else pixels,
                            MODES[spec.channels])
    if spec.resize:  # torchvision's Resize(resize) then CenterCrop, on a PIL image:
        width, height = image.size  # the longer side truncated, the crop's offset rounded
        short = min(width, height)  # half to even (its _compute_resized_output_size and
        size = (max(spec.width, int(width * spec.resize / short)),  # center_crop)
                max(spec.height, int(height * spec.resize / short)))
        image = image.resize(size, Image.Resampling.BILINEAR)
        left = round((size[0] - spec.width) / 2)
        top = round((size[1] - spec.height) / 2)
        image = image.crop((left, top, left + spec.width, top + spec.height))
    else:
        image = image.resize((spec.width, spec.height), Image.Resampling.BILINEAR)
    out = np.asarray(image, dtype=np.uint8)
    return out.reshape(spec.height, spec.width, spec.channels)


def encode_png(pixels: np.ndarray) -> bytes:
    """``uint8`` pixels ``[height, width, channels]`` as PNG (calibration and test data)."""
    channels = pixels.shape[2] if pixels.ndim == 3 else 1
    image = Image.fromarray(pixels.reshape(pixels.shape[0], pixels.shape[1]) if channels == 1
                            else pixels, MODES[channels])
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()
