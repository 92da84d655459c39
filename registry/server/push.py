"""Which releases each connected node's stream is sent: once per version, each with a directive
signed for that node, and only once its targets metadata holds enough publisher signatures; and
which retired models it is told to unload (those it holds, once per stream)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from registry.releases.plan import Target
from registry.server.metrics import SyncMetrics
from registry.store.chain import Head
from sync.gen import sync_pb2 as pb
from sync.wire import directive, retire

if TYPE_CHECKING:
    from registry.server.metadata import TrustMetadata
    from registry.server.session import Database, Session

log = logging.getLogger(__name__)


class Pusher:
    def __init__(self, db: Database, metrics: SyncMetrics, sessions: dict[str, Session],
                 metadata: TrustMetadata) -> None:
        self.db, self.metrics, self.sessions, self.metadata = db, metrics, sessions, metadata
        self._held_back: set[tuple[str, int]] = set()  # releases awaiting signatures, logged

    async def push(self, session: Session) -> None:
        """Queue every release whose desired version changed for this node since last time."""
        desired = await self.db.run(self.db.desired, [session.node])
        self._queue(session, desired.targets[0], desired.head)
        self._retire(session, desired.retired, desired.head)

    async def push_all(self) -> None:
        """After a change: every node's desired releases in one database call, then queued."""
        sessions = list(self.sessions.values())
        desired = await self.db.run(self.db.desired, [s.node for s in sessions])
        for session, targets in zip(sessions, desired.targets, strict=True):
            self._queue(session, targets, desired.head)
            self._retire(session, desired.retired, desired.head)

    def _queue(self, session: Session, targets: list[Target], head: Head | None) -> None:
        published = self.metadata.published
        waiting = published.waiting if published is not None else set()
        for t in targets:
            if session.sent.get(t.model) == t.version:
                continue
            if (t.model, t.version) in waiting:  # pushed once it has enough signatures
                if (t.model, t.version) not in self._held_back:
                    self._held_back.add((t.model, t.version))
                    log.warning("%s version %s awaits publisher signatures (`registry sign`): "
                                "not pushed until its targets metadata is complete", t.model,
                                t.version)
                continue
            session.sent[t.model] = t.version
            session.holds.add(t.model)
            session.retiring.pop(t.model, None)
            if session.active.pop(t.model, None) == t.version:
                continue  # it already serves that version
            release = pb.Release(model=t.model, version=t.version, alias=t.alias,
                                 manifest=t.manifest, manifest_sha256=t.manifest_sha256,
                                 signature=t.signature, signing_key_id=t.key_id)
            if head is not None:  # there is always one: a desired release was audited
                release.directive, release.directive_signature = directive.sign(
                    self.metadata.signer, directive.Directive(
                        session.node.node_id, t.model, t.version, t.manifest_sha256, head.seq,
                        head.hash))
                session.seqs[t.model] = head.seq
            session.outbox.put_nowait(pb.ServerMessage(release=release))
            self.metrics.pushes.inc()
            log.info("pushing %s version %s (%s) to %s", t.model, t.version, t.alias,
                     session.node.node_id)

    def _retire(self, session: Session, retired: dict[str, int], head: Head | None) -> None:
        """Tell the node to unload each retired model it holds, with a retire directive signed
        for it (``sync.wire.retire``): once per model and stream."""
        if head is None:  # there is always one: a retirement was audited
            return
        for model in sorted(session.holds & retired.keys()):
            version = session.sent.pop(model, None) or session.active.pop(model, None) or \
                retired[model]
            session.holds.discard(model)
            session.retiring[model] = version
            session.seqs[model] = head.seq
            data, signature = retire.sign(self.metadata.signer, retire.RetireDirective(
                session.node.node_id, model, head.seq, head.hash))
            session.outbox.put_nowait(pb.ServerMessage(retire=pb.Retire(
                model=model, version=version, directive=data, directive_signature=signature)))
            log.info("telling %s to retire %s (it holds version %s)", session.node.node_id,
                     model, version)
