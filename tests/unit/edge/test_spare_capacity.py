"""A center with spare capacity never causes a shed row (issue 58): rows above the controller's
accuracy floor only spend spare capacity, so when the budget has no room for them the edge
answers them as any confident row; only rows below the floor (or below a client's own
threshold) come back ``edge-shed``, and only when the budget has no token for them. Driven as
the edge's pipeline drives the controller, on a fake clock, with chosen confidences: the same
rows are needed or spare on every machine."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edge.controller import RESERVE, Controller, TokenBucket
from serving.protocol.budget import Budget
from tests.unit.edge.test_controller import Clock, controller
from tests.unit.edge.test_pipeline import (
    GradedBatcher,
    center_naming,
    edge,
    infer,
    outputs,
    parsed,
    resident,
)

FLOOR = 0.62  # CALIBRATION's floor at the default tolerance (0.01)
BELOW = np.linspace(0.55, 0.61, 20)  # 20 rows the accuracy floor needs at the center
ABOVE = np.linspace(0.63, 0.99, 180)  # 180 rows the edge may answer


def request() -> np.ndarray:
    """200 rows as a batched client sends them: 10% under the floor, shuffled."""
    return np.random.default_rng(0).permutation(np.concatenate([BELOW, ABOVE]))


def send(c: Controller, confidence: np.ndarray) -> tuple[list[int], list[int], float]:
    """One request through the gate, as edge.pipeline does: (escalated, shed, threshold)."""
    c.observe(confidence)
    threshold = c.threshold()
    unsure = np.flatnonzero(confidence < threshold).tolist() if threshold < 1 else \
        list(range(len(confidence)))
    went, shed = c.admit(confidence, unsure, min(threshold, c.floor))
    return went, shed, threshold


def singles(c: Controller, clock: Clock, seconds: float, rows_per_s: float) -> None:
    """Light traffic of one row per request: the controller learns the rate and the rows."""
    rng = np.random.default_rng(1)
    for _ in range(int(seconds * rows_per_s)):
        send(c, 0.5 + 0.5 * rng.beta(2.0, 1.2, 1))
        clock.now += 1 / rows_per_s


def test_an_idle_center_sheds_no_row_of_200_row_requests_and_gets_every_row_below_the_floor(
        ) -> None:
    clock = Clock()
    c = controller(clock)
    c.set_budget(Budget(True, rows_per_s=50.0))  # the user's edge had about 66
    singles(c, clock, 30, 2)
    assert c.floor == FLOOR and c.threshold() == 1.0  # spare capacity: center-only
    rows = request()
    for _ in range(6):  # a 200-row request every 10 s: 20 rows/s, under half the budget
        went, shed, threshold = send(c, rows)
        assert shed == []
        assert set(np.flatnonzero(rows < FLOOR)) <= set(went)  # every needed row escalates
        assert len(went) < 200  # the budget holds: more rows wanted the center than it has
        clock.now += 10
    assert threshold == 1.0  # the controller kept asking for every row: they were spare


def test_requests_at_the_same_instant_leave_each_other_their_rows_below_the_floor() -> None:
    """The first request's spare rows stop at the reserve (half the bucket of 60): the second
    one's 20 needed rows find their tokens. Without the reserve the first would take all 60."""
    clock = Clock()
    c = controller(clock)
    c.set_budget(Budget(True, rows_per_s=60.0))
    singles(c, clock, 30, 2)
    first, shed_first, _ = send(c, request())
    second, shed_second, _ = send(c, request())
    assert (len(first), len(second), shed_first, shed_second) == (30, 20, [], [])
    third, shed_third, _ = send(c, request())  # 10 tokens left: the center is full now
    assert len(third) == len(shed_third) == 10


@pytest.mark.parametrize(("budget", "shed_per_request"), [(20.0, 0), (19.0, 1)])
def test_rows_below_the_floor_are_shed_only_beyond_the_burst(budget: float,
                                                               shed_per_request: int) -> None:
    """20 needed rows every 2 s (10 rows/s): a budget of 20 rows/s holds a burst of 20 and
    takes them all; at 19 the 20th of each request has no token (the least confident go)."""
    clock = Clock()
    c = controller(clock)
    c.set_budget(Budget(True, rows_per_s=budget))
    singles(c, clock, 30, 1)
    rows = request()
    for _ in range(10):
        clock.now += 2
        went, shed, _ = send(c, rows)
        assert len(shed) == shed_per_request and len(went) == 20 - shed_per_request
        assert all(rows[j] >= rows[i] for j in shed for i in went)  # least confident first


