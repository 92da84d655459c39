"""``tiered demo --data FILE``: a user's own labelled rows, read as ``registry publish`` reads a
calibration split (JSON Lines ``{"text" | "image" | <input name>: ..., "label": ...}``, or an
``.npz`` holding the input's array, named as the input, and ``labels``), and turned into V2
requests of ``batch`` rows for the model its V2 metadata describes.

What the model takes comes from ``GET /v2/models/NAME`` (its inputs, its label names), so any
published model can be demoed through nginx from any machine, without the registry. A label in
the file is a label name or an index into the model's labels; answers are compared by name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from tiered.demo import OUTPUTS, DemoRequest

MAX_ROWS = 100_000  # the calibration split's bound (registry.publish.source)
NUMPY = {"FP32": np.float32, "FP64": np.float64, "FP16": np.float16, "INT64": np.int64,
         "INT32": np.int32, "INT16": np.int16, "INT8": np.int8, "UINT8": np.uint8,
         "BOOL": np.bool_}


class DataError(ValueError):
    """The file does not fit the model: one line saying where and what the model takes."""


@dataclass(frozen=True)
class LabelledRows:
    """Labelled rows for one request input: texts, encoded images or feature arrays."""

    kind: str  # "text" | "image" | "tensor"
    name: str  # the request input's name
    datatype: str  # what the rows are sent as
    items: list[Any]
    labels: list[str]  # label names, as the model answers them

    def requests(self, batch: int) -> list[DemoRequest]:
        """Consecutive ``batch``-row V2 requests (the last one may be shorter)."""
        return [self._request(self.items[i:i + batch], self.labels[i:i + batch])
                for i in range(0, len(self.items), batch)]

    def _request(self, items: list[Any], labels: list[str]) -> DemoRequest:
        if self.kind == "image":  # encoded bytes, length-prefixed, in the binary extension
            blob = b"".join(len(b).to_bytes(4, "little") + b for b in items)
            head = json.dumps({"inputs": [{"name": self.name, "shape": [len(items)],
                                           "datatype": "BYTES",
                                           "parameters": {"binary_data_size": len(blob)}}],
                               "outputs": OUTPUTS}).encode()
            return DemoRequest(head + blob, labels, len(head))
        if self.kind == "text":
            tensor = {"name": self.name, "shape": [len(items)], "datatype": "BYTES",
                      "data": items}
        else:
            array = np.stack(items)
            tensor = {"name": self.name, "shape": list(array.shape), "datatype": self.datatype,
                      "data": array.reshape(-1).tolist()}
        return DemoRequest(json.dumps({"inputs": [tensor], "outputs": OUTPUTS}).encode(), labels)


def read_rows(path: Path, metadata: dict[str, Any]) -> LabelledRows:
    """``path``'s labelled rows for the model ``metadata`` describes (its V2 metadata)."""
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    inputs = metadata.get("inputs") or []
    names = [n for n in str((metadata.get("parameters") or {}).get("labels", "")).split(",")
             if n]
    if not inputs or not names:
        raise DataError(f"model {metadata.get('name')!r}: its metadata names no inputs or labels")
    if path.suffix == ".npz":
        return _arrays(path, inputs[0], names)
    return _lines(path, inputs, names, path.parent)


def _label(value: object, names: list[str], where: str) -> str:
    if isinstance(value, str) and value in names:
        return value
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(names):
        return names[value]
    raise DataError(f"{where}: unknown label {value!r} (the model's labels: "
                    f"{', '.join(names)}, or their index)")


def _arrays(path: Path, spec: dict[str, Any], names: list[str]) -> LabelledRows:
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {key: data[key] for key in data.files}
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: not an .npz file ({exc})") from exc
    name, datatype = spec["name"], spec["datatype"]
    if name not in arrays or "labels" not in arrays or datatype not in NUMPY:
        raise DataError(f"{path}: expected arrays {name!r} ({datatype} "
                        f"{spec['shape']}) and 'labels', found {sorted(arrays)}")
    rows, raw = arrays[name], arrays["labels"]
    fixed = [int(d) for d in spec["shape"][1:]]
    if rows.ndim != len(fixed) + 1 or any(d not in (-1, s) for d, s in
                                          zip(fixed, rows.shape[1:], strict=True)):
        raise DataError(f"{path}: {name!r} has shape {list(rows.shape)}; the model takes "
                        f"{spec['shape']}")
    if len(rows) != len(raw) or not 1 <= len(rows) <= MAX_ROWS:
        raise DataError(f"{path}: {len(rows)} rows and {len(raw)} labels (1 to {MAX_ROWS}, as "
                        f"many of each)")
    labels = [_label(v, names, f"{path}: row {i}") for i, v in enumerate(raw.tolist())]
    try:
        typed = rows.astype(NUMPY[datatype])
    except (TypeError, ValueError) as exc:
        raise DataError(f"{path}: {name!r} is not {datatype} ({exc})") from exc
    return LabelledRows("tensor", name, datatype, list(typed), labels)


