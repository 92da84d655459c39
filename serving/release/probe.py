"""The fidelity probe: every node checks a release on its own hardware before serving it.

INT8 kernels differ by CPU (x86 without VNNI saturates where a VNNI or ARM CPU does not), and a
GPU center may run in fp16/bf16, so the agreement the publisher measured on its own machine
says little about a node. A release carries ``probe.npz``: a few hundred calibration rows as
the model's inputs (one array per model input, e.g. token ids and mask padded to the longest,
or images; stored compactly, ``serving.release.compact``) with the fp32 edge's and the fp32
center's logits on exactly those rows, in batches of ``batch`` rows. At load, after warm-up, a
node runs its model on the same batches and computes top-1 agreement with its tier's reference;
below the floor (the release's, or the node's own setting) the version is refused and the
previous one keeps serving.

The file is an artifact like the models (sha256 in the signed manifest, verified before load);
it is still read as untrusted: no pickles, known keys, dtypes and shapes, bounded sizes.
"""

from __future__ import annotations

import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from serving.errors import ProbeError
from serving.model.datatypes import native
from serving.release import compact
from serving.release.manifest import TensorSpec

if TYPE_CHECKING:
    from serving.release.hardware import Platform

FILE = "probe.npz"
ROWS = 256
"""Rows a publish puts in the probe (fewer when the calibration split is smaller, or when the
rows would make the probe larger than the edge model: ``serving.release.compact``)."""
MIN_ROWS = 64
"""Rows a probe keeps even when they make it larger than the edge model: on fewer, one
disagreement moves the agreement by more than the floor leaves room for."""
BATCH = 32
MAX_ROWS, MAX_CLASSES, MAX_INPUTS = 4096, 4096, 16
MAX_BYTES = 64 << 20  # uncompressed, all members together
KEYS = {"edge": np.float32, "center": np.float32, "batch": np.int64}
Feeds = dict[str, np.ndarray]
Predict = Callable[[Feeds], np.ndarray]


@dataclass(frozen=True)
class Measured:
    agreement: float  # top-1 agreement with the tier's fp32 reference
    rows: int


@dataclass(frozen=True)
class Probe:
    feeds: Feeds  # the model's inputs, each [rows, ...]
    edge: np.ndarray  # float32 [rows, classes]: the fp32 edge model's logits
    center: np.ndarray  # float32 [rows, classes]: the fp32 center model's logits
    batch: int

    @property
    def rows(self) -> int:
        return len(self.edge)

    def reference(self, tier: Literal["edge", "center"]) -> np.ndarray:
        return self.edge if tier == "edge" else self.center


def run(predict: Predict, feeds: Feeds, batch: int = BATCH) -> np.ndarray:
    """Logits of ``predict`` on the probe rows, in the probe's batches."""
    rows = len(next(iter(feeds.values())))
    return np.concatenate([np.asarray(predict({k: v[i:i + batch] for k, v in feeds.items()}),
                                      dtype=np.float32) for i in range(0, rows, batch)])


def save(path: Path, feeds: Feeds, edge: np.ndarray, center: np.ndarray,
         batch: int = BATCH) -> None:
    arrays: dict[str, Any] = {**feeds, "edge": edge.astype(np.float32),
                              "center": center.astype(np.float32), "batch": np.int64(batch)}
    np.savez_compressed(path, **arrays)


def load(path: Path, model: list[TensorSpec]) -> Probe:
    """Read and check a probe file (bounded before anything is decompressed): its arrays are
    the ``model``'s inputs (a float input possibly as codes, ``serving.release.compact``) and
    the references, nothing else."""
    inputs = {i.name: native(i.datatype) for i in model}
    expected = {**{k: np.dtype(v) for k, v in KEYS.items()}, **inputs}
    try:
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
            if sum(m.file_size for m in members) > MAX_BYTES:
                raise ProbeError(f"{path.name}: larger than {MAX_BYTES >> 20} MiB unpacked")
            packed = _packed({m.filename for m in members}, inputs)
            expected |= {k + suffix: np.dtype(np.float32) for k in packed
                         for suffix in (compact.SCALE, compact.OFFSET)}
            expected |= {k: np.dtype(np.uint8) for k in packed}
            if sorted(m.filename for m in members) != sorted(f"{k}.npy" for k in expected):
                raise ProbeError(f"{path.name}: expected the arrays {sorted(expected)}")
        with np.load(path, allow_pickle=False) as data:
            arrays = {key: data[key] for key in expected}
    except (OSError, zipfile.BadZipFile, ValueError) as exc:
        if isinstance(exc, ProbeError):
            raise
        raise ProbeError(f"{path.name}: not a probe file ({exc})") from exc
    for key, dtype in expected.items():
        if arrays[key].dtype != dtype:
            raise ProbeError(f"{path.name}: {key} is {arrays[key].dtype}, expected {dtype}")
    for key in packed:
        arrays[key] = _unpacked(arrays, key, inputs[key], path.name)
    return _checked(arrays, list(inputs), path.name)


