"""How many connections a tier's ports may hold under its open files limit
(serving/transport/ports.py)."""

from __future__ import annotations

import resource

import pytest

from serving.transport.ports import GRPC_CEILING, HTTP_CEILING, RESERVE_MIN, caps, raise_nofile


@pytest.mark.parametrize("nofile", [256, 1024, 4096, 20_000, 65_536, 1 << 20])
def test_derived_caps_leave_the_reserve_free(nofile: int) -> None:
    c = caps(nofile)
    assert c.http + c.grpc + max(RESERVE_MIN, nofile // 4) <= max(nofile, 32 + RESERVE_MIN)
    assert 8 <= c.grpc <= GRPC_CEILING
    assert 16 <= c.http <= HTTP_CEILING


def test_the_reviewers_box_20000_descriptors() -> None:
    assert caps(20_000) == caps(20_000, 0, 0)
    assert (caps(20_000).http, caps(20_000).grpc) == (HTTP_CEILING, GRPC_CEILING)


def test_a_cap_set_too_high_is_lowered_to_what_fits() -> None:
    c = caps(1024, http=5000, grpc=5000)
    assert c.http + c.grpc <= 1024 - RESERVE_MIN
    assert caps(1024, http=100, grpc=10) == caps(1024, 100, 10)
    assert (caps(1024, http=100, grpc=10).http, caps(1024, http=100, grpc=10).grpc) == (100, 10)


def test_start_up_raises_the_soft_limit_to_the_hard_one() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 512), hard))
        raised = raise_nofile()
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == raised
        assert raised == hard or hard == resource.RLIM_INFINITY
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
