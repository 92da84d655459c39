"""Models, versions, aliases and rollouts in SQLite; every change audited in its transaction."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time

import msgspec
import sqlite_utils

from registry.errors import RegistryError
from registry.releases import waves
from registry.releases.names import ALL_NODES, CANARY, PRODUCTION, check_name
from registry.releases.plan import Plan, RolloutNode, Target, read_plan
from registry.releases.reads import CatalogReads
from registry.store import chain
from registry.store.clock import now
from registry.trust import tuf
from registry.trust.anchor import Anchor, audited
from registry.trust.keys import Signer
from serving.release.manifest import Manifest, decode, encode
from serving.release.signing import encode_signature


class Catalog(CatalogReads):
    """The registry's models, versions, aliases and rollouts: the reads (``CatalogReads``), what
    each node should run (``registry.releases.plan``) and each change (publish, sign, promote,
    rollback), made in one audited transaction."""

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
        (``registry.releases.waves``) instead of pointing an alias at it; any other publish ends the
        model's unfinished wave rollout.
        """
        check_name(manifest.name)
        if canary and rollout is not None:
            raise RegistryError("a release goes out to a canary or in waves, not both")
        with audited(self.db, self.anchor) as conn:
            if not conn.execute("SELECT 1 FROM models WHERE name = ?", [manifest.name]).fetchone():
                conn.execute("INSERT INTO models VALUES (?, ?)", [manifest.name, now()])
            last = conn.execute("SELECT MAX(version) FROM versions WHERE model = ?",
                                [manifest.name]).fetchone()[0]
            final = _with_version(manifest, (last or 0) + 1)
            body = encode(final)
            digest = hashlib.sha256(body).hexdigest()
            alias, targets = (CANARY, canary) if canary else (PRODUCTION, ALL_NODES)
            if rollout is not None:
                alias, targets = waves.ALIAS, []
            payload = {"manifest_sha256": digest, "alias": alias, "targets": targets,
                       "artifacts": {r: a.sha256 for r, a in final.by_role().items()}}
            if rollout is not None:
                payload["waves"] = msgspec.to_builtins(rollout)
            if signer is not None:
                payload["key_id"] = signer.key_id
                # TUF targets: a new version listing it, signed by this publisher (refused
                # when the key is not a targets key: the whole publish is rolled back)
                verdict = tuf.add_release(conn, final, body, signer)
                if verdict is not None:
                    payload["tuf_targets"] = {"version": verdict.version,
                                              "complete": verdict.complete,
                                              "missing": verdict.missing}
            chain.append(conn, actor=self.actor, action="publish", model=final.name,
                         version=final.version, sha256=digest, payload=payload)
            for artifact in final.by_role().values():
                conn.execute("INSERT OR IGNORE INTO blobs VALUES (?, ?, ?)",
                             [artifact.sha256, artifact.size, now()])
            conn.execute("INSERT INTO versions VALUES (?, ?, ?, ?, ?, ?, ?)",
                         [final.name, final.version, body.decode(), digest, final.source_sha256,
                          final.publisher, final.published_at])
            for role, artifact in final.by_role().items():
                conn.execute("INSERT INTO artifacts VALUES (?, ?, ?, ?)",
                             [final.name, final.version, role, artifact.sha256])
            if signer is not None:
                conn.execute("INSERT INTO signatures VALUES (?, ?, ?, ?, ?)",
                             [final.name, final.version, signer.key_id,
                              encode_signature(signer.sign(body)), now()])
            waves.end(conn, final.name, self.actor, "superseded",
                      f"version {final.version} was published")
            if rollout is not None:
                waves.start(conn, final.name, final.version, self.alias(final.name, PRODUCTION),
                            rollout, time.time())
            else:
                self._point(conn, final.name, alias, final.version, targets)
        return final.version

    def sign(self, model: str, signer: Signer,
             version: int | None = None) -> tuple[list[int], tuf.Signed | None]:
        """Sign VERSION (default: every unsigned version) of a model published before signing
        existed, listing each in the TUF targets; and add this publisher's signature to the
        targets version awaiting signatures when it holds the model (k-of-n publishing). Each
        signature is audited (actions ``sign``, ``sign-targets``). Signed versions are
        immutable. Returns the versions signed and the targets verdict (None: none awaited)."""
        with audited(self.db, self.anchor) as conn:
            self.require_model(model)
            if version is not None:
                self.require_version(model, version)
            rows = conn.execute(
                "SELECT v.version, v.manifest, v.manifest_sha256 FROM versions v LEFT JOIN "
                "signatures s ON s.model = v.model AND s.version = v.version WHERE v.model = ? "
                "AND s.signature IS NULL AND (? IS NULL OR v.version = ?) ORDER BY v.version",
                [model, version, version]).fetchall()
            waiting = tuf.pending(conn) if tuf.latest(conn, tuf.ROOT) else None
            held = [r for r in (waiting or {}).get("releases", [])
                    if r.split("@")[0] == model and (version is None or r == f"{model}@{version}")]
            # a targets version that adds no release (re-signed by a rotation) is approved by
            # any publisher's sign; one that adds releases, by a sign naming one of them
            approve = bool(held) or (waiting is not None and not waiting["releases"])
            if version is not None and not rows and not approve:
                raise RegistryError(f"{model} version {version} is signed already (and no "
                                    f"targets metadata awaits signatures for it)")
            for number, body, digest in rows:
                chain.append(conn, actor=self.actor, action="sign", model=model,
                             version=number, sha256=digest, payload={"key_id": signer.key_id})
                conn.execute("INSERT INTO signatures VALUES (?, ?, ?, ?, ?)",
                             [model, number, signer.key_id,
                              encode_signature(signer.sign(body.encode())), now()])
                tuf.add_release(conn, decode(body.encode()), body.encode(), signer)
            verdict = None
            if approve:
                verdict = tuf.sign_targets(conn, signer)
                chain.append(conn, actor=self.actor, action="sign-targets", model=model,
                             payload={"key_id": signer.key_id, "targets_version": verdict.version,
                                      "releases": held, "complete": verdict.complete,
                                      "missing": verdict.missing})
        return [int(r[0]) for r in rows], verdict

    def promote(self, model: str, version: int | None = None) -> int:
        """Move ``production`` to VERSION (default: the canary version); clears the canary."""
        with audited(self.db, self.anchor) as conn:
            self.require_model(model)
            rolling = waves.unfinished(conn, model)
            target = version or self.alias(model, CANARY) or \
                (rolling[-1].version if rolling else None)
            if target is None:
                raise RegistryError(f"{model} has no canary or wave rollout to promote; name a "
                                    f"version")
            self.require_version(model, target)
            previous = self.alias(model, PRODUCTION)
            for r in rolling:
                waves.end(conn, model, self.actor, "done" if r.version == target else
                          "superseded", f"version {target} promoted by {self.actor}")
            chain.append(conn, actor=self.actor, action="promote", model=model, version=target,
                         payload={"from": previous, "to": target})
            self._point(conn, model, PRODUCTION, target, ALL_NODES)
            conn.execute("DELETE FROM aliases WHERE model = ? AND alias = ?", [model, CANARY])
        return target

    def rollback(self, model: str, to: int | None = None) -> tuple[int, int]:
        """Point ``production`` back to TO (default: the newest version below the current)."""
        with audited(self.db, self.anchor) as conn:
            self.require_model(model)
            current = self.alias(model, PRODUCTION)
            if current is None:
                raise RegistryError(f"{model} has no production version to roll back from")
            if to is None:
                row = conn.execute("SELECT MAX(version) FROM versions WHERE model = ? AND "
                                   "version < ?", [model, current]).fetchone()
                if row[0] is None:
                    raise RegistryError(f"{model} version {current} is the first version; "
                                        f"there is nothing to roll back to")
                to = int(row[0])
            self.require_version(model, to)
            if to == current:
                raise RegistryError(f"{model} production is already version {to}")
            waves.end(conn, model, self.actor, "superseded",
                      f"rolled back to version {to} by {self.actor}")
            chain.append(conn, actor=self.actor, action="rollback", model=model, version=to,
                         payload={"from": current, "to": to})
            self._point(conn, model, PRODUCTION, to, ALL_NODES)
        return current, to

    def _point(self, conn: sqlite3.Connection, model: str, alias: str, version: int,
               targets: list[str]) -> None:
        conn.execute("INSERT INTO aliases VALUES (?, ?, ?, ?) ON CONFLICT (model, alias) "
                     "DO UPDATE SET version = excluded.version, updated_at = excluded.updated_at",
                     [model, alias, version, now()])
        conn.execute("INSERT INTO rollouts (model, alias, version, targets, created_at) "
                     "VALUES (?, ?, ?, ?, ?)", [model, alias, version, json.dumps(targets), now()])


def _with_version(manifest: Manifest, version: int) -> Manifest:
    return msgspec.structs.replace(manifest, version=version)
