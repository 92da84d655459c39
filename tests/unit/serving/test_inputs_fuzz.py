"""The image and tensor codecs fuzzed in process (hypothesis): whatever tensors a client sends,
a codec answers rows or ``BadRequest``, never another exception, and never allocates for a
shape it has not bounded. Encoded images are fuzzed by mutating real PNG and JPEG bytes."""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from serving.errors import BadRequest
from serving.inputs.base import Bounds
from serving.inputs.image import ImageCodec
from serving.inputs.tensor import TensorCodec
from serving.model.datatypes import NUMERIC
from serving.protocol import v2
from serving.release.manifest import ImageInput, TensorInput, TensorSpec

IMAGE = ImageCodec(ImageInput(height=8, width=8, channels=1, max_pixels=4096),
                   [TensorSpec("image", "FP32", [-1, 1, 8, 8])], Bounds(max_rows=8), Path)
TABLE = TensorCodec(TensorInput("features", minimum=-10, maximum=10),
                    [TensorSpec("features", "FP32", [-1, 3])], Bounds(max_rows=8), Path)
DATATYPES = ["BYTES", *NUMERIC]
EXAMPLES = settings(max_examples=300, deadline=None, database=None,
                    suppress_health_check=list(HealthCheck))


def encoded(fmt: str, mode: str) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.arange(64 * len(mode), dtype=np.uint8).reshape(
        (8, 8, len(mode)) if len(mode) > 1 else (8, 8)), mode).save(out, format=fmt)
    return out.getvalue()


SEEDS = [encoded("PNG", "L"), encoded("PNG", "RGB"), encoded("JPEG", "RGB")]


@st.composite
def tensors(draw: st.DrawFn, name: str) -> v2.Tensor:
    """A tensor as any transport may deliver it: a fuzzed name, datatype and shape (huge,
    negative, empty), and data as JSON, raw bytes or typed values, of any length."""
    shape = draw(st.lists(st.integers(-2, 1 << 40) if draw(st.integers(0, 7)) == 0
                          else st.integers(0, 10), max_size=5))
    datatype = draw(st.sampled_from(DATATYPES))
    tensor_name = draw(st.sampled_from([name, name, "other"]))
    form = draw(st.sampled_from(["json", "raw", "values"]))
    if form == "raw":
        return v2.Tensor(tensor_name, shape, datatype,
                         raw=draw(st.binary(max_size=2048)))
    values: list[Any] = draw(st.lists(st.one_of(
        st.integers(-(1 << 70), 1 << 70), st.floats(allow_nan=True), st.booleans(),
        st.text(max_size=3)), max_size=300))
    if form == "values":
        return v2.Tensor(tensor_name, shape, datatype, values=values)
    return v2.Tensor(tensor_name, shape, datatype, json=repr(values).encode()
                     .replace(b"True", b"true").replace(b"False", b"false")
                     .replace(b"'", b'"').replace(b"nan", b"1").replace(b"inf", b"2"))


def answers_or_refuses(codec: Any, tensor: v2.Tensor) -> None:
    try:
        rows = codec.decode([tensor], {}).rows
    except BadRequest:
        return
    assert 0 < len(rows) <= 8
    assert all(np.isfinite(r).all() for r in rows)


@EXAMPLES
@given(tensor=tensors("image"))
def test_any_tensor_to_the_image_codec_is_rows_or_a_400(tensor: v2.Tensor) -> None:
    answers_or_refuses(IMAGE, tensor)


@EXAMPLES
@given(tensor=tensors("features"))
def test_any_tensor_to_the_tensor_codec_is_rows_or_a_400(tensor: v2.Tensor) -> None:
    answers_or_refuses(TABLE, tensor)


@EXAMPLES
@given(seed=st.sampled_from(SEEDS), flips=st.lists(st.tuples(st.integers(0, 4096),
                                                             st.integers(0, 255)),
                                                   max_size=8),
       cut=st.integers(0, 4096))
def test_mutated_png_and_jpeg_bytes_are_rows_or_a_400(seed: bytes, flips: list[tuple[int, int]],
                                                       cut: int) -> None:
    data = bytearray(seed)
    for at, value in flips:
        data[at % len(data)] = value
    answers_or_refuses(IMAGE, v2.binary("image", "BYTES", [bytes(data[:max(cut, 1)])]))


def test_the_fuzzing_reaches_the_models_rows() -> None:
    """A control: valid inputs of each form decode, so a fuzz run that only saw 400s would
    be noticed."""
    assert len(IMAGE.decode([v2.binary("image", "BYTES", SEEDS)], {}).rows) == 3
    assert len(TABLE.decode([v2.binary("features", "FP32", np.zeros((2, 3)))], {}).rows) == 2
    assert math.isclose(float(TABLE.decode([v2.Tensor("features", [1, 3], "FP32",
                                                      json=b"[1, 2, 3]")], {}).rows[0][2]), 3)
