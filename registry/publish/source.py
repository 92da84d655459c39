"""What ``registry publish PATH`` reads: a release folder or a single TorchScript file.

A release folder holds ``tiered.json``::

    {"labels": ["rotten", "fresh"], "center": "center.pt", "edge": "edge.pt",
     "tokenizer": "tokenizer.json", "max_length": 64, "calibration": "calibration.jsonl"}

``edge`` may be TorchScript (``.pt``, exported to ONNX here) or an fp32 ONNX file (``.onnx``).
``calibration`` is JSON Lines with ``{"text": ..., "label": ...}`` (label name or index): the
labelled split the confidence threshold is calibrated on. A single TorchScript file is its own
center and, quantized, its own edge.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import msgspec

from registry.errors import InvalidRelease
from serving.release.store import file_sha256

SPEC_FILE = "tiered.json"


class SourceSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    labels: list[str]
    center: str
    edge: str
    tokenizer: str | None = None
    max_length: int = 128
    calibration: str | None = None


@dataclass(frozen=True)
class Labelled:
    texts: list[str]
    labels: list[int]


@dataclass(frozen=True)
class ReleaseSource:
    center: Path
    edge: Path
    edge_format: Literal["torchscript", "onnx"]
    tokenizer: Path | None
    max_length: int
    labels: list[str] | None  # None: named after the output indices once it is known
    calibration: Labelled | None
    digest: str  # sha256 over the source files: same inputs -> same digest


def load_source(path: Path, *, tokenizer: Path | None = None, labels: list[str] | None = None,
                calibration: Path | None = None, max_length: int = 128) -> ReleaseSource:
    """Read and check PATH; the keyword options only apply to a single TorchScript file."""
    if not path.exists():
        raise InvalidRelease(f"{path}: no such file or folder")
    if path.is_dir():
        return _folder(path)
    if not path.is_file():
        raise InvalidRelease(f"{path}: not a regular file or a release folder")
    if tokenizer is None and calibration is not None:
        raise InvalidRelease("--calibration needs --tokenizer to turn its texts into inputs")
    for extra in (tokenizer, calibration):
        if extra is not None and not extra.is_file():
            raise InvalidRelease(f"{extra}: no such file")
    files = [p for p in (path, tokenizer, calibration) if p is not None]
    return ReleaseSource(center=path, edge=path, edge_format="torchscript", tokenizer=tokenizer,
                         max_length=max_length, labels=labels,
                         calibration=_labelled(calibration, labels) if calibration else None,
                         digest=_digest(files))


def _folder(root: Path) -> ReleaseSource:
    spec_path = root / SPEC_FILE
    if spec_path.is_symlink():
        raise InvalidRelease(f"{spec_path}: symlinks are not accepted in a release folder")
    if not spec_path.is_file():
        raise InvalidRelease(f"{root} is a folder without {SPEC_FILE}; see `registry publish "
                             f"--help` for the release folder layout")
    try:
        spec = msgspec.json.decode(spec_path.read_bytes(), type=SourceSpec)
    except msgspec.DecodeError as exc:
        raise InvalidRelease(f"{spec_path}: {exc}") from exc
    if len(spec.labels) < 2 or len(set(spec.labels)) != len(spec.labels):
        raise InvalidRelease(f"{spec_path}: labels must be at least two distinct names")
    if not 1 <= spec.max_length <= 4096:
        raise InvalidRelease(f"{spec_path}: max_length must be between 1 and 4096")
    files = {key: _inside(root, name) for key, name in
             [("center", spec.center), ("edge", spec.edge), ("tokenizer", spec.tokenizer),
              ("calibration", spec.calibration)] if name is not None}
    if "calibration" in files and "tokenizer" not in files:
        raise InvalidRelease(f"{spec_path}: a calibration split needs a tokenizer")
    edge_format: Literal["torchscript", "onnx"] = (
        "onnx" if files["edge"].suffix == ".onnx" else "torchscript")
    return ReleaseSource(
        center=files["center"], edge=files["edge"], edge_format=edge_format,
        tokenizer=files.get("tokenizer"), max_length=spec.max_length, labels=spec.labels,
        calibration=_labelled(files["calibration"], spec.labels) if "calibration" in files
        else None,
        digest=_digest([spec_path, *files.values()]))


def _inside(root: Path, name: str) -> Path:
    """A file named by the spec: a relative path inside the folder, no ``..``, no symlink
    anywhere along it, a regular file (not a device, FIFO or folder)."""
    relative = Path(name)
    if (not name or relative.is_absolute() or ".." in relative.parts or "\\" in name
            or any(ord(c) < 32 or c == "\x7f" for c in name)):
        raise InvalidRelease(f"{name!r}: release files must be plain relative paths inside "
                             f"{root} (no '..', no absolute path)")
    candidate = root
    for part in relative.parts:
        candidate = candidate / part
        if candidate.is_symlink():
            raise InvalidRelease(f"{candidate}: symlinks are not accepted in a release folder")
    if not candidate.exists():
        raise InvalidRelease(f"{candidate}: no such file")
    if not candidate.is_file():
        raise InvalidRelease(f"{candidate}: not a regular file")
    if not candidate.resolve().is_relative_to(root.resolve()):
        raise InvalidRelease(f"{candidate}: outside the release folder {root}")
    return candidate


def _labelled(path: Path, labels: list[str] | None) -> Labelled:
    texts, ids = [], []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            texts.append(str(row["text"]))
            ids.append(_label_index(row["label"], labels))
        except (ValueError, KeyError, TypeError) as exc:
            raise InvalidRelease(f"{path}:{number}: expected {{\"text\": ..., \"label\": ...}} "
                                 f"with a known label ({exc})") from exc
    if len(texts) < 10:
        raise InvalidRelease(f"{path}: a calibration split needs at least 10 labelled rows")
    return Labelled(texts, ids)


def _label_index(label: object, labels: list[str] | None) -> int:
    if isinstance(label, bool):
        raise ValueError("a label is a name or an index, not a boolean")
    if isinstance(label, int) and (labels is None or 0 <= label < len(labels)):
        return label
    if isinstance(label, str) and labels is not None and label in labels:
        return labels.index(label)
    raise ValueError(f"unknown label {label!r}")


def _digest(files: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in files:
        digest.update(f"{path.name}\0{file_sha256(path)}\n".encode())
    return digest.hexdigest()
