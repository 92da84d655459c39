from __future__ import annotations

import numpy as np

from edge.breaker import CircuitBreaker
from edge.gate import unsure


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_breaker_opens_probes_once_and_closes() -> None:
    clock = Clock()
    breaker = CircuitBreaker(failures=3, reset_s=5, clock=clock)
    for _ in range(2):
        breaker.failure()
        assert breaker.allow()
    breaker.failure()
    assert breaker.state == "open" and not breaker.allow()
    clock.now = 5.0
    assert breaker.state == "half-open"
    assert breaker.allow() and not breaker.allow()  # one probe at a time
    breaker.failure()
    assert breaker.state == "open"
    clock.now = 10.0
    assert breaker.allow()
    breaker.success()
    assert breaker.state == "closed" and breaker.allow()


def test_retry_after_opens_the_circuit_for_that_long() -> None:
    clock = Clock()
    breaker = CircuitBreaker(failures=3, reset_s=5, clock=clock)
    breaker.failure(cooldown=2)
    assert breaker.state == "open"
    clock.now = 2.0
    assert breaker.allow()


def test_gate_thresholds() -> None:
    confidence = np.array([[0.9, 0.1], [0.55, 0.45], [0.3, 0.7], [0.0, 1.0]]).max(axis=1)
    assert unsure(confidence, 0.75) == [1, 2]
    assert unsure(confidence, 0.7) == [1]  # at the threshold: the edge answers
    assert unsure(confidence, np.nextafter(0.7, 1)) == [1, 2]  # just above it: escalated
    assert unsure(confidence, 0) == []
    assert unsure(confidence, 1) == [0, 1, 2, 3]  # 1 escalates even certain rows
