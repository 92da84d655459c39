"""The gRPC keepalive policy both ends of a long-lived channel share: the nodes' Sync streams
to the registry, a standby's replication stream, the tiers' V2 servers.

A client pings every ``period_ms`` whether or not a call is open or data flows, and gives up on
the connection after ``timeout_ms`` without an answer. A server permits a ping without data
every ``period_ms // 2`` (half the client's period: margin for timers that fire early or a
delayed ping that arrives just after the next); a client that pings more often collects a
strike per early ping, and after ``MAX_PING_STRIKES`` the server closes its connection with a
GOAWAY (``ENHANCE_YOUR_CALM``, ``too_many_pings``). gRPC's own server default permits one ping
per 5 minutes, which cut every idle 10 s stream after its third ping.

Both sides' options are built from one ``Keepalive`` so they cannot drift apart. Unknown keys
are silently ignored by gRPC: the option names here are gRPC core's (the server's
``GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS`` is spelled
``grpc.http2.min_ping_interval_without_data_ms``).
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_PING_STRIKES = 2  # gRPC's default, stated: early pings a server forgives before its GOAWAY
Options = list[tuple[str, int]]


@dataclass(frozen=True)
class Keepalive:
    """One client ping period and what each side makes of it."""

    period_ms: int = 10_000
    timeout_ms: int = 5_000

    def __post_init__(self) -> None:
        if self.period_ms < 2 or self.timeout_ms < 1:
            raise ValueError(f"a keepalive needs a period of 2 ms or more and a timeout: "
                             f"{self.period_ms} ms, {self.timeout_ms} ms")

    @property
    def permitted_ms(self) -> int:
        """The shortest interval between pings without data a server accepts."""
        return self.period_ms // 2

    def client(self) -> Options:
        """A channel's options: ping every period, with or without calls or data."""
        return [("grpc.keepalive_time_ms", self.period_ms),
                ("grpc.keepalive_timeout_ms", self.timeout_ms),
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.http2.max_pings_without_data", 0)]  # 0: no cap (default 2)

    def server(self) -> Options:
        """A server's options: accept this policy's clients' pings, calls open or not."""
        return [("grpc.http2.min_ping_interval_without_data_ms", self.permitted_ms),
                ("grpc.http2.max_ping_strikes", MAX_PING_STRIKES),
                ("grpc.keepalive_permit_without_calls", 1)]

    def pinging_server(self) -> Options:
        """``server()``, and the server pings its clients too (every period, the same
        timeout): it finds a peer that vanished without closing its connection."""
        return [*self.server(), ("grpc.keepalive_time_ms", self.period_ms),
                ("grpc.keepalive_timeout_ms", self.timeout_ms)]


KEEPALIVE = Keepalive()
"""The fleet's policy: a client pings every 10 s, a server permits a ping every 5 s."""
