"""The response cache and the answers it merges (``edge.cache``), value by value: the tests
that kill `make mutate`'s mutants the older tests let through."""

from __future__ import annotations

import time

import numpy as np

from edge.cache import Answers, Cached, ResponseCache


def test_an_empty_answer_has_no_rows_of_the_models_labels() -> None:
    empty = Answers.empty(3)
    assert empty.probabilities.shape == (0, 3) and empty.probabilities.dtype == np.float32
    assert empty.tiers == [] and empty.versions == []


def test_hits_and_fresh_answers_each_land_in_their_own_rows() -> None:
    hits = {0: Cached(np.array([0.875, 0.125], np.float32), "edge"),
            2: Cached(np.array([0.25, 0.75], np.float32), "center", "7")}
    fresh = Answers(np.array([[0.625, 0.375], [0.5, 0.5]], np.float32), ["edge", "center"],
                    [None, "8"])
    merged = Answers.merged(hits, [1, 3], fresh)
    np.testing.assert_array_equal(merged.probabilities,
                                  [[0.875, 0.125], [0.625, 0.375], [0.25, 0.75], [0.5, 0.5]])
    assert merged.tiers == ["edge", "edge", "center", "center"]
    assert merged.versions == [None, None, "7", "8"]
    every = Answers.merged({0: hits[2], 1: hits[0]}, [], Answers.empty(2))  # every row cached
    np.testing.assert_array_equal(every.probabilities, [[0.25, 0.75], [0.875, 0.125]])
    assert every.tiers == ["center", "edge"] and every.versions == ["7", None]
    assert Answers.merged({}, [0, 1], fresh) is fresh


def test_a_row_taken_from_an_answer_is_a_copy() -> None:
    answers = Answers(np.array([[0.6, 0.4]], np.float32), ["center"], ["9"])
    row = answers.row(0)
    answers.probabilities[0] = [0.0, 1.0]
    assert row.probabilities.tolist() == [np.float32(0.6), np.float32(0.4)]
    assert (row.tier, row.center_version) == ("center", "9")


def test_keys_name_model_version_threshold_and_the_rows_bytes() -> None:
    row = np.array([1, 2, 3], np.int64)
    key = ResponseCache.key("m", 3, 0.9, row)
    assert key.startswith("m/3/0.9/") and len(key.rsplit("/", 1)[1]) == 32
    assert key == ResponseCache.key("m", 3, 0.9, row.copy())
    others = {ResponseCache.key("n", 3, 0.9, row), ResponseCache.key("m", 4, 0.9, row),
              ResponseCache.key("m", 3, 0.91, row),
              ResponseCache.key("m", 3, 0.9, np.array([1, 2, 4], np.int64))}
    assert key not in others and len(others) == 4


def test_degraded_and_shed_answers_are_never_stored_and_a_zero_size_cache_is_off() -> None:
    cache = ResponseCache(10, 60.0)
    assert cache.enabled
    probabilities = np.array([0.5, 0.5], np.float32)
    for tier in ("edge", "center", "edge-degraded", "edge-shed"):
        cache.put(tier, Cached(probabilities, tier))
    hits, misses = cache.lookup(["edge-shed", "edge", "edge-degraded", "center", "none"])
    assert sorted(hits) == [1, 3] and misses == [0, 2, 4]
    assert hits[1].tier == "edge" and hits[3].tier == "center"
    off = ResponseCache(0, 60.0)
    off.put("k", Cached(probabilities, "edge"))
    assert not off.enabled and off.get("k") is None
    assert off.lookup(["k"]) == ({}, [0])


def test_the_cache_keeps_the_newest_entries_for_their_ttl() -> None:
    cache = ResponseCache(2, 0.2)
    for key in ("a", "b", "c"):
        cache.put(key, Cached(np.zeros(2, np.float32), "edge"))
    assert cache.get("a") is None and cache.get("c") is not None
    time.sleep(0.3)
    assert cache.get("c") is None
