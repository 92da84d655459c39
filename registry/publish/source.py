"""What ``registry publish PATH`` reads: a release folder or a single TorchScript file.

A release folder holds ``tiered.json``. A text classifier (``forward(input_ids,
attention_mask[, token_type_ids])``) needs only::

    {"labels": ["rotten", "fresh"], "center": "center.pt", "edge": "edge.pt",
     "tokenizer": "tokenizer.json", "max_length": 64, "calibration": "calibration.jsonl"}

Any other classifier declares its model inputs (name, V2 datatype, shape with -1 for a
variable dimension) and what clients send for them (``request``: one input of kind ``text``,
``image`` or ``tensor``, fields as in ``serving.release.manifest``)::

    {"labels": ["0", "1", ...], "center": "center.pt", "edge": "edge.pt",
     "inputs": [{"name": "image", "datatype": "FP32", "shape": [-1, 1, 28, 28]}],
     "request": [{"kind": "image", "name": "image", "height": 28, "width": 28,
                  "channels": 1, "mean": [0.1307], "std": [0.3081]}],
     "calibration": "calibration.jsonl"}

``edge`` may be TorchScript (``.pt``, exported to ONNX here) or an fp32 ONNX file (``.onnx``).
``calibration`` is the labelled split the confidence threshold is calibrated on, by kind: JSON
Lines ``{"text": ..., "label": ...}`` for text (``{"text": ..., "text_pair": ..., "label":
...}`` for sentence pairs), ``{"image": "relative/path.png", "label": ...}``
for images, an ``.npz`` holding the input's array (named as the input) and ``labels`` for
tensors; a label is a name or an index. A model that returns a tuple or a dict (a Hugging
Face export returns ``(logits,)``) is read from its first element (a dict's ``logits``);
``"output"`` names another, by index or key. A single TorchScript file is its own center and,
quantized, its own edge, unless ``--edge`` names a smaller edge model beside it;
``--input``/``--image``/``--output`` declare what its signature does not say.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import msgspec
import numpy as np

from registry.errors import InvalidRelease
from serving.release.manifest import ImageInput, RequestInput, TensorInput, TensorSpec, TextInput
from serving.release.store import file_sha256

SPEC_FILE = "tiered.json"
MIN_ROWS = 10
MAX_CALIBRATION_ROWS = 100_000
MAX_NPZ_BYTES = 1 << 30
TEXT_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
PAIR = "text_pair"  # a calibration row's second text (sentence pairs)


class SourceSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    labels: list[str]
    center: str
    edge: str
    tokenizer: str | None = None
    max_length: int = 128
    calibration: str | None = None
    inputs: list[TensorSpec] | None = None  # the model's inputs; None: from its signature
    request: list[RequestInput] | None = None  # what clients send; None: text, or a tensor
    # which element of a tuple or dict output is the logits (index or key); None: the first
    output: str | int | None = None


@dataclass(frozen=True)
class Labelled:
    items: list[Any]  # per row: a text, an encoded image (bytes), a feature array
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
    inputs: list[TensorSpec] | None = None  # declared model inputs (None: from the signature)
    request: RequestInput | None = None  # declared request input (None: derived)
    output: str | int | None = None  # the logits' element of a tuple or dict output
    output_option: str = "--output"  # how the user gave ``output``, for errors

    @property
    def cascade(self) -> bool:
        """Whether the edge is a model of its own (else it is the center, quantized)."""
        return self.edge != self.center

    @property
    def kind(self) -> str:
        """The request input's kind: declared, else text unless non-text inputs are
        declared."""
        if self.request is not None:
            return kind_of(self.request)
        if self.inputs and any(i.name not in TEXT_INPUTS for i in self.inputs):
            return "tensor"
        return "text"


def kind_of(request: RequestInput) -> str:
    return {TextInput: "text", ImageInput: "image", TensorInput: "tensor"}[type(request)]


def load_source(path: Path, *, tokenizer: Path | None = None, labels: list[str] | None = None,
                calibration: Path | None = None, max_length: int = 128,
                inputs: list[TensorSpec] | None = None,
                request: RequestInput | None = None, edge: Path | None = None,
                output: str | int | None = None) -> ReleaseSource:
    """Read and check PATH; the keyword options only apply to a single TorchScript file (and
    to ``edge``, a smaller edge model beside it: TorchScript or fp32 ONNX)."""
    if not path.exists():
        raise InvalidRelease(f"{path}: no such file or folder")
    if path.is_dir():
        if edge is not None:
            raise InvalidRelease(f"{path}: --edge goes with a single center file; a release "
                                 f"folder names its edge in {SPEC_FILE}")
        return _folder(path)
    if not path.is_file():
        raise InvalidRelease(f"{path}: not a regular file or a release folder")
    for extra in (tokenizer, calibration, edge):
        if extra is not None and not extra.is_file():
            raise InvalidRelease(f"{extra}: no such file")
    edge_file = path if edge is None else edge
    edge_format: Literal["torchscript", "onnx"] = ("onnx" if edge_file.suffix == ".onnx"
                                                   else "torchscript")
    source = ReleaseSource(center=path, edge=edge_file, edge_format=edge_format,
                           tokenizer=tokenizer, max_length=max_length, labels=labels,
                           calibration=None, digest="", inputs=inputs, request=request)
    if calibration is not None and source.kind == "text" and tokenizer is None:
        raise InvalidRelease("--calibration needs --tokenizer to turn its texts into inputs")
    labelled, files = (_labelled(calibration, source.kind, labels, calibration.parent,
                                 _tensor_name(inputs, request))
                       if calibration else (None, []))
    digest = _digest([p for p in (path, edge, tokenizer, calibration) if p is not None] + files,
                     _declared(inputs, request, output))
    return ReleaseSource(center=path, edge=edge_file, edge_format=edge_format,
                         tokenizer=tokenizer,
                         max_length=max_length, labels=labels, calibration=labelled,
                         digest=digest, inputs=inputs, request=request, output=output)


def _folder(root: Path) -> ReleaseSource:
    spec_path = root / SPEC_FILE
    if spec_path.is_symlink():
        raise InvalidRelease(f"{spec_path}: symlinks are not accepted in a release folder")
    if not spec_path.is_file():
        raise InvalidRelease(f"{root} is a folder without {SPEC_FILE}; see `registry publish "
                             f"--help` for the release folder layout")
    try:
        spec = msgspec.json.decode(spec_path.read_bytes(), type=SourceSpec)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise InvalidRelease(f"{spec_path}: {exc}") from exc
    if len(spec.labels) < 2 or len(set(spec.labels)) != len(spec.labels):
        raise InvalidRelease(f"{spec_path}: labels must be at least two distinct names")
    if not 1 <= spec.max_length <= 4096:
        raise InvalidRelease(f"{spec_path}: max_length must be between 1 and 4096")
    if isinstance(spec.output, int) and spec.output < 0:
        raise InvalidRelease(f"{spec_path}: output must be an index from 0 or a name")
    if spec.request is not None and len(spec.request) != 1:
        raise InvalidRelease(f"{spec_path}: request must declare exactly one input (one "
                             f"request input per release is the limit)")
    request = spec.request[0] if spec.request else None
    tokenizer_name = spec.tokenizer
    if isinstance(request, TextInput) and request.tokenizer and tokenizer_name is None:
        tokenizer_name = request.tokenizer
    files = {key: _inside(root, name) for key, name in
             [("center", spec.center), ("edge", spec.edge), ("tokenizer", tokenizer_name),
              ("calibration", spec.calibration)] if name is not None}
    max_length = request.max_length if isinstance(request, TextInput) else spec.max_length
    source = ReleaseSource(
        center=files["center"], edge=files["edge"],
        edge_format="onnx" if files["edge"].suffix == ".onnx" else "torchscript",
        tokenizer=files.get("tokenizer"), max_length=max_length, labels=spec.labels,
        calibration=None, digest="", inputs=spec.inputs, request=request)
    if "calibration" in files and source.kind == "text" and "tokenizer" not in files:
        raise InvalidRelease(f"{spec_path}: a calibration split needs a tokenizer")
    labelled, extra = (_labelled(files["calibration"], source.kind, spec.labels, root,
                                 _tensor_name(spec.inputs, request))
                       if "calibration" in files else (None, []))
    return ReleaseSource(
        center=source.center, edge=source.edge, edge_format=source.edge_format,
        tokenizer=source.tokenizer, max_length=max_length, labels=spec.labels,
        calibration=labelled, digest=_digest([spec_path, *files.values(), *extra]),
        inputs=spec.inputs, request=request, output=spec.output,
        output_option=f'{SPEC_FILE} "output":')


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


def _tensor_name(inputs: list[TensorSpec] | None, request: RequestInput | None) -> str | None:
    """The input a tensor calibration split's array must be named after (None: not known
    yet; the signature check refuses a release whose request input is unclear)."""
    if isinstance(request, TensorInput):
        return request.name
    return inputs[0].name if inputs and len(inputs) == 1 else None


def _labelled(path: Path, kind: str, labels: list[str] | None, root: Path,
              name: str | None = None) -> tuple[Labelled, list[Path]]:
    """The labelled split and the files it names (images), by the request input's kind."""
    if kind == "tensor":
        return _arrays(path, labels, name), []
    items: list[Any] = []
    ids: list[int] = []
    files: list[Path] = []
    what = "text" if kind == "text" else "image"
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidRelease(f"{path}: a {kind} calibration split is UTF-8 JSON Lines "
                             f"({type(exc).__name__})") from exc
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            ids.append(_label_index(row["label"], labels))
            if kind == "text":
                items.append(_text(row))
            else:
                files.append(_inside(root, str(row["image"])))
                items.append(files[-1].read_bytes())
        except (ValueError, KeyError, TypeError) as exc:
            raise InvalidRelease(f"{path}:{number}: expected {{\"{what}\": ..., \"label\": "
                                 f"...}} with a known label ({exc})") from exc
        if len(items) > MAX_CALIBRATION_ROWS:
            raise InvalidRelease(f"{path}: more than {MAX_CALIBRATION_ROWS} rows")
    if len(items) < MIN_ROWS:
        raise InvalidRelease(f"{path}: a calibration split needs at least {MIN_ROWS} labelled "
                             f"rows")
    return Labelled(items, ids), files


