"""LRU + TTL response cache: a repeated input costs no inference."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
from cachetools import TTLCache


@dataclass(frozen=True)
class Cached:
    """One row's answer: its probabilities, the tier that gave them, the center's version."""

    probabilities: np.ndarray
    tier: str
    center_version: str | None = None


@dataclass
class Answers:
    """Rows' answers in order, as arrays: what the cascade works on (one numpy call per request,
    not one per row). ``probabilities`` may be the batcher's own rows until one is replaced."""

    probabilities: np.ndarray  # rows x labels
    tiers: list[str]
    versions: list[str | None]  # the center's version, for rows it answered

    @classmethod
    def empty(cls, labels: int) -> Answers:
        return cls(np.zeros((0, labels), np.float32), [], [])

    def row(self, k: int) -> Cached:
        return Cached(self.probabilities[k].copy(), self.tiers[k], self.versions[k])

    @classmethod
    def merged(cls, hits: dict[int, Cached], misses: list[int], fresh: Answers) -> Answers:
        """A request's answers: its cache ``hits`` by position, and ``fresh``, the answers of
        its rows ``misses``."""
        if not hits:
            return fresh
        rows = len(hits) + len(misses)
        labels = next(iter(hits.values())).probabilities.shape[0]
        probabilities = np.empty((rows, labels), np.float32)
        tiers: list[str] = [""] * rows
        versions: list[str | None] = [None] * rows
        for i, hit in hits.items():
            probabilities[i] = hit.probabilities
            tiers[i], versions[i] = hit.tier, hit.center_version
        probabilities[misses] = fresh.probabilities
        for k, i in enumerate(misses):
            tiers[i], versions[i] = fresh.tiers[k], fresh.versions[k]
        return cls(probabilities, tiers, versions)


class ResponseCache:
    """Keyed by model, edge version, threshold and the row as the model sees it (its input
    kind's row: token ids, a normalised image, features; so equal inputs however they were
    sent share entries). Degraded answers are never stored."""

    def __init__(self, size: int, ttl_s: float) -> None:
        self._cache: TTLCache[str, Cached] | None = TTLCache(size, ttl_s) if size else None

    @property
    def enabled(self) -> bool:
        return self._cache is not None

    @staticmethod
    def key(model: str, version: int, threshold: float, row: np.ndarray) -> str:
        digest = hashlib.blake2b(row.tobytes(), digest_size=16).hexdigest()
        return f"{model}/{version}/{threshold!r}/{digest}"

    def get(self, key: str) -> Cached | None:
        return self._cache.get(key) if self._cache is not None else None

    def lookup(self, keys: list[str]) -> tuple[dict[int, Cached], list[int]]:
        """The cached answers by position in ``keys``, and the positions not cached."""
        hits: dict[int, Cached] = {}
        misses: list[int] = []
        for i, key in enumerate(keys):
            hit = self.get(key)
            if hit is None:
                misses.append(i)
            else:
                hits[i] = hit
        return hits, misses

    def put(self, key: str, value: Cached) -> None:
        if self._cache is not None and value.tier not in ("edge-degraded", "edge-shed"):
            self._cache[key] = value
