"""The keepalive policy (``serving.protocol.keepalive``): a server built from it permits the
pings a client built from it sends, with margin, so neither side's defaults decide."""

from __future__ import annotations

import pytest

from serving.protocol.keepalive import KEEPALIVE, MAX_PING_STRIKES, Keepalive


@pytest.mark.parametrize("period_ms", [1_000, 2_500, 10_000, 60_000])
def test_a_server_permits_pings_twice_as_often_as_its_clients_send_them(period_ms: int) -> None:
    policy = Keepalive(period_ms=period_ms)
    client, server = dict(policy.client()), dict(policy.server())
    sent = client["grpc.keepalive_time_ms"]
    permitted = server["grpc.http2.min_ping_interval_without_data_ms"]
    assert sent == period_ms
    assert 0 < permitted <= sent // 2


def test_clients_ping_with_no_call_open_and_no_data_and_servers_accept_it() -> None:
    client, server = dict(KEEPALIVE.client()), dict(KEEPALIVE.server())
    assert client["grpc.keepalive_permit_without_calls"] == 1
    assert client["grpc.http2.max_pings_without_data"] == 0  # gRPC's default stops after 2
    assert server["grpc.keepalive_permit_without_calls"] == 1
    assert server["grpc.http2.max_ping_strikes"] == MAX_PING_STRIKES > 0


def test_server_options_are_names_grpc_core_reads() -> None:
    """gRPC ignores unknown keys: the registry once set the C macro's spelling
    (``min_recv_ping_interval_without_data_ms``), and kept the 5-minute default."""
    names = {key for key, _ in KEEPALIVE.pinging_server()}
    assert "grpc.http2.min_recv_ping_interval_without_data_ms" not in names
    assert names == {"grpc.http2.min_ping_interval_without_data_ms",
                     "grpc.http2.max_ping_strikes", "grpc.keepalive_permit_without_calls",
                     "grpc.keepalive_time_ms", "grpc.keepalive_timeout_ms"}


def test_the_fleet_pings_every_10_s_and_gives_up_after_5_s_more() -> None:
    """docs/registry.md and docs/sites.md say so (a cut link is found within 15 s)."""
    assert (KEEPALIVE.period_ms, KEEPALIVE.timeout_ms) == (10_000, 5_000)


@pytest.mark.parametrize(("period_ms", "timeout_ms"), [(1, 5_000), (0, 5_000), (1_000, 0)])
def test_a_policy_without_a_period_or_timeout_is_refused(period_ms: int, timeout_ms: int) -> None:
    with pytest.raises(ValueError, match="keepalive"):
        Keepalive(period_ms=period_ms, timeout_ms=timeout_ms)
