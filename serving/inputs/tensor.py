"""The ``tensor`` kind: a tensor passed through to the model input of the same name (tabular
features, any other classifier). Its datatype must be the model's, its shape the model's with
any batch size, its values finite (floats) and within the declared range. Rows are forwarded
to the center as the same binary tensor.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from serving.errors import BadRequest
from serving.inputs.base import Bounds, Feeds, model_input, one_input, stacked
from serving.model.datatypes import native
from serving.protocol import v2
from serving.release.manifest import TensorInput, TensorSpec

MAX_ROW_ELEMENTS = 1 << 22  # a variable dimension is bounded by this per row
MAX_FEATURES = 64  # input drift follows a fixed-size row's first this many values


class TensorCodec:
    kind = "tensor"
    inline_bytes = 64 * 1024  # checking a small tensor is cheaper than the hop to a thread

    def __init__(self, spec: TensorInput, inputs: list[TensorSpec], bounds: Bounds,
                 files: Callable[[str], Path]) -> None:
        self.spec, self.bounds = spec, bounds
        self.model = model_input(inputs, spec.name)
        if len(inputs) != 1:
            raise ValueError(f"a tensor input feeds a model with one input; this one takes "
                             f"{[i.name for i in inputs]}")
        if self.model.datatype not in v2.NUMERIC:
            raise ValueError(f"tensor input {spec.name!r}: {self.model.datatype} is not a "
                             f"numeric V2 datatype")
        self.float = self.model.datatype.startswith("FP")
        fixed = self.model.shape[1:]
        # a fixed-size row: its first values, one statistic each; a variable one: its size and
        # the mean and std of its values
        self.features = min(math.prod(fixed), MAX_FEATURES) if all(d > 0 for d in fixed) \
            else None
        self.statistics = ([f"feature_{i}" for i in range(self.features)]
                           if self.features is not None else ["elements", "mean", "std"])

    def metadata(self) -> list[dict[str, Any]]:
        return [{"name": self.spec.name, "datatype": self.model.datatype,
                 "shape": list(self.model.shape)}]

    def decode(self, tensors: list[v2.Tensor], parameters: dict[str, Any]) -> v2.Decoded:
        want = f"{self.model.datatype} {self.model.shape}"
        tensor = one_input(tensors, {self.spec.name: want})
        if tensor.datatype != self.model.datatype:
            raise BadRequest(f"input {tensor.name!r}: datatype {tensor.datatype}; this model "
                             f"takes {want}")
        fixed = self.model.shape[1:]
        if len(tensor.shape) != len(self.model.shape) or any(
                d not in (-1, got) for d, got in zip(fixed, tensor.shape[1:], strict=True)) \
                or math.prod(tensor.shape[1:]) > MAX_ROW_ELEMENTS:
            raise BadRequest(f"input {tensor.name!r}: shape {tensor.shape}; this model takes "
                             f"{want}")
        v2.check_rows(tensor, (len(self.model.shape),), self.bounds.max_rows)
        data = v2.array(tensor)
        if self.float and not np.isfinite(data).all():
            raise BadRequest(f"input {tensor.name!r} holds NaN or infinite values")
        low, high = self.spec.minimum, self.spec.maximum
        if (low is not None and (data < low).any()) or (high is not None and
                                                        (data > high).any()):
            raise BadRequest(f"input {tensor.name!r}: values must lie in [{low}, {high}]")
        rows = list(data)
        return v2.Decoded(rows, stacked(self.spec.name, self.model.datatype, rows))

    def collate(self, rows: list[np.ndarray]) -> Feeds:
        return {self.spec.name: np.stack(rows)}

    def cost(self, row: np.ndarray) -> int:
        return int(row.size)

    def stats(self, rows: list[np.ndarray]) -> np.ndarray:
        if self.features is not None:
            return np.stack(rows).reshape(len(rows), -1)[:, :self.features].astype(np.float64)
        return np.array([(r.size, r.mean(), r.std()) if r.size else (0, 0, 0) for r in rows],
                        np.float64).reshape(len(rows), 3)

    def sample(self, rows: int, seed: int = 0) -> list[np.ndarray]:  # pragma: no mutate
        rng = np.random.default_rng(seed)
        shape = [d if d > 0 else 4 for d in self.model.shape[1:]]
        dtype = native(self.model.datatype)
        low = self.spec.minimum if self.spec.minimum is not None else -3.0
        high = self.spec.maximum if self.spec.maximum is not None else 3.0
        values = rng.uniform(low, high, size=(rows, *shape))
        return list(values.astype(dtype))

    def items(self, values: list[Any]) -> list[np.ndarray]:
        dtype = native(self.model.datatype)
        rows = [np.asarray(v, dtype=dtype) for v in values]
        tensor = v2.Tensor(self.spec.name, [len(rows), *rows[0].shape], self.model.datatype,
                           raw=np.stack(rows).tobytes()) if rows else None
        return self.decode([tensor], {}).rows if tensor is not None else []
