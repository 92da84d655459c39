"""A budget pushed down the sync stream is checked before the edge's controller sees it: the
registry is authenticated, but a figure it sends is still validated before use."""

from __future__ import annotations

import math

import pytest

from serving.protocol.budget import Budget
from sync.gen import sync_pb2 as pb
from sync.node.subscriber import Subscriber


def deliver(message: pb.Budget) -> list[tuple[str, Budget]]:
    got: list[tuple[str, Budget]] = []
    subscriber = Subscriber.__new__(Subscriber)  # only the budget path: no channel, no store
    subscriber.on_budget = lambda model, budget: got.append((model, budget))
    subscriber._budget(message)
    return got


def test_a_sound_budget_reaches_the_controller() -> None:
    got = deliver(pb.Budget(model="sentiment", controlled=True, rows_per_s=12.5,
                            capacity_rows_s=25.0, share=0.5))
    assert got == [("sentiment", Budget(True, 12.5, 25.0, 0.5))]


@pytest.mark.parametrize("message", [
    pb.Budget(model="../etc", controlled=True, rows_per_s=1.0),
    pb.Budget(model="m", controlled=True, rows_per_s=math.nan),
    pb.Budget(model="m", controlled=True, rows_per_s=-1.0),
    pb.Budget(model="m", controlled=True, rows_per_s=math.inf),
    pb.Budget(model="m", controlled=True, rows_per_s=1.0, share=1.5),
    pb.Budget(model="m", controlled=True, rows_per_s=1.0, capacity_rows_s=1e12),
])
def test_a_malformed_budget_is_ignored(message: pb.Budget) -> None:
    assert deliver(message) == []
