"""What every request input kind provides (:class:`Codec`), and the limits they share."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from serving.errors import BadRequest
from serving.protocol import v2
from serving.release.manifest import TensorSpec

Feeds = dict[str, np.ndarray]
"""A model call's inputs by the model's input names."""


@dataclass(frozen=True)
class Bounds:
    """The node's limits on one request (its serving settings)."""

    max_rows: int = 256  # rows per request
    max_text_bytes: int = 64 * 1024  # one string, before tokenization


class Codec(Protocol):
    """One request input kind over one release's model (``serving/inputs/__init__``)."""

    kind: str
    inline_bytes: int  # bodies up to this size are parsed on the event loop, larger in a thread
    statistics: list[str]  # the names of :meth:`stats`'s columns, in order

    def __init__(self, spec: Any, inputs: list[TensorSpec], bounds: Bounds,
                 files: Callable[[str], Path]) -> None: ...

    def metadata(self) -> list[dict[str, Any]]:
        """The V2 model metadata's inputs: what a client may send."""
        ...

    def decode(self, tensors: list[v2.Tensor], parameters: dict[str, Any]) -> v2.Decoded:
        """The request's rows (``BadRequest`` naming what the model takes when it is wrong)."""
        ...

    def collate(self, rows: list[np.ndarray]) -> Feeds:
        """One model call's feeds from rows (padded where rows differ in length)."""
        ...

    def cost(self, row: np.ndarray) -> int:
        """What computing the row costs, in the batcher's units (tokens for text): rows of
        equal cost batch without padding."""
        ...

    def stats(self, rows: list[np.ndarray]) -> np.ndarray:
        """Per-row input statistics, ``[len(rows), len(statistics)]`` float64, of decoded rows
        (what the model sees): input drift compares their window means with the release's
        calibration rows' (``serving.inputs.drift``). Vectorised: a few numpy calls a request."""
        ...

    def sample(self, rows: int, seed: int = 0) -> list[np.ndarray]:  # pragma: no mutate
        """Generated rows of every shape serving sees (warm-up; calibration without data)."""
        ...

    def items(self, values: list[Any]) -> list[np.ndarray]:
        """Rows from calibration items (a text, an encoded image, a feature row), decoded as a
        request carrying them would be."""
        ...


def one_input(tensors: list[v2.Tensor], names: dict[str, str]) -> v2.Tensor:
    """The request's only input, which must be one of ``names`` (name -> what it carries)."""
    expected = " or ".join(f"{n!r} ({what})" for n, what in names.items())
    if not tensors:
        raise BadRequest(f"no inputs: this model takes {expected}")
    unknown = [t.name for t in tensors if t.name not in names]
    if unknown:
        raise BadRequest(f"unknown input {unknown[0]!r}: this model takes {expected}")
    if len(tensors) != 1:
        raise BadRequest(f"send one input: {expected}")
    return tensors[0]


def model_input(inputs: list[TensorSpec], name: str) -> TensorSpec:
    for spec in inputs:
        if spec.name == name:
            return spec
    raise ValueError(f"the model has no input {name!r} (its inputs: "
                     f"{[s.name for s in inputs]})")


def stacked(name: str, datatype: str, rows: list[np.ndarray]) -> Callable[[list[int]],
                                                                         list[v2.Tensor]]:
    """``forward`` for rows sent as one stacked tensor of ``datatype``."""
    def forward(indices: list[int]) -> list[v2.Tensor]:
        return [v2.binary(name, datatype, np.stack([rows[i] for i in indices]))]
    return forward


def encoded(name: str, values: list[bytes] | list[str]) -> Callable[[list[int]],
                                                                   list[v2.Tensor]]:
    """``forward`` for rows sent as the BYTES elements they came in (texts, encoded images)."""
    def forward(indices: list[int]) -> list[v2.Tensor]:
        return [v2.binary(name, "BYTES", [values[i] for i in indices])]
    return forward
