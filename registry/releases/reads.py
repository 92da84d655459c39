"""What the catalog holds, read: its models, each model's versions (manifest, signature,
aliases), where an alias points, a model's rollout rows and the artifacts the versions ship."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlite_utils

from registry.errors import NotFound
from registry.releases.names import PRODUCTION, check_name
from serving.release.manifest import Manifest, decode
from serving.release.signing import decode_signature


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


class CatalogReads:
    """The questions asked of the catalog's tables; the changes check their preconditions with
    them on the same connection, inside their transaction."""

    def __init__(self, db: sqlite_utils.Database) -> None:
        self.db = db

    def models(self) -> list[dict[str, Any]]:
        return list(self.db.query("""
            SELECT m.name, m.created_at, COUNT(v.version) AS versions,
                   MAX(v.version) AS latest,
                   (SELECT version FROM aliases a WHERE a.model = m.name
                    AND a.alias = 'production') AS production,
                   (SELECT version FROM aliases a WHERE a.model = m.name
                    AND a.alias = 'canary') AS canary,
                   (SELECT retired_at FROM retirements r WHERE r.model = m.name) AS retired
            FROM models m LEFT JOIN versions v ON v.model = m.name
            GROUP BY m.name ORDER BY m.name"""))

    def versions(self, model: str) -> list[VersionRow]:
        self.require_model(model)
        rows = self.db.query("SELECT * FROM versions WHERE model = ? ORDER BY version", [model])
        return [_version_row(self.db, r) for r in rows]

    def resolve(self, model: str, ref: str | None = None) -> VersionRow:
        """``ref`` is a version number, an alias, or None (production, else the latest)."""
        self.require_model(model)
        if ref is None:
            version = self.alias(model, PRODUCTION) or _latest(self.db, model)
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
        return _version_row(self.db, rows[0])

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

    def artifact_size(self, sha256: str) -> int | None:
        """Size of a blob that some version references (None: no release ships it)."""
        row = self.db.execute("SELECT b.size FROM blobs b JOIN artifacts a ON a.sha256 = "
                              "b.sha256 WHERE b.sha256 = ? LIMIT 1", [sha256]).fetchone()
        return int(row[0]) if row else None

    def require_model(self, model: str) -> None:
        check_name(model)
        if not self.db.execute("SELECT 1 FROM models WHERE name = ?", [model]).fetchone():
            raise NotFound(f"no model named {model!r} in the registry")

    def require_version(self, model: str, version: int) -> None:
        if not self.db.execute("SELECT 1 FROM versions WHERE model = ? AND version = ?",
                               [model, version]).fetchone():
            raise NotFound(f"{model} has no version {version}")


def _latest(db: sqlite_utils.Database, model: str) -> int:
    row = db.execute("SELECT MAX(version) FROM versions WHERE model = ?", [model]).fetchone()
    if row[0] is None:
        raise NotFound(f"{model} has no versions")
    return int(row[0])


def _version_row(db: sqlite_utils.Database, row: dict[str, Any]) -> VersionRow:
    aliases = [r["alias"] for r in db.query(
        "SELECT alias FROM aliases WHERE model = ? AND version = ? ORDER BY alias",
        [row["model"], row["version"]])]
    signed = db.execute("SELECT signature, key_id FROM signatures WHERE model = ? AND "
                        "version = ?", [row["model"], row["version"]]).fetchone()
    return VersionRow(row["model"], row["version"], decode(row["manifest"]),
                      row["manifest_sha256"], row["publisher"], row["created_at"], aliases,
                      row["manifest"].encode(),
                      decode_signature(signed[0]) if signed else None,
                      signed[1] if signed else None)