def test_a_center_at_its_capacity_still_sheds_and_escalations_stay_within_the_budget() -> None:
    clock = Clock()
    c = controller(clock)
    c.set_budget(Budget(True, rows_per_s=5.0))
    rows, escalated, shed = request(), 0, 0
    start = clock.now
    for _ in range(30):  # 200 rows every 2 s: 10 rows/s below the floor, twice the budget
        went, dropped, threshold = send(c, rows)
        escalated, shed = escalated + len(went), shed + len(dropped)
        clock.now += 2
    assert threshold == FLOOR  # nothing spare: the floor
    assert escalated <= 5.0 * (clock.now - start) + 5  # the budget, plus one burst
    assert shed >= 30 * 20 - escalated > 0


def test_spare_rows_leave_the_reserve_and_needed_rows_may_take_it() -> None:
    clock = Clock()
    bucket = TokenBucket(1.0, clock)
    bucket.set_budget(Budget(True, rows_per_s=60.0))  # full: 60 tokens, 30 of them reserved
    assert RESERVE == 0.5
    assert bucket.admit(0, 31) == (0, 30)  # down to the reserve, not one further
    assert bucket.admit(0, 1) == (0, 0)
    assert bucket.admit(31, 0) == (30, 0)  # needed rows take the reserve too
    clock.now += 0.02  # 1.2 tokens back: a needed row may have one, a spare row not
    assert bucket.admit(0, 1) == (0, 0) and bucket.admit(1, 1) == (1, 0)


@pytest.mark.parametrize(("rows_per_s", "spare"), [(1.0, 1), (2.0, 1), (4.0, 2)])
def test_a_tiny_budget_keeps_a_whole_token_of_reserve_at_most_half(rows_per_s: float,
                                                                   spare: int) -> None:
    """A bucket of one token reserves none (spare rows still reach an idle center); of two,
    one; of four, two."""
    bucket = TokenBucket(1.0, Clock())
    bucket.set_budget(Budget(True, rows_per_s=rows_per_s))
    assert bucket.admit(0, 10) == (0, spare)


def test_without_a_budget_every_unsure_row_escalates() -> None:
    c = controller(Clock())
    rows = request()
    assert c.admit(rows, list(range(200)), FLOOR) == (list(range(200)), [])


def test_the_edge_answers_spare_rows_the_budget_has_no_room_for_never_marked_shed(
        tmp_path: Path) -> None:
    """Through the pipeline: the release has no curve, so its floor is its threshold 0.9; a
    light earlier traffic puts the controller at 1 (center-only). Confidences 0.9933 (token
    500: spare), 0.525 (10) and 0.599 (40) (below the floor: needed). The bucket holds 6."""
    calls: list[list[int]] = []
    service = edge(tmp_path, center_naming(calls), cache_size=0)
    r = resident(GradedBatcher())
    clock = Clock()
    service.policy.controllers["sentiment"] = c = Controller(
        r.manifest.calibration, floor_tolerance=0.01, window=2000, horizon_s=5.0, target=0.9,
        burst_s=0.06, clock=clock)
    service.policy.set_budget("sentiment", Budget(True, rows_per_s=100.0))
    c.observe(np.full(60, 0.99))
    clock.now += 5  # 12 rows/s seen against a budget of 100
    answer = infer(service, r, parsed(500, 10, 500, 40, 500, 500, 500, 500))
    out = outputs(answer)
    # 2 needed rows take 2 tokens, one spare row the one above the reserve of 3
    assert out["tier"] == ["center", "center", "edge", "center", "edge", "edge", "edge", "edge"]
    assert calls == [[500, 10, 40]]
    assert answer.parameters["threshold"] == 1.0
    assert (answer.parameters["escalated"], answer.parameters["shed"]) == (3, 0)
    assert out["confidence"][2] == pytest.approx(0.9933, abs=1e-3)  # the edge's own answer
    follow = outputs(infer(service, r, parsed(10, 40, 10, 500)))  # the 3 reserved tokens
    assert follow["tier"] == ["center", "center", "center", "edge"]
    spent = infer(service, r, parsed(10, 500))  # no token left: the needed row is shed
    assert outputs(spent)["tier"] == ["edge-shed", "edge"] and spent.parameters["shed"] == 1
    assert service.stats.rows_by_tier.labels("sentiment", "3", "edge-shed")._value.get() == 1