def _lines(path: Path, inputs: list[dict[str, Any]], names: list[str], root: Path) -> LabelledRows:
    first = inputs[0]
    text = next((i["name"] for i in inputs if i["datatype"] == "BYTES"), None)
    items: list[Any] = []
    labels: list[str] = []
    kind = ""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: not a JSON Lines file ({exc})") from exc
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise DataError(f"{where}: not JSON ({exc})") from exc
        kind = kind or _kind(row, text)
        key = ("image" if kind == "image" else first["name"] if kind == "tensor" else
               "text" if not isinstance(row, dict) or "text" in row else str(text))
        if not isinstance(row, dict) or key not in row or "label" not in row:
            raise DataError(f"{where}: expected {{\"{key}\": ..., \"label\": ...}} for the "
                            f"model's input {first['name']!r} ({first['datatype']} "
                            f"{first['shape']})")
        items.append(_item(kind, row[key], first, root, where))
        labels.append(_label(row["label"], names, where))
        if len(items) > MAX_ROWS:
            raise DataError(f"{path}: more than {MAX_ROWS} rows")
    if not items:
        raise DataError(f"{path}: no labelled rows")
    return LabelledRows(kind, text if kind == "text" and text else first["name"],
                first["datatype"] if kind == "tensor" else "BYTES", items, labels)


def _kind(row: object, text: str | None) -> str:
    """What the file's rows carry, from its first row: a text (for a model taking text), an
    image's path, else the input's values."""
    if isinstance(row, dict) and text is not None and isinstance(row.get("text"), str):
        return "text"
    if isinstance(row, dict) and text is None and isinstance(row.get("image"), str):
        return "image"
    return "text" if text is not None else "tensor"


def _item(kind: str, value: object, spec: dict[str, Any], root: Path, where: str) -> Any:
    """One row's payload: a text, an image file's bytes (its path relative to the data
    file's folder) or a feature array of the model's row shape."""
    if kind == "text":
        if not isinstance(value, str):
            raise DataError(f"{where}: a text is a string, not {type(value).__name__}")
        return value
    if kind == "image":
        try:
            return (root / str(value)).read_bytes()
        except OSError as exc:
            raise DataError(f"{where}: cannot read the image {value!r} ({exc})") from exc
    try:
        array: np.ndarray = np.asarray(value, dtype=NUMPY[spec["datatype"]])
    except (KeyError, TypeError, ValueError) as exc:
        raise DataError(f"{where}: not a {spec['datatype']} row ({exc})") from exc
    fixed = spec["shape"][1:]
    if array.ndim != len(fixed) or any(d not in (-1, s)
                                       for d, s in zip(fixed, array.shape, strict=True)):
        raise DataError(f"{where}: a row of shape {list(array.shape)}; the model takes "
                        f"{spec['shape']}")
    return array


def model_metadata(url: str, model: str, headers: dict[str, str]) -> dict[str, Any]:
    """The model's V2 metadata through ``url`` (nginx); ``DataError`` when no node serves a
    model of that name, ``httpx.HTTPError`` when the fleet does not answer."""
    answer = httpx.get(f"{url}/v2/models/{model}", headers=headers, timeout=10)
    if answer.status_code in (400, 404):
        raise DataError(f"{model!r}: no such model at {url} ({_error(answer)})")
    answer.raise_for_status()
    found = answer.json()
    if not isinstance(found, dict):
        raise DataError(f"{url}/v2/models/{model}: not V2 model metadata")
    return found


def _error(answer: httpx.Response) -> str:
    try:
        return str(answer.json().get("error", answer.status_code))
    except ValueError:
        return f"HTTP {answer.status_code}"
