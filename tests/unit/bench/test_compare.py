"""bench.compare's summary: medians per side and their ratio, so one noisy round decides
nothing."""

from __future__ import annotations

from bench.compare import summary


def test_the_summary_is_each_sides_median_and_their_ratio() -> None:
    results = {"this": {8: [300.0, 100.0, 320.0], 1: [50.0, 60.0, 55.0]},
               "other": {8: [310.0, 290.0, 900.0], 1: [50.0, 50.0, 50.0]}}
    assert summary(results) == [(1, 55.0, 50.0, 1.1), (8, 300.0, 310.0, 300.0 / 310.0)]
