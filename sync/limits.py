"""Refused calls (missing or wrong token), counted in memory and audited in aggregate.

Auditing each refused call on its own wrote and fsynced one undeletable record per call on the
registry's one database thread: a peer guessing tokens grew the log without bound and slowed
every legitimate call behind it. Here a refusal costs a few dictionary updates on the event
loop. Per peer host (the ephemeral port stripped) and interval, ``registry serve`` writes one
``auth-denied`` record with the count, the methods and the first and last time, on the interval
and at shutdown. Past ``limit`` refusals in an interval a peer is no longer logged either, only
counted. At most ``max_peers`` hosts are tracked per interval; the rest share one row
(``peer: "*"``), so many source addresses cannot grow the table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

OTHERS = "*"  # the row for hosts beyond max_peers
MAX_METHODS = 16
_IPV6 = re.compile(r"ipv6:\[([^\]]*)\](?::\d+)?")
_IPV4 = re.compile(r"ipv4:([^:]*)(?::\d+)?")


def peer_host(peer: str) -> str:
    """``ipv4:10.0.0.5:53412`` -> ``10.0.0.5``, ``ipv6:[::1]:53412`` -> ``::1``; anything else
    (``unix:...``) as it is, at most 128 characters."""
    for pattern in (_IPV6, _IPV4):
        match = pattern.fullmatch(peer)
        if match:
            return match.group(1)
    return peer[:128]


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


@dataclass
class Tally:
    peer: str
    first: str
    last: str
    count: int = 0
    over_limit: int = 0  # refusals past the limit: counted, not logged
    methods: dict[str, int] = field(default_factory=dict)

    def row(self, interval_s: float) -> dict[str, Any]:
        return {"peer": self.peer, "count": self.count, "methods": dict(self.methods),
                "first": self.first, "last": self.last, "over_limit": self.over_limit,
                "interval_s": interval_s}


class Refusals:
    def __init__(self, limit: int, interval_s: float, max_peers: int = 10_000) -> None:
        self.limit, self.interval_s, self.max_peers = limit, interval_s, max_peers
        self._tallies: dict[str, Tally] = {}

    def note(self, method: str, peer: str) -> str | None:
        """Count one refused call; what to log about it (None: nothing, it was said already
        in this interval)."""
        host = peer_host(peer)
        if host not in self._tallies and len(self._tallies) >= self.max_peers:
            host = OTHERS
        at = _now()
        tally = self._tallies.get(host)
        if tally is None:
            tally = self._tallies[host] = Tally(host, at, at)
        tally.count += 1
        tally.last = at
        if tally.count > self.limit:
            tally.over_limit += 1
            if tally.over_limit > 1:
                return None  # the cheap path: a counter, nothing else
            return (f"peer {host} passed {self.limit} refused calls in {self.interval_s:g} s; "
                    f"further ones this interval are only counted")
        if method in tally.methods or len(tally.methods) < MAX_METHODS:
            tally.methods[method] = tally.methods.get(method, 0) + 1
        if tally.count == 1:
            return f"refused {method} from {peer}: missing or wrong token"
        return None

    def drain(self) -> list[dict[str, Any]]:
        """The interval's rows (one per peer host), and a new interval begins."""
        tallies, self._tallies = self._tallies, {}
        return [t.row(self.interval_s) for t in tallies.values()]

    @property
    def pending(self) -> int:
        return sum(t.count for t in self._tallies.values())
