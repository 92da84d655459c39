"""The TUF metadata as nodes are sent it: kept fresh by the registry that may write (root 1 on a
registry from before TUF; snapshot and timestamp signed with the online key), and queued to
each connected node when it changed since that node was last sent it."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from registry.errors import NotPrimary
from registry.settings import RegistrySettings
from registry.trust import keys, tuf
from sync.gen import sync_pb2 as pb

if TYPE_CHECKING:
    from registry.server.session import Database, Session

log = logging.getLogger(__name__)


class TrustMetadata:
    def __init__(self, settings: RegistrySettings, db: Database,
                 sessions: dict[str, Session]) -> None:
        self.settings, self.db, self.sessions = settings, db, sessions
        self.published: tuf.Published | None = None  # TUF metadata as nodes are sent it
        self.director: keys.Signer | None = None  # signs directives: the online key
        self._frozen = ""  # why the timestamp cannot be advanced (logged once per reason)
        self._messages_for: tuf.Published | None = None  # what _messages were made of
        self._messages: dict[tuple[int, bool, bool], pb.ServerMessage] = {}

    @property
    def signer(self) -> keys.Signer:
        """What signs directives and witnesses: the online key, else the anchor's."""
        return self.director or self.db.anchor.signer

    async def advance(self, signing: bool) -> bool:
        """Sign what the metadata needs (when ``signing``: a standby, or a registry whose
        online key is not root's, serves what is stored) and send nodes what changed. True when
        releases gained or lost their signatures: the caller pushes again."""
        settings = self.settings
        try:
            director = await self.db.run(keys.online_signer, settings)
            self.director = director
            if signing:
                publisher = await self.db.run(keys.signer, settings)
                db = self.db.catalog.db
                await self.db.run(tuf.ensure, db, publisher, director.key.public_key())
                await self.db.run(tuf.advance, db, director, settings.timestamp_expiry_s)
            if self._frozen:
                log.info("TUF timestamp advancing again")
            self._frozen = ""
        except NotPrimary:
            pass
        except tuf.Frozen as exc:
            if str(exc) != self._frozen:
                log.error("cannot advance the TUF timestamp: %s; nodes flag this registry "
                          "stale when the timestamp they hold expires", exc)
            self._frozen = str(exc)
        except Exception:  # a bad key file or a busy database: serve what is stored, retry
            log.exception("signing the TUF metadata failed; retrying")
        published = await self.db.run(tuf.published, self.db.catalog.db)
        before, self.published = self.published, published
        if published is not None and (before is None or before.timestamp_version !=
                                      published.timestamp_version or before.roots !=
                                      published.roots or before.targets != published.targets):
            self.send_all()
            return before is not None and before.trusted != published.trusted
        return False

    def send(self, session: Session) -> None:
        """Queue the metadata for this node when it changed since it was last sent: roots
        newer than the node's, the timestamp, and snapshot and targets when they changed."""
        published = self.published
        if published is None:
            return
        now = (published.timestamp_version, published.snapshot_sha, published.targets_sha)
        last = session.trust_sent
        if last == now:
            return
        # one message per kind of node, shared by their outboxes (a targets listing every
        # release is large: not a copy per node)
        kind = (session.root_version, last[1] != now[1], last[2] != now[2])
        message = self._messages.get(kind)
        if message is None or self._messages_for is not published:
            if self._messages_for is not published:
                self._messages.clear()
                self._messages_for = published
            message = self._messages[kind] = pb.ServerMessage(trust=pb.Trust(
                roots=published.roots_after(session.root_version),
                timestamp=published.timestamp,
                snapshot=published.snapshot if kind[1] else b"",
                targets=published.targets if kind[2] else b""))
        session.trust_sent = now
        if published.roots:
            session.root_version = max(session.root_version, published.roots[-1][0])
        session.outbox.put_nowait(message)

    def send_all(self) -> None:
        for session in list(self.sessions.values()):
            self.send(session)
