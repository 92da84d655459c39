"""Publishing a version into the catalog: number it N+1 under the write lock, list it in the TUF
targets when signed, audit it, store its rows and signature, and send it out (an alias and its
rollout row, or the first wave of a wave rollout). Runs inside the caller's audited
transaction; ``check_request`` runs before it."""

from __future__ import annotations

import hashlib
import sqlite3
import time
from typing import Any

import msgspec

from registry.errors import RegistryError
from registry.releases import retire, waves
from registry.releases.aliases import point
from registry.releases.names import ALL_NODES, CANARY, PRODUCTION, check_name
from registry.releases.reads import CatalogReads
from registry.store import chain
from registry.store.clock import now
from registry.trust import tuf
from registry.trust.keys import Signer
from serving.release.manifest import Manifest, encode
from serving.release.signing import encode_signature


def check_request(manifest: Manifest, canary: list[str] | None,
                  rollout: waves.WavePolicy | None) -> None:
    check_name(manifest.name)
    if canary and rollout is not None:
        raise RegistryError("a release goes out to a canary or in waves, not both")


def create_version(conn: sqlite3.Connection, catalog: CatalogReads, actor: str,
                   manifest: Manifest, canary: list[str] | None, signer: Signer | None,
                   rollout: waves.WavePolicy | None) -> int:
    """Record version N+1 of ``manifest``'s model (see ``Catalog.create_version``)."""
    _add_model_if_new(conn, manifest.name)
    final = _numbered(conn, manifest)
    body = encode(final)
    digest = hashlib.sha256(body).hexdigest()
    alias, targets = _destination(canary, rollout)
    payload = _publish_payload(final, digest, alias, targets, rollout)
    if signer is not None:
        payload |= _list_in_tuf_targets(conn, final, body, signer)
    chain.append(conn, actor=actor, action="publish", model=final.name, version=final.version,
                 sha256=digest, payload=payload)
    _store_version(conn, final, body, digest)
    if signer is not None:
        _store_signature(conn, final, body, signer)
    _send_out(conn, catalog, actor, final, alias, targets, rollout)
    return final.version


def _add_model_if_new(conn: sqlite3.Connection, model: str) -> None:
    if not conn.execute("SELECT 1 FROM models WHERE name = ?", [model]).fetchone():
        conn.execute("INSERT INTO models VALUES (?, ?)", [model, now()])


def _numbered(conn: sqlite3.Connection, manifest: Manifest) -> Manifest:
    """The manifest as version N+1 (its own ``version`` ignored): under the write lock,
    concurrent publishers get consecutive versions."""
    last = conn.execute("SELECT MAX(version) FROM versions WHERE model = ?",
                        [manifest.name]).fetchone()[0]
    return msgspec.structs.replace(manifest, version=(last or 0) + 1)


def _destination(canary: list[str] | None,
                 rollout: waves.WavePolicy | None) -> tuple[str, list[str]]:
    """The alias the version goes out under and the nodes it targets."""
    if rollout is not None:
        return waves.ALIAS, []
    return (CANARY, canary) if canary else (PRODUCTION, ALL_NODES)


def _publish_payload(final: Manifest, digest: str, alias: str, targets: list[str],
                     rollout: waves.WavePolicy | None) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "manifest_sha256": digest, "alias": alias, "targets": targets,
        "artifacts": {r: a.sha256 for r, a in final.by_role().items()}}
    if rollout is not None:
        payload["waves"] = msgspec.to_builtins(rollout)
    return payload


def _list_in_tuf_targets(conn: sqlite3.Connection, final: Manifest, body: bytes,
                         signer: Signer) -> dict[str, Any]:
    """A new TUF targets version listing the release, signed by this publisher (refused when
    the key is not a targets key: the whole publish is rolled back); what the audit says."""
    said: dict[str, Any] = {"key_id": signer.key_id}
    verdict = tuf.add_release(conn, final, body, signer)
    if verdict is not None:
        said["tuf_targets"] = {"version": verdict.version, "complete": verdict.complete,
                                  "missing": verdict.missing}
    return said


def _store_version(conn: sqlite3.Connection, final: Manifest, body: bytes, digest: str) -> None:
    """The version row, its artifacts and their blobs (already in the blob store)."""
    for artifact in final.by_role().values():
        conn.execute("INSERT OR IGNORE INTO blobs VALUES (?, ?, ?)",
                     [artifact.sha256, artifact.size, now()])
    conn.execute("INSERT INTO versions VALUES (?, ?, ?, ?, ?, ?, ?)",
                 [final.name, final.version, body.decode(), digest, final.source_sha256,
                  final.publisher, final.published_at])
    for role, artifact in final.by_role().items():
        conn.execute("INSERT INTO artifacts VALUES (?, ?, ?, ?)",
                     [final.name, final.version, role, artifact.sha256])


def _store_signature(conn: sqlite3.Connection, final: Manifest, body: bytes,
                     signer: Signer) -> None:
    """The publisher's signature over the stored manifest bytes (which carry the version)."""
    conn.execute("INSERT INTO signatures VALUES (?, ?, ?, ?, ?)",
                 [final.name, final.version, signer.key_id, encode_signature(signer.sign(body)),
                  now()])


def _send_out(conn: sqlite3.Connection, catalog: CatalogReads, actor: str, final: Manifest,
              alias: str, targets: list[str], rollout: waves.WavePolicy | None) -> None:
    """Bring a retired model back, end its unfinished wave rollout, then start this version's
    waves or point its alias at it."""
    retire.unretire(conn, actor, final.name, final.version, "publish")
    waves.end(conn, final.name, actor, "superseded", f"version {final.version} was published")
    if rollout is not None:
        waves.start(conn, final.name, final.version, catalog.alias(final.name, PRODUCTION),
                    rollout, time.time())
    else:
        point(conn, final.name, alias, final.version, targets)
