"""Models, versions, aliases and rollouts in SQLite; every change audited in its transaction."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from dataclasses import dataclass, field
from typing import Any

import msgspec
import sqlite_utils

from registry.errors import InvalidName, NotFound, RegistryError
from registry.releases import waves
from registry.store import chain
from registry.store.clock import now
from registry.trust import tuf
from registry.trust.anchor import Anchor, audited
from registry.trust.keys import Signer
from serving.release.manifest import Manifest, decode, encode, is_valid_name
from serving.release.signing import decode_signature, encode_signature

PRODUCTION = "production"
CANARY = "canary"
ALL_NODES = ["*"]


def check_name(name: str) -> None:
    if not is_valid_name(name):
        raise InvalidName(f"invalid model name {name!r}: use lowercase ASCII letters, digits, "
                          f"'.', '_' and '-', starting with a letter or digit, at most 128 "
                          f"characters (no '..', no '/')")


@dataclass(frozen=True)
class RolloutNode:
    """A subscriber as rollouts see it: canary targets name node ids, ``region:R`` or ``tier:T``."""

    node_id: str
    tier: str
    region: str

    def matches(self, targets: list[str]) -> bool:
        wanted = {"*", self.node_id, f"region:{self.region}", f"tier:{self.tier}"}
        return any(target in wanted for target in targets)


@dataclass(frozen=True)
class Target:
    """The release a node should run for one model: the stored manifest, byte for byte."""

    model: str
    version: int
    alias: str
    manifest: bytes
    manifest_sha256: str
    signature: bytes = b""  # Ed25519 over ``manifest``; empty: published unsigned
    key_id: str = ""


@dataclass(frozen=True)
class ModelPlan:
    """Who runs what of one model: production, a canary for named targets, a wave rollout for
    the edges whose position is under its cutoff (``registry.releases.waves``)."""

    model: str
    production: Target | None
    canary: Target | None = None
    canary_targets: list[str] = field(default_factory=list)
    wave: Target | None = None
    cutoff: float = 0.0

    def desired(self, node: RolloutNode) -> Target | None:
        if self.canary is not None and node.matches(self.canary_targets):
            return self.canary
        if self.wave is not None:
            if node.tier == "edge" and waves.admitted(self.model, node.node_id, self.cutoff):
                return self.wave
            if node.tier != "edge" and self.production is None:
                return self.wave  # a first release: the centers have nothing to judge it by
        return self.production


@dataclass(frozen=True)
class Plan:
    """Every model's ``ModelPlan``, read once: what each of many nodes should run."""

    models: list[ModelPlan]

    def desired(self, node: RolloutNode) -> list[Target]:
        return [t for m in self.models if (t := m.desired(node)) is not None]


@dataclass(frozen=True)
class VersionRow:
    model: str
    version: int
    manifest: Manifest
    manifest_sha256: str
    publisher: str
    created_at: str
    aliases: list[str]
    manifest_bytes: bytes = b""  # exactly as stored and signed
    signature: bytes | None = None
    key_id: str | None = None