def _packed(members: set[str], inputs: dict[str, Any]) -> list[str]:
    """The float inputs stored as codes (a scale member beside them)."""
    return [k for k, dtype in inputs.items() if np.dtype(dtype).kind == "f"
            and f"{k}{compact.SCALE}.npy" in members]


def _unpacked(arrays: dict[str, np.ndarray], key: str, dtype: Any, name: str) -> np.ndarray:
    codes, scale = arrays[key], arrays[key + compact.SCALE]
    offset = arrays[key + compact.OFFSET]
    channels = codes.shape[1] if codes.ndim >= 2 else 1
    if scale.shape != (channels,) or offset.shape != (channels,) or not (
            np.isfinite(scale).all() and np.isfinite(offset).all()):
        raise ProbeError(f"{name}: {key} codes of shape {list(codes.shape)} with a scale of "
                         f"shape {list(scale.shape)} and an offset of {list(offset.shape)}")
    return compact.unpack(codes, scale, offset, np.dtype(dtype))


def _checked(a: dict[str, np.ndarray], inputs: list[str], name: str) -> Probe:
    edge, center, batch = a["edge"], a["center"], a["batch"]
    rows = edge.shape[0] if edge.ndim == 2 else 0
    if not 0 < rows <= MAX_ROWS:
        raise ProbeError(f"{name}: reference logits of shape {list(edge.shape)}")
    for logits in (edge, center):
        if logits.ndim != 2 or logits.shape[0] != rows or not 2 <= logits.shape[1] <= \
                MAX_CLASSES or not np.isfinite(logits).all():
            raise ProbeError(f"{name}: reference logits of shape {list(logits.shape)} for "
                             f"{rows} rows")
    if batch.ndim != 0 or not 1 <= int(batch) <= MAX_ROWS:
        raise ProbeError(f"{name}: invalid batch size")
    feeds = {k: a[k] for k in inputs}
    for key, values in feeds.items():
        if values.ndim < 1 or values.shape[0] != rows:
            raise ProbeError(f"{name}: {key} of shape {list(values.shape)} for {rows} rows")
        if values.dtype.kind == "f" and not np.isfinite(values).all():
            raise ProbeError(f"{name}: {key} holds NaN or infinite values")
    ids, mask = feeds.get("input_ids"), feeds.get("attention_mask")
    if (ids is not None and ids.min() < 0) or (mask is not None and
                                               not np.isin(mask, (0, 1)).all()):
        raise ProbeError(f"{name}: negative token ids or a mask that is not 0/1")
    return Probe(feeds, edge, center, int(batch))


def measure(predict: Predict, probe: Probe, tier: Literal["edge", "center"]) -> Measured:
    """Top-1 agreement of ``predict`` with the tier's fp32 reference on the probe."""
    logits = run(predict, probe.feeds, probe.batch)
    reference = probe.reference(tier)
    if logits.shape != reference.shape:
        raise ProbeError(f"the model returned shape {list(logits.shape)} on the probe, its "
                         f"reference has {list(reference.shape)}")
    return Measured(float((logits.argmax(1) == reference.argmax(1)).mean()), probe.rows)


class FidelityRefused(RuntimeError):
    """The model agrees with its reference below the floor on this node's hardware."""

    def __init__(self, measured: Measured, floor: float, platform: Platform) -> None:
        super().__init__(f"fidelity {measured.agreement:.1%} on {measured.rows} probe rows, "
                         f"below the {floor:.1%} floor, on {platform.describe()} with "
                         f"{platform.runtime}")
        self.measured, self.floor, self.platform = measured, floor, platform
