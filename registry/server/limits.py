"""Refused calls (missing or wrong token), counted in memory and audited in aggregate.

Auditing each refused call on its own wrote and fsynced one undeletable record per call on the
registry's one database thread: a peer guessing tokens grew the log without bound and slowed
every legitimate call behind it. Here a refusal costs a few dictionary updates on the event
loop. Refusals are tallied per peer host (the ephemeral port stripped), and per interval
``registry serve`` writes **one** ``auth-denied`` record for all of them, on the interval and
at shutdown: the total, the number of distinct hosts, the first and last time, the methods and
the ``top`` hosts by count (each with its count, methods and refusals past the log limit); the
rest are summed in ``others``. One record per interval whatever the number of source addresses
(one record per host let 1,500 loopback addresses write 1,500 records, and an IPv6 /64 holds
more than any cap). Past ``limit`` refusals in an interval a host is no longer logged either,
only counted. At most ``max_peers`` hosts are tallied one by one; the rest share one tally
(``peer: "*"``), and the distinct count goes on as an estimate (linear counting over a fixed
bitmap), so memory stays bounded.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from prometheus_client import Counter

from serving import tasks

log = logging.getLogger(__name__)
OTHERS = "*"  # the tally of hosts beyond max_peers
MAX_METHODS = 16
TOP = 20  # hosts named in an interval's record
BITMAP = 1 << 16  # bits of the distinct-host estimate past max_peers (8 KiB)
MAX_UNWRITTEN = 1_000  # refused-call records (one per interval) kept while the database
# cannot take them
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

    def row(self) -> dict[str, Any]:
        return {"peer": self.peer, "count": self.count, "methods": dict(self.methods),
                "over_limit": self.over_limit}


class Refusals:
    def __init__(self, limit: int, interval_s: float, max_peers: int = 10_000) -> None:
        self.limit, self.interval_s, self.max_peers = limit, interval_s, max_peers
        self._tallies: dict[str, Tally] = {}
        self._bits = bytearray(BITMAP // 8)  # every host seen this interval, hashed

    def _mark(self, host: str) -> None:
        bit = int.from_bytes(hashlib.blake2b(host.encode(), digest_size=4).digest()) % BITMAP
        self._bits[bit // 8] |= 1 << (bit % 8)

    def hosts(self) -> tuple[int, bool]:
        """Distinct hosts this interval, and whether that is an estimate (past max_peers)."""
        named = sum(1 for h in self._tallies if h != OTHERS)
        if OTHERS not in self._tallies:
            return named, False
        zeros = BITMAP - sum(bin(b).count("1") for b in self._bits)
        estimate = BITMAP * math.log(BITMAP / max(zeros, 1))  # linear counting
        return max(named + 1, round(estimate)), True

    def note(self, method: str, peer: str) -> str | None:
        """Count one refused call; what to log about it (None: nothing, it was said already
        in this interval)."""
        host = peer_host(peer)
        self._mark(host)
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
        """The interval's record (one, or none without refusals), and a new interval begins:
        the total, the distinct hosts, the first and last time, the methods (at most
        ``MAX_METHODS``), the ``TOP`` hosts by count and what the others add up to."""
        hosts, estimated = self.hosts()
        tallies, self._tallies = self._tallies, {}
        self._bits = bytearray(BITMAP // 8)
        if not tallies:
            return []
        ranked = sorted(tallies.values(), key=lambda t: (-t.count, t.peer))
        top = [t.row() for t in ranked[:TOP]]
        methods: dict[str, int] = {}
        for t in ranked:
            for method, count in t.methods.items():
                if method in methods or len(methods) < MAX_METHODS:
                    methods[method] = methods.get(method, 0) + count
        total = sum(t.count for t in ranked)
        return [{"count": total, "hosts": hosts, "hosts_estimated": estimated,
                 "first": min(t.first for t in ranked), "last": max(t.last for t in ranked),
                 "methods": methods, "over_limit": sum(t.over_limit for t in ranked),
                 "top": top, "others": total - sum(r["count"] for r in top),
                 "interval_s": self.interval_s}]

    @property
    def pending(self) -> int:
        return sum(t.count for t in self._tallies.values())


class RefusalRecords:
    """Per refused call a counter and at most a log line (``Refusals``); per interval one
    audit record, written by ``write`` off the call path. Rows a failed write left are tried
    again with the next (at most ``MAX_UNWRITTEN`` kept)."""

    def __init__(self, refusals: Refusals, denied: Counter,
                 write: Callable[[list[dict[str, Any]]], Awaitable[object]]) -> None:
        self.refusals, self.denied, self.write = refusals, denied, write
        self._unwritten: list[dict[str, Any]] = []
        self._task: asyncio.Task[None] | None = None

    async def note(self, method: str, peer: str) -> None:
        self.denied.inc()
        said = self.refusals.note(method, peer)
        if said is not None:
            log.warning("%s", said)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.refusals.interval_s)
            await self.flush()

    async def flush(self) -> None:
        rows = (self._unwritten + self.refusals.drain())[-MAX_UNWRITTEN:]
        if not rows:
            return
        try:
            await self.write(rows)
            self._unwritten = []
        except Exception:  # the database is busy or broken: keep them for the next interval
            log.exception("auditing %d refused-call rows failed; retrying", len(rows))
            self._unwritten = rows

    async def stop(self) -> None:
        """The last interval's record, once no call can add to it (after the server stopped)."""
        if self._task is None:
            return
        await tasks.stop(self._task)
        await self.flush()