class Catalog:
    """The registry's models, versions, aliases and rollouts: what is asked of them (reads)
    and each change (publish, sign, promote, rollback), made in one audited transaction.

    Why one class: it is the one gateway to those four tables. Each change checks its
    preconditions with the reads (the model and version exist, where the aliases point) on
    the same connection inside its transaction, and publish, promote and rollback move an
    alias the same way (``_point``: the alias and a rollout row). The parts that stand apart
    live elsewhere already: the hash-chained audit record in ``registry.store.chain``, the
    transaction and signed head in ``registry.trust.anchor``, the nodes' side in
    ``registry.fleet.nodes``. Callers (the CLI, ``publish``, the sync server, ``tiered``) hold one
    catalog per database and use its reads and changes together.
    """

    def __init__(self, db: sqlite_utils.Database, actor: str,
                 anchor: Anchor | None = None) -> None:
        """``anchor``: where the signed audit head is moved after each change (None: not)."""
        self.db = db
        self.actor = actor
        self.anchor = anchor

    # -- reads -----------------------------------------------------------------------------

    def models(self) -> list[dict[str, Any]]:
        return list(self.db.query("""
            SELECT m.name, m.created_at, COUNT(v.version) AS versions,
                   MAX(v.version) AS latest,
                   (SELECT version FROM aliases a WHERE a.model = m.name
                    AND a.alias = 'production') AS production,
                   (SELECT version FROM aliases a WHERE a.model = m.name
                    AND a.alias = 'canary') AS canary
            FROM models m LEFT JOIN versions v ON v.model = m.name
            GROUP BY m.name ORDER BY m.name"""))

    def versions(self, model: str) -> list[VersionRow]:
        self._require_model(model)
        rows = self.db.query("SELECT * FROM versions WHERE model = ? ORDER BY version", [model])
        return [self._row(r) for r in rows]

    def resolve(self, model: str, ref: str | None = None) -> VersionRow:
        """``ref`` is a version number, an alias, or None (production, else the latest)."""
        self._require_model(model)
        if ref is None:
            version = self.alias(model, PRODUCTION) or self._latest(model)
        elif ref.isdigit():
            version = int(ref)
        else:
            aliased = self.alias(model, ref)
            if aliased is None:
                raise NotFound(f"{model} has no alias {ref!r}")
            version = aliased
        rows = list(self.db.query("SELECT * FROM versions WHERE model = ? AND version = ?",
                                  [model, version]))
        if not rows:
            raise NotFound(f"{model} has no version {version}")
        return self._row(rows[0])

    def alias(self, model: str, alias: str) -> int | None:
        row = self.db.execute("SELECT version FROM aliases WHERE model = ? AND alias = ?",
                              [model, alias]).fetchone()
        return int(row[0]) if row else None

    def latest_source(self, model: str) -> tuple[int, str | None] | None:
        row = self.db.execute("SELECT version, source_sha256 FROM versions WHERE model = ? "
                              "ORDER BY version DESC LIMIT 1", [model]).fetchone()
        return (int(row[0]), row[1]) if row else None

    def rollouts(self, model: str) -> list[dict[str, Any]]:
        return list(self.db.query("SELECT * FROM rollouts WHERE model = ? ORDER BY id", [model]))

    def desired(self, node: RolloutNode) -> list[Target]:
        """Per model, what ``node`` should run: the canary if its rollout targets the node, the
        version of a wave rollout that admitted it, else production. Models with none of these
        for this node are left out."""
        return self.plan().desired(node)

    def plan(self) -> Plan:
        """What every node should run, per model (read once for many nodes)."""
        plans = []
        for model in [row["name"] for row in self.db.query("SELECT name FROM models")]:
            production = self.alias(model, PRODUCTION)
            plan = ModelPlan(model, self._target(model, production, PRODUCTION))
            canary = self.alias(model, CANARY)
            if canary is not None:
                plan = ModelPlan(model, plan.production, self._target(model, canary, CANARY),
                                 self._canary_targets(model, canary))
            rollout = waves.latest(self.db.conn, model)
            if rollout is not None and rollout.state in waves.ACTIVE:
                plan = ModelPlan(model, plan.production, plan.canary, plan.canary_targets,
                                 self._target(model, rollout.version, waves.ALIAS),
                                 rollout.cutoff)
            plans.append(plan)
        return Plan(plans)

    def _target(self, model: str, version: int | None, alias: str) -> Target | None:
        if version is None:
            return None
        row = self.db.execute(
            "SELECT v.manifest, v.manifest_sha256, s.signature, s.key_id FROM versions v "
            "LEFT JOIN signatures s ON s.model = v.model AND s.version = v.version "
            "WHERE v.model = ? AND v.version = ?", [model, version]).fetchone()
        signature = decode_signature(row[2]) if row[2] else b""
        return Target(model, version, alias, row[0].encode(), row[1], signature, row[3] or "")

    def _canary_targets(self, model: str, version: int) -> list[str]:
        row = self.db.execute("SELECT targets FROM rollouts WHERE model = ? AND alias = ? AND "
                              "version = ? ORDER BY id DESC LIMIT 1",
                              [model, CANARY, version]).fetchone()
        return list(json.loads(row[0])) if row else []

    def artifact_size(self, sha256: str) -> int | None:
        """Size of a blob that some version references (None: no release ships it)."""
        row = self.db.execute("SELECT b.size FROM blobs b JOIN artifacts a ON a.sha256 = "
                              "b.sha256 WHERE b.sha256 = ? LIMIT 1", [sha256]).fetchone()
        return int(row[0]) if row else None

    # -- writes ----------------------------------------------------------------------------

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
            self._require_model(model)
            if version is not None:
                self._require_version(model, version)
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
            self._require_model(model)
            rolling = waves.unfinished(conn, model)
            target = version or self.alias(model, CANARY) or \
                (rolling[-1].version if rolling else None)
            if target is None:
                raise RegistryError(f"{model} has no canary or wave rollout to promote; name a "
                                    f"version")
            self._require_version(model, target)
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
            self._require_model(model)
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
            self._require_version(model, to)
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

    # -- helpers ---------------------------------------------------------------------------

    def _require_model(self, model: str) -> None:
        check_name(model)
        if not self.db.execute("SELECT 1 FROM models WHERE name = ?", [model]).fetchone():
            raise NotFound(f"no model named {model!r} in the registry")

    def _require_version(self, model: str, version: int) -> None:
        if not self.db.execute("SELECT 1 FROM versions WHERE model = ? AND version = ?",
                               [model, version]).fetchone():
            raise NotFound(f"{model} has no version {version}")

    def _latest(self, model: str) -> int:
        row = self.db.execute("SELECT MAX(version) FROM versions WHERE model = ?",
                              [model]).fetchone()
        if row[0] is None:
            raise NotFound(f"{model} has no versions")
        return int(row[0])

    def _row(self, row: dict[str, Any]) -> VersionRow:
        aliases = [r["alias"] for r in self.db.query(
            "SELECT alias FROM aliases WHERE model = ? AND version = ? ORDER BY alias",
            [row["model"], row["version"]])]
        signed = self.db.execute("SELECT signature, key_id FROM signatures WHERE model = ? AND "
                                 "version = ?", [row["model"], row["version"]]).fetchone()
        return VersionRow(row["model"], row["version"], decode(row["manifest"]),
                          row["manifest_sha256"], row["publisher"], row["created_at"], aliases,
                          row["manifest"].encode(),
                          decode_signature(signed[0]) if signed else None,
                          signed[1] if signed else None)


def _with_version(manifest: Manifest, version: int) -> Manifest:
    return msgspec.structs.replace(manifest, version=version)
