"""bench.tiers's verdict on the edge server as a share of the model's limit: each goal judged
against the limit measured around its own runs, just inside and just outside each bound."""

from __future__ import annotations

import pytest

from bench.harness import Counters, Usage
from bench.tier_runs import Run
from bench.tiers import GOALS, Measured, Raw, share_line, share_table
from harness.load import Load

LIMIT = 1000.0  # rows/s, the mean of the limits measured before and after


def run(concurrency: int, rps: float) -> Run:
    return Run("edge", "on", concurrency, Load(round(rps * 10), 10.0, 5.0, 9.0, 5.5, 0),
               Counters(), Usage(1.9, 0.0))


def configs(shares: dict[tuple[str, int], float]) -> list[Measured]:
    """Both configurations at concurrency 1, 8 and 32, each at ``shares`` of the limit (the
    limit measured at 900 before and 1,100 after: their mean is what counts)."""
    return [Measured(name, [run(c, LIMIT * shares.get((name, c), 0.5)) for c in (1, 8, 32)],
                     (900.0, 1100.0)) for name in ("one process", "--workers 2")]


def test_the_goals_are_the_issues() -> None:
    assert GOALS == {("one process", 32): 0.80, ("--workers 2", 8): 0.80,
                     ("--workers 2", 32): 0.90}


def test_every_goal_just_met_is_met() -> None:
    line = share_line(configs({key: goal + 0.001 for key, goal in GOALS.items()}))
    assert "all met" in line and "missed" not in line
    assert "--workers 2 c=32: 90% (goal 90%)" in line


@pytest.mark.parametrize("short", sorted(GOALS))
def test_one_goal_just_missed_is_missed(short: tuple[str, int]) -> None:
    shares = {key: goal + 0.001 for key, goal in GOALS.items()}
    shares[short] = GOALS[short] - 0.002
    assert "1 missed" in share_line(configs(shares))


def test_the_share_is_taken_against_the_mean_of_the_limits_around_the_runs() -> None:
    measured = configs({("one process", 32): 0.8})[0]
    assert measured.limit == LIMIT
    # 800 req/s over the limit measured before alone (900) would be 89%; over the mean, 80%
    assert "one process c=32: 80%" in share_line([measured])


def test_the_table_has_a_row_per_run_with_its_share() -> None:
    table = share_table(configs({("--workers 2", 32): 0.95}),
                        Raw("edge", 1, 500.0, 2.0, 30.0, 0.0))
    assert table.row_count == 6
    shares = list(table.columns[4].cells)
    assert shares[-1] == "95%" and shares[0] == "50%"
