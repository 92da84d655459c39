"""The tensor kind (``serving.inputs.tensor``) on both sides of each bound, and what it gives
the batcher, warm-up and calibration: the tests that kill `make mutate`'s mutants the older
tests let through."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from serving.errors import BadRequest
from serving.inputs.base import Bounds
from serving.inputs.tensor import MAX_ROW_ELEMENTS, TensorCodec
from serving.protocol import v2
from serving.release.manifest import TensorInput, TensorSpec

FEATURES = [TensorSpec("features", "FP32", [-1, 3])]


def codec(inputs: list[TensorSpec] = FEATURES, **spec: float) -> TensorCodec:
    return TensorCodec(TensorInput("features", **spec), inputs, Bounds(max_rows=4), Path)


def decoded(c: TensorCodec, datatype: str, values: object) -> list[list[float]]:
    return np.stack(c.decode([v2.binary("features", datatype, values)], {}).rows).tolist()


def test_infinities_are_refused_like_nan_in_float_features() -> None:
    c = codec()
    for bad in (math.inf, -math.inf, math.nan):
        with pytest.raises(BadRequest, match="input 'features' holds NaN or infinite values"):
            decoded(c, "FP32", [[0.0, bad, 1.0]])
    assert decoded(c, "FP32", [[-1e9, 0.0, 1e9]]) == [[-1e9, 0.0, 1e9]]


def test_integer_features_are_taken_as_they_are() -> None:
    c = codec([TensorSpec("features", "INT64", [-1, 2])])
    assert decoded(c, "INT64", [[-5, 7]]) == [[-5, 7]]
    with pytest.raises(BadRequest, match=r"datatype FP32; this model takes INT64 \[-1, 2\]"):
        decoded(c, "FP32", [[1.0, 2.0]])


def test_one_side_of_the_range_bounds_alone() -> None:
    low = codec(minimum=0.0)
    assert decoded(low, "FP32", [[0.0, 5.0, 1e9]]) == [[0.0, 5.0, 1e9]]
    with pytest.raises(BadRequest, match=r"must lie in \[0.0, None\]"):
        decoded(low, "FP32", [[-0.5, 0.0, 0.0]])
    high = codec(maximum=1.0)
    assert decoded(high, "FP32", [[-1e9, 0.0, 1.0]]) == [[-1e9, 0.0, 1.0]]
    with pytest.raises(BadRequest, match=r"must lie in \[None, 1.0\]"):
        decoded(high, "FP32", [[0.0, 0.0, 1.5]])


def test_a_variable_dimension_is_bounded_per_row_just_inside_and_outside() -> None:
    c = codec([TensorSpec("features", "UINT8", [-1, -1])])
    assert len(c.decode([v2.binary("features", "UINT8", np.zeros((1, MAX_ROW_ELEMENTS),
                                                                 np.uint8))], {}).rows) == 1
    over = v2.Tensor("features", [1, MAX_ROW_ELEMENTS + 1], "UINT8", raw=b"")
    with pytest.raises(BadRequest, match=r"shape \[1, 4194305\]; this model takes UINT8 "
                                         r"\[-1, -1\]"):
        c.decode([over], {})
    assert decoded(c, "UINT8", [[1, 2, 3, 4, 5]]) == [[1, 2, 3, 4, 5]]  # any length


def test_rows_are_bounded_per_request_and_the_batch_is_not_empty() -> None:
    c = codec()
    assert len(decoded(c, "FP32", np.zeros((4, 3)))) == 4
    with pytest.raises(BadRequest, match="has 5 rows; the limit is 4"):
        decoded(c, "FP32", np.zeros((5, 3)))
    with pytest.raises(BadRequest, match="is an empty batch"):
        decoded(c, "FP32", np.zeros((0, 3)))


def test_a_model_of_other_inputs_or_datatypes_is_refused_when_the_codec_is_made() -> None:
    with pytest.raises(ValueError, match="the model has no input 'features'"):
        codec([TensorSpec("other", "FP32", [-1, 3])])
    with pytest.raises(ValueError, match=r"a tensor input feeds a model with one input; this "
                                         r"one takes \['features', 'mask'\]"):
        codec([*FEATURES, TensorSpec("mask", "FP32", [-1, 3])])
    with pytest.raises(ValueError, match="tensor input 'features': BYTES is not a numeric V2 "
                                         "datatype"):
        codec([TensorSpec("features", "BYTES", [-1])])


def test_metadata_collate_and_cost_are_the_models_shape_and_the_rows_size() -> None:
    c = codec()
    assert c.metadata() == [{"name": "features", "datatype": "FP32", "shape": [-1, 3]}]
    rows = c.decode([v2.binary("features", "FP32", [[1, 2, 3], [4, 5, 6]])], {}).rows
    feeds = c.collate(rows)
    assert list(feeds) == ["features"]
    assert feeds["features"].tolist() == [[1, 2, 3], [4, 5, 6]]
    assert c.cost(rows[0]) == 3
    assert codec([TensorSpec("features", "FP32", [-1, 2, 5])]).cost(np.zeros((2, 5))) == 10


def test_generated_rows_are_seeded_shaped_and_within_the_declared_range() -> None:
    c = codec([TensorSpec("features", "FP32", [-1, 3, -1])], minimum=0.5, maximum=2.0)
    sample = c.sample(40, seed=1)
    assert len(sample) == 40
    assert all(r.shape == (3, 4) and r.dtype == np.float32 for r in sample)
    values = np.stack(sample)
    assert values.min() >= 0.5 and values.max() <= 2.0
    assert values.min() < 0.6 and values.max() > 1.9
    np.testing.assert_array_equal(np.stack(c.sample(40, seed=1)), values)
    assert not np.array_equal(np.stack(c.sample(40, seed=2)), values)
    free = np.stack(codec().sample(400))
    assert -3.0 <= free.min() < -2.9 and 2.9 < free.max() <= 3.0


def test_items_are_the_rows_a_request_of_the_same_features_gets() -> None:
    c = codec(minimum=0.0, maximum=1.0)
    assert [r.tolist() for r in c.items([[0.0, 0.5, 1.0], [1, 1, 0]])] == \
        [[0.0, 0.5, 1.0], [1.0, 1.0, 0.0]]
    assert c.items([]) == []
    with pytest.raises(BadRequest, match=r"must lie in \[0.0, 1.0\]"):
        c.items([[0.0, 2.0, 0.0]])


def test_a_models_dimension_of_one_is_kept_in_generated_rows() -> None:
    c = codec([TensorSpec("features", "FP32", [-1, 1, 3])])
    assert all(r.shape == (1, 3) for r in c.sample(5))


def test_features_go_on_to_the_center_under_the_input_name_as_the_models_datatype() -> None:
    c = TensorCodec(TensorInput("vitals"), [TensorSpec("vitals", "FP64", [-1, 2])],
                    Bounds(), Path)
    sent_rows = [[36.6, 72.0], [39.1, 110.0]]
    decoded = c.decode([v2.binary("vitals", "FP64", sent_rows)], {})
    (sent,) = decoded.forward([1])
    assert (sent.name, sent.datatype, sent.shape) == ("vitals", "FP64", [1, 2])
    assert v2.array(sent).tolist() == [[39.1, 110.0]]