def _text(row: dict[str, Any]) -> str | tuple[str, str]:
    """A calibration text, or a sentence pair where the row carries ``text_pair``."""
    return (str(row["text"]), str(row[PAIR])) if PAIR in row else str(row["text"])


def _arrays(path: Path, labels: list[str] | None, name: str | None = None) -> Labelled:
    """An ``.npz`` with the input's rows (its one other array, named as the input) and
    ``labels``."""
    try:
        with zipfile.ZipFile(path) as archive:
            if sum(m.file_size for m in archive.infolist()) > MAX_NPZ_BYTES:
                raise InvalidRelease(f"{path}: larger than {MAX_NPZ_BYTES >> 20} MiB unpacked")
        with np.load(path, allow_pickle=False) as data:
            arrays = {key: data[key] for key in data.files}
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise InvalidRelease(f"{path}: not an .npz file ({exc})") from exc
    features = [k for k in arrays if k != "labels"]
    if "labels" not in arrays or len(features) != 1:
        raise InvalidRelease(f"{path}: expected two arrays, the input's rows and 'labels' "
                             f"(found {sorted(arrays)})")
    if name is not None and features[0] != name:
        raise InvalidRelease(f"{path}: its rows are in array {features[0]!r}, but the "
                             f"release's input is {name!r}: save them under that name "
                             f"(np.savez(..., {name}=rows, labels=labels))")
    rows, raw = arrays[features[0]], arrays["labels"]
    if len(rows) != len(raw) or not MIN_ROWS <= len(rows) <= MAX_CALIBRATION_ROWS:
        raise InvalidRelease(f"{path}: {len(rows)} rows and {len(raw)} labels (at least "
                             f"{MIN_ROWS}, at most {MAX_CALIBRATION_ROWS}, as many of each)")
    try:
        ids = [_label_index(v.item() if isinstance(v, np.generic) else v, labels)
               for v in raw.tolist()]
    except ValueError as exc:
        raise InvalidRelease(f"{path}: {exc}") from exc
    return Labelled(list(rows), ids)


def _label_index(label: object, labels: list[str] | None) -> int:
    if isinstance(label, bool):
        raise ValueError("a label is a name or an index, not a boolean")
    if isinstance(label, int) and (labels is None or 0 <= label < len(labels)):
        return label
    if isinstance(label, str) and labels is not None and label in labels:
        return labels.index(label)
    raise ValueError(f"unknown label {label!r}")


def _declared(inputs: list[TensorSpec] | None, request: RequestInput | None,
              output: str | int | None = None) -> bytes:
    """The options a single file is published with, for its digest (none: what it was before
    each option existed, so that ``--skip-existing`` still knows older releases)."""
    declared = [inputs, request] + ([output] if output is not None else [])
    return msgspec.json.encode(declared) if inputs or request or output is not None else b""


def _digest(files: list[Path], declared: bytes = b"") -> str:
    digest = hashlib.sha256()
    for path in files:
        digest.update(f"{path.name}\0{file_sha256(path)}\n".encode())
    if declared:
        digest.update(declared)
    return digest.hexdigest()
