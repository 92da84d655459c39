"""Whether an edge's address answers as the node its catalog entry names: a TLS handshake to
the address, the certificate checked against the fleet CA for that node's own name (the name
nginx checks on each connection, ``upstreams.edge_tls_name``). nginx presents no client
certificate to the edges, and neither does this. Each verdict is cached per (service id,
address, port) for a while (``TTL_S``); a handshake is bounded in time, and one call starts at
most ``max_probes`` of them, all at once."""

from __future__ import annotations

import asyncio
import enum
import ssl
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from .upstreams import edge_tls_name

PROBE_TIMEOUT_S = 1.0  # connect and handshake; no answer by then: SILENT
MAX_PROBES = 16  # handshakes one render may start (they run together)

Key = tuple[str, str, int]  # service id, address (an IP literal), port


class ProbeVerdict(enum.Enum):
    PROVEN = "proven"  # the certificate of this very node, from the fleet CA
    WRONG = "wrong"  # something answered, without proving this node's name (TLS or not)
    SILENT = "silent"  # nothing answered in time: refused, unreachable, timed out


# how long each verdict is trusted: a flood of decoys costs one handshake each per WRONG
# period; a node not listening yet (a new edge, a restart) is asked again soon
TTL_S = {ProbeVerdict.PROVEN: 30.0, ProbeVerdict.WRONG: 15.0, ProbeVerdict.SILENT: 2.0}


def client_context(ca: Path) -> ssl.SSLContext:
    """Verification against the fleet CA alone, the server's name checked; ALPN offers h2 and
    http/1.1 (an edge's gRPC port speaks h2)."""
    context = ssl.create_default_context(cafile=str(ca))
    context.set_alpn_protocols(["h2", "http/1.1"])
    return context


@dataclass
class Prober:
    context: ssl.SSLContext
    timeout_s: float = PROBE_TIMEOUT_S
    max_probes: int = MAX_PROBES
    clock: Callable[[], float] = time.monotonic
    verdicts: dict[Key, tuple[ProbeVerdict, float]] = field(default_factory=dict)  # and when

    def age(self, key: Key) -> float:
        """Seconds since ``key`` was last probed (inf: never)."""
        known = self.verdicts.get(key)
        return float("inf") if known is None else self.clock() - known[1]

    def due(self, key: Key) -> bool:
        known = self.verdicts.get(key)
        return known is None or self.age(key) >= TTL_S[known[0]]

    async def check(self, keys: Iterable[Key],
                    forced: Iterable[Key] = ()) -> dict[Key, ProbeVerdict]:
        """The verdict of each of ``keys`` that has one: cached, or probed now when due or in
        ``forced``. Past ``max_probes``, the forced keys go first, then those last found as
        their node (a refresh), then those never probed, then the oldest verdicts; the rest
        wait for the next call (a key never probed has no verdict yet). Verdicts of keys not
        asked about are forgotten (the memory is the catalog's size)."""
        keys = list(dict.fromkeys(keys))
        forced = set(forced) & set(keys)
        due = [k for k in keys if k in forced or self.due(k)]
        due.sort(key=lambda k: (k not in forced, self._rank(k), -self.age(k)))
        found = await asyncio.gather(*(self.handshake(k) for k in due[:self.max_probes]))
        now = self.clock()
        self.verdicts = {k: self.verdicts[k] for k in keys if k in self.verdicts}
        self.verdicts.update({k: (v, now) for k, v in zip(due[:self.max_probes], found,
                                                                strict=True)})
        return {k: self.verdicts[k][0] for k in keys if k in self.verdicts}

    def _rank(self, key: Key) -> int:
        known = self.verdicts.get(key)
        return 0 if known and known[0] is ProbeVerdict.PROVEN else 1 if known is None else 2

    async def handshake(self, key: Key) -> ProbeVerdict:
        """One TLS handshake with ``key``'s address, checked for its node's name."""
        sid, address, port = key
        name = edge_tls_name(sid)
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(
                address, port, ssl=self.context, server_hostname=name), self.timeout_s)
        except ssl.SSLError:  # a certificate that does not prove ``name``, or not TLS at all
            return ProbeVerdict.WRONG
        except (OSError, TimeoutError):
            return ProbeVerdict.SILENT
        writer.close()  # nothing to ask: closed at once (bounded, then cut)
        try:
            await asyncio.wait_for(writer.wait_closed(), self.timeout_s)
        except (OSError, TimeoutError):
            writer.transport.abort()
        return ProbeVerdict.PROVEN
