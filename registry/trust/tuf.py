"""Release metadata on The Update Framework (TUF), the registry's side: the four top-level
roles, kept in the registry database (``trust_metadata``, replicated and backed up with it).

- **root** names the keys of every role and their thresholds. Root keys are meant to be
  offline: a new root is made by ``registry key rotate``, signed by a threshold of the old
  root's keys *and* of its own, and nodes walk the chain of roots by themselves.
- **targets** lists, per release, ``<model>/<version>/release.json`` (the signed manifest) and
  each artifact by length and sha256. ``registry publish`` writes a new version of it, signed
  by the publisher's key (``REGISTRY_SIGNING_KEY``). Below the role's threshold it waits
  (``complete = 0``) for ``registry sign`` by other publishers; a release in no complete
  targets is never pushed, and a node would refuse it.
- **snapshot** and **timestamp** are the online roles: ``registry serve`` signs them with
  ``REGISTRY_ONLINE_KEY`` (the same key signs each node's directive, Uptane's director role).
  The timestamp expires ``REGISTRY_TIMESTAMP_EXPIRY_S`` after it was signed and is re-signed
  every third of that: a node that stops getting fresh ones (a frozen registry, a replayed
  stream) flags itself stale once the one it holds expires.

Migration: a registry from before TUF makes root version 1 the first time a command that holds
the signing key needs it (``ensure``); the key nodes were provisioned with (``--release-key``)
holds every role, so a node pinned to it accepts that root and follows later rotations alone.
Version 1 of targets lists every version whose release signature verifies with that key.
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlite_utils
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from securesystemslib.signer import CryptoSigner, Key, SSlibKey
from tuf.api.metadata import (
    Metadata,
    MetaFile,
    Root,
    Snapshot,
    TargetFile,
    Targets,
    Timestamp,
)
from tuf.api.serialization.json import JSONSerializer

from registry.errors import RegistryError
from registry.store.clock import now
from registry.store.db import read, transaction
from registry.trust.keys import Signer
from serving.release.manifest import Manifest, decode
from serving.release.signing import SigningError, decode_signature

ROOT, TARGETS, SNAPSHOT, TIMESTAMP = "root", "targets", "snapshot", "timestamp"
ONLINE = (SNAPSHOT, TIMESTAMP)
ROLE_NAMES = {"root": (ROOT,), "targets": (TARGETS,), "online": ONLINE}
ROOT_EXPIRY = timedelta(days=365)
TARGETS_EXPIRY = timedelta(days=365)
SNAPSHOT_EXPIRY = timedelta(days=7)
KEPT = 2  # snapshot and timestamp versions kept (older ones only grow the database)


class TrustError(RegistryError):
    """Metadata cannot be made as asked (a key not in its role, a threshold not met)."""

    exit_code = 2


class Frozen(TrustError):
    """This registry's online key is not root's: it cannot advance the timestamp."""

    exit_code = 1


def tuf_key(public: Ed25519PublicKey) -> SSlibKey:
    return SSlibKey.from_crypto(public)


def encode(md: Metadata[Any]) -> bytes:
    return md.to_bytes(JSONSerializer(compact=True))


def expiry(delta: timedelta, at: datetime | None = None) -> datetime:
    return ((at or datetime.now(UTC)) + delta).replace(microsecond=0)


def short(key: Key) -> str:
    """A TUF key shown as Tiered names keys elsewhere (``registry key``'s 16-hex id)."""
    raw = bytes.fromhex(str(key.keyval["public"]))
    return hashlib.sha256(raw).hexdigest()[:16]


@dataclass(frozen=True)
class Stored:
    role: str
    version: int
    data: bytes
    complete: bool

    @property
    def md(self) -> Metadata[Any]:
        return Metadata.from_bytes(self.data)


def latest(conn: sqlite3.Connection, role: str, complete: bool = True) -> Stored | None:
    row = conn.execute("SELECT version, data, complete FROM trust_metadata WHERE role = ? AND "
                       "complete >= ? ORDER BY version DESC LIMIT 1",
                       [role, int(complete)]).fetchone()
    return None if row is None else Stored(role, row[0], row[1].encode(), bool(row[2]))


def _put(conn: sqlite3.Connection, role: str, md: Metadata[Any], complete: bool) -> Stored:
    data = encode(md)
    conn.execute("INSERT INTO trust_metadata VALUES (?, ?, ?, ?, ?) ON CONFLICT (role, version) "
                 "DO UPDATE SET data = excluded.data, complete = excluded.complete",
                 [role, md.signed.version, data.decode(), int(complete), now()])
    return Stored(role, md.signed.version, data, complete)


def root_of(conn: sqlite3.Connection) -> Root:
    stored = latest(conn, ROOT)
    if stored is None:
        raise TrustError("this registry has no TUF root yet: `registry publish` or `registry "
                         "serve` makes version 1 with the signing key")
    root: Root = stored.md.signed
    return root


def release_files(manifest: Manifest, body: bytes) -> dict[str, TargetFile]:
    """The targets of one release: its manifest as signed, and each artifact."""
    prefix = f"{manifest.name}/{manifest.version}/"
    files = {f"{prefix}release.json": TargetFile(
        len(body), {"sha256": hashlib.sha256(body).hexdigest()}, f"{prefix}release.json")}
    for artifact in manifest.by_role().values():
        path = prefix + artifact.file
        files[path] = TargetFile(artifact.size, {"sha256": artifact.sha256}, path)
    return files


def releases(targets: Targets) -> set[tuple[str, int]]:
    """The (model, version) pairs a targets metadata vouches for."""
    found = set()
    for path in targets.targets:
        parts = path.split("/")
        if len(parts) == 3 and parts[2] == "release.json" and parts[1].isdigit():
            found.add((parts[0], int(parts[1])))
    return found


def ensure(db: sqlite_utils.Database, publisher: Signer, online: Ed25519PublicKey) -> bool:
    """Root and targets version 1, when there is no root yet (True: made now). The publisher
    key holds the root and targets roles, ``online`` snapshot and timestamp."""
    if _has_root(db):
        return False
    with transaction(db) as conn:
        if latest(conn, ROOT) is not None:  # another process made it meanwhile
            return False
        root = Root(expires=expiry(ROOT_EXPIRY), consistent_snapshot=False)
        key, online_key = tuf_key(publisher.key.public_key()), tuf_key(online)
        for role in (ROOT, TARGETS):
            root.add_key(key, role)
        for role in ONLINE:
            root.add_key(online_key, role)
        md = Metadata(root)
        md.sign(CryptoSigner(publisher.key))
        _put(conn, ROOT, md, True)
        targets = Targets(expires=expiry(TARGETS_EXPIRY))
        public = publisher.key.public_key()
        for body, signature in conn.execute(
                "SELECT v.manifest, s.signature FROM versions v JOIN signatures s ON "
                "s.model = v.model AND s.version = v.version ORDER BY v.model, v.version"):
            data = body.encode()
            try:
                public.verify(decode_signature(signature), data)
            except (InvalidSignature, SigningError):  # another key's: not vouched for here
                continue
            targets.targets.update(release_files(decode(data), data))
        tmd = Metadata(targets)
        tmd.sign(CryptoSigner(publisher.key))
        _put(conn, TARGETS, tmd, True)
    return True


def _has_root(db: sqlite_utils.Database) -> bool:
    with read(db) as conn:
        return latest(conn, ROOT) is not None


def _check_member(root: Root, role: str, key: SSlibKey, what: str) -> None:
    if key.keyid not in root.roles[role].keyids:
        members = ", ".join(short(root.get_key(k)) for k in root.roles[role].keyids) or "none"
        raise TrustError(f"{what} key {short(key)} is not a {role} key of root version "
                         f"{root.version} (those are: {members}); `registry key rotate --role "
                         f"{'online' if role in ONLINE else role}` changes them")


def check_publisher(db: sqlite_utils.Database, signer: Signer) -> None:
    """TrustError unless ``signer`` is one of root's targets keys."""
    with read(db) as conn:
        if latest(conn, ROOT) is not None:
            _check_member(root_of(conn), TARGETS, tuf_key(signer.key.public_key()),
                          "the signing")


@dataclass(frozen=True)
class Signed:
    """A targets version after a publish or a signature: complete, or how many are missing."""

    version: int
    complete: bool
    signed: int
    threshold: int

    @property
    def missing(self) -> int:
        return max(0, self.threshold - self.signed)


def _verdict(root: Root, md: Metadata[Any]) -> Signed:
    result = root.get_verification_result(TARGETS, md.signed_bytes, md.signatures)
    return Signed(md.signed.version, result.verified, len(result.signed), result.threshold)


def _base(conn: sqlite3.Connection, root: Root, complete: bool = False) -> Stored | None:
    """The newest targets version to build on: one that at least one of root's targets keys
    signed (complete or awaiting more signatures). A version no such key signed (written into
    the database by someone holding a revoked key) is never built on."""
    for version, data, done in conn.execute(
            "SELECT version, data, complete FROM trust_metadata WHERE role = 'targets' AND "
            "complete >= ? ORDER BY version DESC", [int(complete)]):
        stored = Stored(TARGETS, version, data.encode(), bool(done))
        md = stored.md
        if root.get_verification_result(TARGETS, md.signed_bytes, md.signatures).signed:
            return stored
    return None


def _next_version(conn: sqlite3.Connection) -> int:
    top = latest(conn, TARGETS, complete=False)
    return (top.version if top is not None else 0) + 1


def add_release(conn: sqlite3.Connection, manifest: Manifest, body: bytes,
                signer: Signer) -> Signed | None:
    """A new targets version with this release, signed by ``signer`` (a publisher: one of the
    targets keys, else TrustError and the publish is rolled back). None: the registry has no
    root yet (``ensure`` will list the release when it makes one)."""
    if latest(conn, ROOT) is None:
        return None
    root = root_of(conn)
    _check_member(root, TARGETS, tuf_key(signer.key.public_key()), "the signing")
    base = _base(conn, root)
    targets = base.md.signed if base is not None else Targets()
    targets.version = _next_version(conn)
    targets.expires = expiry(TARGETS_EXPIRY)
    targets.targets.update(release_files(manifest, body))
    md = Metadata(targets)
    md.sign(CryptoSigner(signer.key))
    verdict = _verdict(root, md)
    _put(conn, TARGETS, md, verdict.complete)
    return verdict


def sign_targets(conn: sqlite3.Connection, signer: Signer) -> Signed:
    """Add ``signer``'s signature to the newest targets version (a publisher approving what
    it adds; with a threshold above 1 the releases in it wait for this)."""
    root = root_of(conn)
    _check_member(root, TARGETS, tuf_key(signer.key.public_key()), "the signing")
    base = latest(conn, TARGETS, complete=False)
    if base is None or base.complete:
        raise TrustError("no targets metadata awaits signatures")
    md = base.md
    md.sign(CryptoSigner(signer.key), append=True)
    verdict = _verdict(root, md)
    _put(conn, TARGETS, md, verdict.complete)
    return verdict


def pending(conn: sqlite3.Connection) -> dict[str, Any] | None:
    """The newest targets version when it still awaits signatures: its releases and counts."""
    newest = latest(conn, TARGETS, complete=False)
    if newest is None or newest.complete:
        return None
    served = latest(conn, TARGETS)
    verdict = _verdict(root_of(conn), newest.md)
    known = releases(served.md.signed) if served is not None else set()
    return {"version": newest.version, "signed": verdict.signed, "threshold": verdict.threshold,
            "releases": sorted(f"{m}@{v}" for m, v in releases(newest.md.signed) - known)}


def rotate(conn: sqlite3.Connection, role: str, keys: list[Ed25519PublicKey], threshold: int,
           signers: Iterable[Signer], targets_signers: Iterable[Signer] = ()) -> dict[str, Any]:
    """Root version N+1 with ``role`` (root, targets or online) held by ``keys`` at
    ``threshold``; signed by ``signers``, which must meet the threshold of the old root's root
    role and of the new one's (TUF's rule: a node trusts a new root only so). Rotating the
    targets keys re-signs the newest complete targets with ``targets_signers`` (the new
    publisher keys) as a new version, so what was released stays valid."""
    if role not in ROLE_NAMES:
        raise TrustError(f"unknown role {role!r}: root, targets or online")
    if not keys:
        raise TrustError("a role needs at least one key")
    if not 1 <= threshold <= len(keys):
        raise TrustError(f"threshold {threshold} needs 1 to {len(keys)} (the keys given)")
    old = latest(conn, ROOT)
    if old is None:
        raise TrustError("this registry has no TUF root yet: publish a release first")
    previous: Root = old.md.signed
    new: Root = Metadata.from_bytes(old.data).signed
    new.version, new.expires = previous.version + 1, expiry(ROOT_EXPIRY)
    revoked = []
    for name in ROLE_NAMES[role]:
        for keyid in list(new.roles[name].keyids):
            revoked.append(short(new.get_key(keyid)))
            new.revoke_key(keyid, name)
        for public in keys:
            new.add_key(tuf_key(public), name)
        new.roles[name].threshold = threshold
    md = Metadata(new)
    for signer in signers:
        md.sign(CryptoSigner(signer.key), append=True)
    for what, by in (("old", previous), ("new", new)):
        result = by.get_verification_result(ROOT, md.signed_bytes, md.signatures)
        if not result.verified:
            wanted = ", ".join(short(by.get_key(k)) for k in by.roles[ROOT].keyids)
            raise TrustError(f"the new root needs {result.threshold} signature(s) of the {what} "
                             f"root keys ({wanted}); {len(result.signed)} given (--root-key)")
    _put(conn, ROOT, md, True)
    done: dict[str, Any] = {"root_version": new.version, "role": role,
                            "keys": [short(tuf_key(k)) for k in keys], "threshold": threshold,
                            "revoked": sorted(set(revoked))}
    if role == TARGETS:
        base = _base(conn, previous, complete=True)
        targets = base.md.signed if base is not None else Targets()
        targets.version = _next_version(conn)
        targets.expires = expiry(TARGETS_EXPIRY)
        tmd = Metadata(targets)
        for signer in targets_signers:
            _check_member(new, TARGETS, tuf_key(signer.key.public_key()), "the new publisher")
            tmd.sign(CryptoSigner(signer.key), append=True)
        verdict = _verdict(new, tmd)
        _put(conn, TARGETS, tmd, verdict.complete)
        done["targets"] = {"version": verdict.version, "complete": verdict.complete,
                           "missing": verdict.missing}
    return done


def _signed_by(md: Metadata[Any], key: SSlibKey) -> bool:
    return key.keyid in md.signatures


def advance(db: sqlite_utils.Database, online: Signer, timestamp_expiry_s: float,
            at: datetime | None = None) -> bool:
    """``registry serve``'s step: a new snapshot when targets moved on (or it nears its
    expiry, or another key signed it), a new timestamp when the snapshot moved on or a third
    of its life is left... (True: something was signed). Frozen: the online key is not
    root's, so nothing can be advanced."""
    at = at or datetime.now(UTC)
    key = tuf_key(online.key.public_key())
    with transaction(db) as conn:
        root = root_of(conn)
        try:
            _check_member(root, TIMESTAMP, key, "this registry's online (REGISTRY_ONLINE_KEY)")
        except TrustError as exc:
            raise Frozen(str(exc)) from None
        targets = latest(conn, TARGETS)
        if targets is None:
            return False
        changed = False
        snapshot = latest(conn, SNAPSHOT)
        smd = snapshot.md if snapshot is not None else None
        meta = MetaFile(targets.version, len(targets.data),
                        {"sha256": hashlib.sha256(targets.data).hexdigest()})
        if smd is None or smd.signed.meta.get("targets.json") != meta or \
                smd.signed.expires - at < SNAPSHOT_EXPIRY / 2 or not _signed_by(smd, key):
            smd = Metadata(Snapshot(version=(snapshot.version if snapshot else 0) + 1,
                                    expires=expiry(SNAPSHOT_EXPIRY, at),
                                    meta={"targets.json": meta}))
            smd.sign(CryptoSigner(online.key))
            snapshot = _put(conn, SNAPSHOT, smd, True)
            changed = True
        assert snapshot is not None
        stamp = latest(conn, TIMESTAMP)
        tmd = stamp.md if stamp is not None else None
        life = timedelta(seconds=timestamp_expiry_s)
        snap_meta = MetaFile(snapshot.version, len(snapshot.data),
                             {"sha256": hashlib.sha256(snapshot.data).hexdigest()})
        if changed or tmd is None or tmd.signed.snapshot_meta != snap_meta or \
                tmd.signed.expires - at < life * 2 / 3 or not _signed_by(tmd, key):
            tmd = Metadata(Timestamp(version=(stamp.version if stamp else 0) + 1,
                                     expires=(at + life).replace(microsecond=0),
                                     snapshot_meta=snap_meta))
            tmd.sign(CryptoSigner(online.key))
            _put(conn, TIMESTAMP, tmd, True)
            changed = True
        if changed:
            for role in ONLINE:
                conn.execute("DELETE FROM trust_metadata WHERE role = ? AND version <= "
                             "(SELECT MAX(version) FROM trust_metadata WHERE role = ?) - ?",
                             [role, role, KEPT])
    return changed


@dataclass
class Published:
    """What ``registry serve`` hands nodes: every root, and the current timestamp, snapshot and
    the targets that snapshot names; which releases these vouch for, and which wait."""

    roots: list[tuple[int, bytes]] = field(default_factory=list)
    timestamp: bytes = b""
    snapshot: bytes = b""
    targets: bytes = b""
    timestamp_version: int = 0
    trusted: set[tuple[str, int]] = field(default_factory=set)
    waiting: set[tuple[str, int]] = field(default_factory=set)
    snapshot_sha: str = ""
    targets_sha: str = ""

    def __post_init__(self) -> None:
        self.snapshot_sha = hashlib.sha256(self.snapshot).hexdigest()
        self.targets_sha = hashlib.sha256(self.targets).hexdigest()

    def roots_after(self, version: int) -> list[bytes]:
        return [data for v, data in self.roots if v > version]


def published(db: sqlite_utils.Database) -> Published | None:
    """The metadata as it stands (None: no root yet, or nothing signed online yet)."""
    with read(db) as conn:
        roots = [(v, d.encode()) for v, d in conn.execute(
            "SELECT version, data FROM trust_metadata WHERE role = 'root' ORDER BY version")]
        stamp, snapshot = latest(conn, TIMESTAMP), latest(conn, SNAPSHOT)
        if not roots or stamp is None or snapshot is None:
            return None
        meta = snapshot.md.signed.meta.get("targets.json")
        row = conn.execute("SELECT data FROM trust_metadata WHERE role = 'targets' AND "
                           "version = ?", [meta.version if meta else 0]).fetchone()
        newest = latest(conn, TARGETS, complete=False)
    if row is None:
        return None
    targets = row[0].encode()
    trusted = releases(Metadata[Targets].from_bytes(targets).signed)
    waiting = releases(newest.md.signed) - trusted if newest is not None else set()
    return Published(roots, stamp.data, snapshot.data, targets, stamp.version, trusted, waiting)


def describe(db: sqlite_utils.Database) -> dict[str, Any] | None:
    """Roles, keys, thresholds and versions, for ``registry key --json`` and status."""
    with read(db) as conn:
        stored = latest(conn, ROOT)
        if stored is None:
            return None
        root: Root = stored.md.signed
        roles = {}
        for name in (ROOT, TARGETS, SNAPSHOT, TIMESTAMP):
            role = root.roles[name]
            roles[name] = {"keys": [short(root.get_key(k)) for k in role.keyids],
                           "threshold": role.threshold}
        versions = {}
        for name in (TARGETS, SNAPSHOT, TIMESTAMP):
            current = latest(conn, name)
            versions[name] = None if current is None else {
                "version": current.version,
                "expires": current.md.signed.expires.isoformat()}
        waiting = pending(conn)
    return {"root_version": root.version, "root_expires": root.expires.isoformat(),
            "roles": roles, "versions": versions, "awaiting_signatures": waiting}

