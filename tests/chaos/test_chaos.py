"""Chaos replay, bounded: 300 recorded requests (the demo's test split through nginx) replayed
against a real stack (Consul, registry serve, a center, two edges, nginx; the tiny release)
while connections drop, bodies arrive corrupted, edges die every 100 requests, the center dies
once and registry serve dies twice during a publish. The full report: ``python -m bench.chaos``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.chaos.replay import Plan
from harness.chaos.run import Outcome, session, tables
from harness.markdown import table_markdown

pytestmark = [pytest.mark.integration, pytest.mark.slow]
REQUESTS = 300


@pytest.fixture(scope="module")
def outcome(tmp_path_factory: pytest.TempPathFactory, tiny_release: Path,
            tiny_release_b: Path) -> Outcome:
    return session(tmp_path_factory.mktemp("chaos"), tiny_release, tiny_release_b, "tiny",
                   REQUESTS, Plan(concurrency=4))


def test_well_formed_requests_all_answered_and_corrupted_ones_all_refused(
        outcome: Outcome) -> None:
    t = outcome.tally
    print("\n\n".join(table_markdown(table) for table in tables(outcome)))
    assert t.sent == REQUESTS and t.dropped + t.corrupted + t.well_formed == REQUESTS
    assert t.dropped > 0 and t.corrupted > 0
    assert t.server_errors == 0 and t.transport_errors == 0, t.errors
    assert t.ok == t.well_formed, t.errors
    assert t.client_errors == t.corrupted == t.corrupted_4xx, t.errors
    assert t.degraded > 0  # rows answered by the edge alone while the center was dead
    # batches pad differently on replay: a row at the edge of a tie may flip, nothing more
    assert t.comparable > 0 and t.same_as_recorded >= 0.99 * t.comparable


def test_every_killed_part_came_back(outcome: Outcome) -> None:
    kinds = [k.kind for k in outcome.kills]
    assert kinds.count("edge") == REQUESTS // 100
    assert kinds.count("center") == 1 and kinds.count("registry") == 2
    assert all(k.recovered_s is not None for k in outcome.kills), outcome.kills
    assert {e for e in outcome.restarts if e.startswith("edge")} == {"edge-eu-1", "edge-us-1"}


def test_the_registry_killed_during_a_publish_stays_consistent_and_the_fleet_converges(
        outcome: Outcome) -> None:
    assert outcome.publish_error is None
    assert outcome.published_version == 2
    assert outcome.integrity == "ok" and outcome.audit_verified, outcome.audit_output
    assert outcome.fleet_versions == {2}
