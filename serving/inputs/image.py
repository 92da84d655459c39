"""The ``image`` kind: one image per row, feeding the model input of the same name.

Clients send encoded JPEG/PNG (``BYTES``, shape ``[rows]`` or ``[rows, 1]``), ``UINT8`` pixels
(``[rows, height, width, channels]``, or ``[rows, height, width]`` for grey; any size, resized
as the release declares) or ``FP32`` already in the model's shape and layout (passed through,
finite). Every row's cost is the same, so the batcher never pads. Rows are forwarded to the
center in the form they came in: a PNG or JPEG is 10-30x smaller than its ``FP32`` tensor.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from serving.errors import BadRequest
from serving.inputs import pixels, work
from serving.inputs.base import Bounds, Feeds, encoded, model_input, one_input, stacked
from serving.inputs.pixel_stats import PixelStats
from serving.protocol import v2
from serving.release.manifest import ImageInput, TensorSpec


class ImageCodec:
    kind = "image"
    inline_bytes = 0  # decoding is work: every request is parsed off the event loop

    def __init__(self, spec: ImageInput, inputs: list[TensorSpec], bounds: Bounds,
                 files: Callable[[str], Path]) -> None:
        self.spec, self.bounds = spec, bounds
        self.model = model_input(inputs, spec.name)
        c, h, w = spec.channels, spec.height, spec.width
        self.row_shape = [c, h, w] if spec.layout == "NCHW" else [h, w, c]
        if self.model.datatype != "FP32" or \
                [d for d in self.model.shape[1:]] not in (self.row_shape, [-1] * 3):
            raise ValueError(f"image input {spec.name!r}: the model takes "
                             f"{self.model.datatype} {self.model.shape}, the release declares "
                             f"FP32 [-1, {', '.join(map(str, self.row_shape))}]")
        if (spec.mean and len(spec.mean) != c) or (spec.std and len(spec.std) != c) or \
                any(s == 0 for s in spec.std) or spec.scale == 0:
            raise ValueError(f"image input {spec.name!r}: mean and std need {c} values each, "
                             f"std and scale non-zero")
        self._stats = PixelStats(spec)
        self.statistics = self._stats.names

    def metadata(self) -> list[dict[str, Any]]:
        """The model's input; JPEG/PNG ``BYTES`` and ``UINT8`` pixels are taken under the same
        name (V2 metadata has one entry per name)."""
        return [{"name": self.spec.name, "datatype": "FP32", "shape": [-1, *self.row_shape]}]

    def decode(self, tensors: list[v2.Tensor], parameters: dict[str, Any]) -> v2.Decoded:
        tensor = one_input(tensors, {self.spec.name: f"JPEG/PNG as BYTES, UINT8 [rows, "
                                                     f"height, width, {self.spec.channels}] "
                                                     f"or FP32 {[-1, *self.row_shape]}"})
        if tensor.datatype == "BYTES":
            return self._encoded(tensor)
        if tensor.datatype == "UINT8":
            return self._pixels(tensor)
        if tensor.datatype == "FP32":
            return self._floats(tensor)
        raise BadRequest(f"input {tensor.name!r}: datatype {tensor.datatype} is not taken; "
                         f"send JPEG/PNG as BYTES, UINT8 pixels or FP32 "
                         f"{[-1, *self.row_shape]}")

    def _encoded(self, tensor: v2.Tensor) -> v2.Decoded:
        v2.check_rows(tensor, (1, 2), self.bounds.max_rows)
        if len(tensor.shape) == 2 and tensor.shape[1] != 1:
            raise BadRequest(f"input {tensor.name!r}: shape must be [rows] or [rows, 1]")
        images = v2.blobs(tensor)
        pixels.sizes(images, self.spec)  # every image walked first: the request bounded
        rows = []
        for i, data in enumerate(images):
            work.check(i)  # past the deadline, or the client gone: no further image decoded
            rows.append(pixels.preprocess(pixels.decode(data, self.spec, i, walked=True),
                                          self.spec))
        return v2.Decoded(rows, encoded(self.spec.name, images))

    def _pixels(self, tensor: v2.Tensor) -> v2.Decoded:
        v2.check_rows(tensor, (3, 4), self.bounds.max_rows)
        h, w = tensor.shape[1], tensor.shape[2]
        channels = tensor.shape[3] if len(tensor.shape) == 4 else 1
        if channels != self.spec.channels or h * w > self.spec.max_pixels or not h or not w:
            raise BadRequest(f"input {tensor.name!r}: UINT8 shape {tensor.shape}; this model "
                             f"takes [rows, height, width, {self.spec.channels}] of at most "
                             f"{self.spec.max_pixels} pixels")
        if tensor.shape[0] * h * w * channels > 64 << 20:
            raise BadRequest(f"input {tensor.name!r}: {tensor.shape} is more than 64 MiB")
        data = v2.array(tensor).reshape(tensor.shape[0], h, w, channels)
        rows = [pixels.preprocess(image, self.spec) for image in data]
        return v2.Decoded(rows, stacked(self.spec.name, "UINT8", list(data)))

    def _floats(self, tensor: v2.Tensor) -> v2.Decoded:
        if len(tensor.shape) != 4 or tensor.shape[1:] != self.row_shape:
            raise BadRequest(f"input {tensor.name!r}: FP32 shape {tensor.shape}; this model "
                             f"takes {[-1, *self.row_shape]} (or JPEG/PNG as BYTES, or UINT8 "
                             f"pixels)")
        v2.check_rows(tensor, (4,), self.bounds.max_rows)
        data = v2.array(tensor)
        if not np.isfinite(data).all():
            raise BadRequest(f"input {tensor.name!r} holds NaN or infinite values")
        rows = list(data)
        return v2.Decoded(rows, stacked(self.spec.name, "FP32", rows))

    def collate(self, rows: list[np.ndarray]) -> Feeds:
        return {self.spec.name: np.stack(rows).astype(np.float32, copy=False)}

    def cost(self, row: np.ndarray) -> int:
        return int(row.size)

    def stats(self, rows: list[np.ndarray]) -> np.ndarray:
        """Pixel and orientation statistics (``serving.inputs.pixel_stats``)."""
        return self._stats(rows)

    def sample(self, rows: int, seed: int = 0) -> list[np.ndarray]:  # pragma: no mutate
        rng = np.random.default_rng(seed)
        shape = (self.spec.height, self.spec.width, self.spec.channels)
        return [pixels.preprocess(rng.integers(0, 256, size=shape, dtype=np.uint8), self.spec)
                for _ in range(rows)]

    def items(self, values: list[Any]) -> list[np.ndarray]:
        return [pixels.preprocess(pixels.decode(bytes(v), self.spec, i), self.spec)
                for i, v in enumerate(values)]
