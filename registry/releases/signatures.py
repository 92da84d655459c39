"""Signing after publish: the versions of a model published before signing existed, each listed
in the TUF targets, and this publisher's signature on the targets version awaiting signatures
when it holds the model (k-of-n publishing). Runs inside the caller's audited transaction."""

from __future__ import annotations

import sqlite3

from registry.errors import RegistryError
from registry.releases.reads import CatalogReads
from registry.store import chain
from registry.store.clock import now
from registry.trust import tuf
from registry.trust.keys import Signer
from serving.release.manifest import decode
from serving.release.signing import encode_signature


def sign(conn: sqlite3.Connection, catalog: CatalogReads, actor: str, model: str,
         signer: Signer, version: int | None = None) -> tuple[list[int], tuf.Signed | None]:
    """Sign VERSION (default: every unsigned version) and approve the awaiting targets version
    that holds it; each signature audited (``sign``, ``sign-targets``). Signed versions are
    immutable. Returns the versions signed and the targets verdict (None: none awaited)."""
    catalog.require_model(model)
    if version is not None:
        catalog.require_version(model, version)
    unsigned = _unsigned_versions(conn, model, version)
    held, approve = _awaiting_targets(conn, model, version)
    if version is not None and not unsigned and not approve:
        raise RegistryError(f"{model} version {version} is signed already (and no targets "
                            f"metadata awaits signatures for it)")
    for number, body, digest in unsigned:
        _sign_version(conn, actor, model, number, body.encode(), digest, signer)
    verdict = _sign_targets(conn, actor, model, held, signer) if approve else None
    return [int(number) for number, _, _ in unsigned], verdict


def _unsigned_versions(conn: sqlite3.Connection, model: str,
                       version: int | None) -> list[tuple[int, str, str]]:
    """(version, manifest, manifest sha256) of each unsigned version, VERSION's alone if named."""
    return conn.execute(
        "SELECT v.version, v.manifest, v.manifest_sha256 FROM versions v LEFT JOIN "
        "signatures s ON s.model = v.model AND s.version = v.version WHERE v.model = ? "
        "AND s.signature IS NULL AND (? IS NULL OR v.version = ?) ORDER BY v.version",
        [model, version, version]).fetchall()


def _awaiting_targets(conn: sqlite3.Connection, model: str,
                      version: int | None) -> tuple[list[str], bool]:
    """The releases of this model held by the targets version awaiting signatures, and whether
    this sign approves it."""
    waiting = tuf.pending(conn)  # (None too where there is no TUF root: no targets either)
    held = [r for r in (waiting or {}).get("releases", [])
            if r.split("@")[0] == model and (version is None or r == f"{model}@{version}")]
    # a targets version that adds no release (re-signed by a rotation) is approved by any
    # publisher's sign; one that adds releases, by a sign naming one of them
    return held, bool(held) or (waiting is not None and not waiting["releases"])


def _sign_version(conn: sqlite3.Connection, actor: str, model: str, version: int, body: bytes,
                  digest: str, signer: Signer) -> None:
    chain.append(conn, actor=actor, action="sign", model=model, version=version, sha256=digest,
                 payload={"key_id": signer.key_id})
    conn.execute("INSERT INTO signatures VALUES (?, ?, ?, ?, ?)",
                 [model, version, signer.key_id, encode_signature(signer.sign(body)), now()])
    tuf.add_release(conn, decode(body), body, signer)


def _sign_targets(conn: sqlite3.Connection, actor: str, model: str, held: list[str],
                  signer: Signer) -> tuf.Signed:
    verdict = tuf.sign_targets(conn, signer)
    chain.append(conn, actor=actor, action="sign-targets", model=model,
                 payload={"key_id": signer.key_id, "targets_version": verdict.version,
                          "releases": held, "complete": verdict.complete,
                          "missing": verdict.missing})
    return verdict
