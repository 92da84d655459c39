from __future__ import annotations

import random

import pytest

from sync.wire.backoff import Backoff


def test_backoff_draws_full_jitter_below_a_cap_that_doubles_up_to_its_maximum(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The bounds each delay is drawn between: 0 and base * 2**failures, capped; reset starts
    over. Taking the top of each range makes the growth itself visible."""
    drawn: list[tuple[float, float]] = []

    def top(low: float, high: float) -> float:
        drawn.append((low, high))
        return high

    monkeypatch.setattr(random, "uniform", top)
    backoff = Backoff(maximum=4.0, base=0.5)
    assert [backoff.next() for _ in range(7)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0, 4.0]
    assert drawn == [(0, 0.5), (0, 1.0), (0, 2.0), (0, 4.0), (0, 4.0), (0, 4.0), (0, 4.0)]
    backoff.reset()
    assert [backoff.next() for _ in range(3)] == [0.5, 1.0, 2.0]
    slow = Backoff(maximum=30.0, base=1.0)  # the subscriber's retry of a failed install
    assert [slow.next() for _ in range(7)] == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]


def test_backoff_is_jittered_down_to_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(random, "uniform", lambda low, high: low)
    backoff = Backoff(maximum=4.0, base=0.5)
    assert [backoff.next() for _ in range(4)] == [0, 0, 0, 0]


def test_backoff_delays_spread_out_and_never_pass_the_cap() -> None:
    samples = [Backoff(4.0, 0.5) for _ in range(200)]
    for b in samples:
        for _ in range(5):
            b.next()
    jittered = {round(b.next(), 6) for b in samples}
    assert len(jittered) > 150 and max(jittered) <= 4.0  # fleet members do not retry in step
    grown = [Backoff(4.0, 0.5) for _ in range(200)]
    for b in grown:
        b.next()
    # the second delay is drawn from [0, 1]: with 200 draws some lie above the first's 0.5
    assert max(b.next() for b in grown) > 0.5
