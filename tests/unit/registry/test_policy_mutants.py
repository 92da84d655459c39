"""A wave rollout's policy (``registry.releases.policy``): ``registry publish --waves 1%,...``
and the ``--wave-*`` bounds, checked before anything is written. Each bound is accepted at its
edge and refused just past it, with the message naming the setting and its range; the waves
are 1 to 20 growing shares ending at 100%; the pace grows by ``growth`` each wave."""

from __future__ import annotations

import math

import pytest

from registry.errors import RegistryError
from registry.releases.policy import MAX_WAVES, WavePolicy, parse_waves

BOUNDS = [("pace", 0, 1e9), ("growth", 1, 1000), ("bake_s", 0, 7 * 86400),
          ("install_timeout_s", 1, 7 * 86400), ("max_failures", 0, 1),
          ("max_agreement_drop", 0, 1), ("min_audit_rows", 1, 10**9),
          ("min_audit_nodes", 1, 1000), ("max_drift_share", 0, 1), ("max_p99_ratio", 1, 1000)]


def policy(**values: float) -> WavePolicy:
    return WavePolicy((0.1, 1.0), **values)  # type: ignore[arg-type]


@pytest.mark.parametrize(("name", "low", "high"), BOUNDS)
def test_each_bound_is_accepted_at_its_edges_and_refused_just_past_them(
        name: str, low: float, high: float) -> None:
    integer = name.startswith("min_")
    step = 1 if integer else max(abs(high) * 1e-9, 1e-6)
    for value in (low, high):
        assert getattr(policy(**{name: value}).check(), name) == value
    for value in (low - step, high + step, float("nan"), float("inf")):
        if integer and not math.isfinite(value):
            continue  # an integer setting is never NaN or infinite
        with pytest.raises(RegistryError) as refused:
            policy(**{name: value}).check()
        assert str(refused.value) == f"rollout {name} must be within [{low}, {high}], " \
                                     f"not {value!r}"


def test_the_defaults_are_a_valid_policy() -> None:
    p = WavePolicy((0.01, 0.1, 0.5, 1.0)).check()
    assert (p.pace, p.growth, p.bake_s, p.install_timeout_s, p.max_failures,
            p.max_agreement_drop, p.min_audit_rows, p.min_audit_nodes, p.max_drift_share,
            p.max_p99_ratio) == (0.0, 2.0, 300.0, 900.0, 0.1, 0.02, 200, 3, 0.25, 2.0)


def test_a_rollout_has_one_to_twenty_waves() -> None:
    assert MAX_WAVES == 20
    assert WavePolicy((1.0,)).check().waves == (1.0,)
    twenty = tuple((i + 1) / 20 for i in range(20))
    assert WavePolicy(twenty).check().waves[-1] == 1.0
    twenty_one = (*((i + 1) / 21 for i in range(20)), 1.0)
    with pytest.raises(RegistryError, match=r"^a rollout has 1 to 20 waves, not 21$"):
        WavePolicy(twenty_one).check()
    with pytest.raises(RegistryError, match=r"^a rollout has 1 to 20 waves, not 0$"):
        WavePolicy(()).check()


@pytest.mark.parametrize("shares", [(0.5, 1.5), (0.0, 1.0), (-0.1, 1.0), (0.5, 0.5, 1.0),
                                    (0.6, 0.5, 1.0)])
def test_wave_shares_must_grow_each_above_0_and_at_most_100_percent(
        shares: tuple[float, ...]) -> None:
    with pytest.raises(RegistryError) as refused:
        WavePolicy(shares).check()
    assert str(refused.value) == "wave shares must grow, each above 0% and at most 100%"


def test_the_last_wave_must_reach_every_edge() -> None:
    with pytest.raises(RegistryError) as refused:
        WavePolicy((0.1, 0.9)).check()
    assert str(refused.value) == "the last wave must be 100% (every edge)"


def test_the_pace_is_multiplied_by_growth_for_each_following_wave() -> None:
    p = WavePolicy((0.1, 0.5, 1.0), pace=6, growth=3)
    assert [p.rate(w) for w in range(3)] == [6, 18, 54]
    assert WavePolicy((1.0,)).rate(2) == 0  # no pace: every wave at once


def test_wave_percentages_parse_with_decimals_and_spaces_and_anything_else_is_refused() -> None:
    assert parse_waves(" 2.5% ,100%") == (0.025, 1.0)
    with pytest.raises(RegistryError) as refused:
        parse_waves("5%,all")
    assert str(refused.value) == ("invalid wave 'all': give percentages of the edges, e.g. "
                                  "--waves 1%,10%,50%,100%")
