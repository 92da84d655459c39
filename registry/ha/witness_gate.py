"""Which audit head the primary of a group may tell the nodes (``registry.server.witness_teller``):
only one a standby holds.

A node keeps the newest head it was told and shows it at every hello; ``registry audit
--verify`` fails with "the chain was rewritten" when the chain holds another record there. A
primary that told the nodes a head its standby never received (the write committed, the
primary paused before the standby acked it, the standby took over and wrote its own record at
that seq) made a benign failover look like tampering. So in a group a head is told only once
``max(1, REGISTRY_SYNC_STANDBYS)`` standbys hold it: the point at which a semi-synchronous
write is acknowledged, and the newest history the election can pick (it prefers the longest).
A standalone registry has no standby to lose records to and tells its head at once, as before.

Each tick reads the head together with the newest change id in one read transaction: a
standby that acked that id holds that head (it applies whole transactions in order, or a
snapshot taken after it). Heads read while no standby had them wait here, newest last, until
one is held; the newest held is told and the older ones are dropped with it, and told only
while the chain still holds it (a registry demoted, its database replaced by a snapshot and
promoted again in the same process must not tell a head of its old history).
"""

from __future__ import annotations

import sqlite3
from collections import deque
from dataclasses import dataclass

from registry.ha import changes
from registry.store import chain, role
from registry.store.chain import Head

KEEP = 64  # heads waiting for a standby; beyond, the oldest are dropped (a newer one is told
# once a standby catches up with it, which covers them)


@dataclass(frozen=True)
class Candidate:
    head: Head
    position: int  # the newest change when the head was read: a standby holding it holds head


class WitnessGate:
    """The heads read on this registry, held back until a standby holds them."""

    def __init__(self, sync_standbys: int) -> None:
        self.wanted = max(1, sync_standbys)
        self.waiting: deque[Candidate] = deque(maxlen=KEEP)

    def due(self, conn: sqlite3.Connection) -> Head | None:
        """The newest head that may be told now (None: none yet, or this registry is a
        standby). Call inside a read transaction: the head and the position must be one
        snapshot."""
        state = role.state(conn)
        head = chain.head(conn)
        if state.role == "standalone" or head is None:
            self.waiting.clear()
            return head
        if state.role != "primary":  # a standby tells nothing; its primary does
            self.waiting.clear()
            return None
        if not self.waiting or self.waiting[-1].head != head:
            self.waiting.append(Candidate(head, changes.position(conn)))
        return self._held(conn)

    def _held(self, conn: sqlite3.Connection) -> Head | None:
        """The newest waiting head ``wanted`` standbys hold, dropped with every older one."""
        for i in range(len(self.waiting) - 1, -1, -1):
            candidate = self.waiting[i]
            if len(changes.standbys_at(conn, candidate.position)) >= self.wanted:
                for _ in range(i + 1):
                    self.waiting.popleft()
                held = chain.hash_at(conn, candidate.head.seq) == candidate.head.hash
                return candidate.head if held else None
        return None
