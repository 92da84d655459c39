"""Audit witnesses: the chain's head, signed and told to every node, and the heads nodes show
back at hello, checked against the chain (``registry.trust.witness_check``): a registry that
later loses records meets the nodes that were told of them. In a group only heads a standby
holds are told (``registry.ha.witness_gate``): a failover must not look like a rewrite."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from registry.fleet import nodes
from registry.ha.witness_gate import WitnessGate
from registry.server.metrics import SyncMetrics
from registry.store.chain import Head
from registry.store.db import read
from registry.trust import witness_check
from sync.gen import sync_pb2 as pb

if TYPE_CHECKING:
    from registry.server.metadata import TrustMetadata
    from registry.server.session import Database, Session, WriteBehind

log = logging.getLogger(__name__)


class WitnessTeller:
    def __init__(self, db: Database, metrics: SyncMetrics, sessions: dict[str, Session],
                 writes: WriteBehind, metadata: TrustMetadata) -> None:
        self.db, self.metrics, self.sessions = db, metrics, sessions
        self.writes, self.metadata = writes, metadata
        self.told: pb.ServerMessage | None = None  # the chain's head as last told (signed)
        self.gate = WitnessGate(db.settings.sync_standbys)

    def due(self) -> Head | None:
        """On the database thread: the newest head that may be told now (in a group, one a
        standby holds; None: none)."""
        with read(self.db.catalog.db) as conn:
            return self.gate.due(conn)

    def tell(self, head: Head) -> None:
        """Sign ``head`` once and queue it to every connected node (and to those that connect
        later, until the next)."""
        self.told = pb.ServerMessage(witness=witness_check.sign(self.metadata.signer, head))
        for session in list(self.sessions.values()):
            session.outbox.put_nowait(self.told)

    def send(self, session: Session) -> None:
        """Queue the head as last told to a node that has just connected."""
        if self.told is not None:
            session.outbox.put_nowait(self.told)

    async def shown(self, session: Session, message: pb.Witness) -> None:
        """A node shows the newest witness it was told: believed once this registry's own key
        verifies it, kept, and checked against the chain."""
        signers = [s for s in (self.metadata.director, self.db.anchor.signer) if s is not None]
        seen = witness_check.verified(message, [s.key.public_key() for s in signers])
        if seen is None:
            log.warning("node %s showed an audit witness this registry did not sign; ignored",
                        session.node.node_id)
            return
        self.writes.add(nodes.witnessed(session.node.node_id, seen.seq, seen.hash))
        problem = await self.db.run(lambda: witness_check.conflict(
            self.db.catalog.db.conn, seen, f"node {session.node.node_id}"))
        if problem is not None:
            self.metrics.witness_conflicts.inc()
            log.error("the audit chain lost records: %s", problem)
