"""Models, versions, aliases and rollouts in SQLite; every change audited in its transaction."""

from __future__ import annotations

import sqlite_utils

from registry.releases import aliases, new_version, retire, signatures, waves
from registry.releases.plan import Plan, RolloutNode, Target, read_plan
from registry.releases.reads import CatalogReads
from registry.trust import tuf
from registry.trust.anchor import Anchor, audited
from registry.trust.keys import Signer
from serving.release.manifest import Manifest


class Catalog(CatalogReads):
    """The registry's models, versions, aliases and rollouts: the reads (``CatalogReads``), what
    each node should run (``registry.releases.plan``) and each change (publish, sign, promote,
    rollback), made in one audited transaction by its own module (``new_version``,
    ``signatures``, ``aliases``). Callers hold one catalog per database."""

    def __init__(self, db: sqlite_utils.Database, actor: str,
                 anchor: Anchor | None = None) -> None:
        """``anchor``: where the signed audit head is moved after each change (None: not)."""
        super().__init__(db)
        self.actor = actor
        self.anchor = anchor

    def plan(self) -> Plan:
        """What every node should run, per model (read once for many nodes)."""
        return read_plan(self)

    def desired(self, node: RolloutNode) -> list[Target]:
        """Per model, what ``node`` should run: the canary if its rollout targets the node, the
        version of a wave rollout that admitted it, else production. Models with none of these
        for this node are left out."""
        return self.plan().desired(node)

    def create_version(self, manifest: Manifest, canary: list[str] | None = None,
                       signer: Signer | None = None,
                       rollout: waves.WavePolicy | None = None) -> int:
        """Record version N+1 with its artifacts, aliases, rollout, signature and audit record,
        atomically.

        The artifacts must already be in the blob store. ``signer`` signs the stored manifest
        bytes (they carry the version number, so this happens under the write lock).

        ``manifest.version`` is ignored: the number is assigned under the write lock, so
        concurrent publishers get consecutive versions. ``rollout``: roll it out in waves
        (``registry.releases.waves``) instead of pointing an alias at it; any other publish ends
        the model's unfinished wave rollout.
        """
        new_version.check_request(manifest, canary, rollout)
        with audited(self.db, self.anchor) as conn:
            return new_version.create_version(conn, self, self.actor, manifest, canary, signer,
                                              rollout)

    def sign(self, model: str, signer: Signer,
             version: int | None = None) -> tuple[list[int], tuf.Signed | None]:
        """Sign VERSION (default: every unsigned version) of a model published before signing
        existed, listing each in the TUF targets; and add this publisher's signature to the
        targets version awaiting signatures when it holds the model (k-of-n publishing). Each
        signature is audited (actions ``sign``, ``sign-targets``). Signed versions are
        immutable. Returns the versions signed and the targets verdict (None: none awaited)."""
        with audited(self.db, self.anchor) as conn:
            return signatures.sign(conn, self, self.actor, model, signer, version)

    def promote(self, model: str, version: int | None = None) -> int:
        """Move ``production`` to VERSION (default: the canary version); clears the canary."""
        with audited(self.db, self.anchor) as conn:
            return aliases.promote(conn, self, self.actor, model, version)

    def retire(self, model: str, reason: str | None = None) -> tuple[retire.Retirement, bool]:
        """Take ``model`` off every node (``registry.releases.retire``): audited, its history
        kept. Returns the retirement and whether this call made it."""
        with audited(self.db, self.anchor) as conn:
            return retire.retire(conn, self.actor, model, reason)

    def rollback(self, model: str, to: int | None = None) -> tuple[int, int]:
        """Point ``production`` back to TO (default: the newest version below the current)."""
        with audited(self.db, self.anchor) as conn:
            return aliases.rollback(conn, self, self.actor, model, to)
