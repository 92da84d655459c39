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
