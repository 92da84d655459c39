"""A node's side of the release metadata on The Update Framework (TUF): python-tuf's client
(``tuf.ngclient.Updater``) verifies what the registry pushes over the sync stream.

The registry sends, on every stream and whenever it changes, the roots newer than the node's
and the current timestamp, snapshot and targets (``sync.proto``'s ``Trust``). The node hands
them to the Updater through a fetcher that serves only those bytes (no second channel): the
Updater walks the chain of roots (each signed by a threshold of the previous root's keys and
its own), refuses an expired, rolled-back or mix-and-matched timestamp, snapshot or targets,
and keeps what verified in ``<store>/.tuf/``.

Trust starts from what the node was provisioned with (``--release-key``): a TUF root file
(``registry key --root``), or the registry's Ed25519 public key, which must have signed root
version 1 (a registry from before TUF makes that root with this key, so a node provisioned
before keeps working and then follows every rotation alone).

With trust established, a pushed release is installed only when the trusted targets list its
manifest (and each artifact) by sha256 and length, and only while the timestamp is fresh. Once
the newest timestamp that verified has expired the node is *stale* (since that moment): it
keeps serving what it has, says so in its health, metrics and ``registry status``, and
installs nothing new until a fresh timestamp verifies. Directives (the registry's per-node
orders) are verified with root's timestamp keys. Releases already in the store are checked at
start-up against the targets kept on disk.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from securesystemslib.exceptions import UnverifiedSignatureError
from securesystemslib.signer import Signature, SSlibKey
from tuf.api import exceptions
from tuf.api.metadata import Metadata, Root, Targets, Timestamp
from tuf.ngclient import Updater, UpdaterConfig
from tuf.ngclient.fetcher import FetcherInterface

from serving.errors import SigningError
from serving.release.manifest import Manifest
from serving.release.signing import Verifier

log = logging.getLogger(__name__)
FOLDER = ".tuf"
BASE = "tiered-sync:/"
CONFIG = UpdaterConfig(max_root_rotations=64, root_max_length=64 << 10,
                       timestamp_max_length=16 << 10, snapshot_max_length=64 << 10,
                       targets_max_length=8 << 20)
MAX_ROOTS = 64  # roots in one push: more than a node could walk in one refresh


class TrustRefused(SigningError):
    """Pushed metadata did not verify (the node keeps what it trusted before)."""


class Pushed(FetcherInterface):
    """The Updater's fetcher: the files of one push, nothing from the network."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files

    def _fetch(self, url: str) -> Iterator[bytes]:
        name = url.removeprefix(BASE)
        if url == name or name not in self.files:
            raise exceptions.DownloadHTTPError(f"{name} was not pushed", 404)
        return iter([self.files[name]])


def _read(path: Path) -> Metadata[Any] | None:
    try:
        return Metadata.from_bytes(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, exceptions.RepositoryError, ValueError) as exc:
        log.error("%s is unreadable (%s)", path, exc)
        return None


@dataclass(frozen=True)
class State:
    """What ``/v2/health``, the metrics and the report to the registry say of the trust."""

    root_version: int
    timestamp_version: int
    expires: float  # unix time the trusted timestamp expires (0: none yet)
    stale: bool
    error: str

    def as_dict(self) -> dict[str, Any]:
        since = datetime.fromtimestamp(self.expires, UTC).isoformat() if self.stale else None
        return {"root_version": self.root_version, "timestamp_version": self.timestamp_version,
                "expires": datetime.fromtimestamp(self.expires, UTC).isoformat()
                if self.expires else None, "stale": self.stale, "stale_since": since,
                "error": self.error or None}


class NodeTrust:
    """Why one class: the Updater's folder, the pinned key for the first root, and what the
    node verifies against (targets, director keys, the timestamp's expiry) change together on
    every push and are read from several threads, under one lock.

    It is also the store's release check (``check``): by the trusted targets once there are
    any, else by the pinned key's signature as before TUF."""

    def __init__(self, store_root: Path, pinned: Verifier | None,
                 first_root: bytes | None = None) -> None:
        self.dir = store_root / FOLDER
        self.pinned, self.first_root = pinned, first_root
        self._lock = threading.Lock()
        self.root: Root | None = None
        self.targets: Targets | None = None
        self.timestamp: Timestamp | None = None
        self.error = ""
        self._seen = -1  # the timestamp file's mtime when last loaded
        self._load()

    @property
    def key_id(self) -> str:
        return self.pinned.key_id if self.pinned is not None else "tuf-root"

    @property
    def established(self) -> bool:
        return self.root is not None

    def _mtime(self) -> int:
        try:
            return (self.dir / "timestamp.json").stat().st_mtime_ns
        except OSError:
            return 0

    def _load(self) -> None:
        """What verified before (python-tuf writes a file only once it verified)."""
        self._seen = self._mtime()
        root = _read(self.dir / "root.json")
        targets = _read(self.dir / "targets.json")
        stamp = _read(self.dir / "timestamp.json")
        with self._lock:
            self.root = root.signed if root is not None else None
            self.targets = targets.signed if targets is not None and root is not None else None
            self.timestamp = stamp.signed if stamp is not None and root is not None else None

    def state(self, at: datetime | None = None) -> State:
        if self._mtime() != self._seen:  # another worker process of this node updated it
            self._load()
        with self._lock:
            expires = self.timestamp.expires.timestamp() if self.timestamp else 0.0
            stale = self.timestamp is not None and self.timestamp.is_expired(at)
            return State(self.root.version if self.root else 0,
                         self.timestamp.version if self.timestamp else 0, expires, stale,
                         self.error)

    def update(self, roots: list[bytes], timestamp: bytes, snapshot: bytes,
               targets: bytes) -> State:
        """Verify one push with python-tuf (blocking: run it off the event loop). Raises
        TrustRefused when it does not verify; what verified before stays."""
        files: dict[str, bytes] = {}
        for data in roots[:MAX_ROOTS]:
            try:
                version = Metadata[Root].from_bytes(data).signed.version
            except (exceptions.RepositoryError, ValueError, TypeError, KeyError) as exc:
                raise TrustRefused(f"unreadable root metadata pushed: {exc}") from None
            files[f"{version}.root.json"] = data
        files.update({name: data for name, data in (("timestamp.json", timestamp),
                                                    ("snapshot.json", snapshot),
                                                    ("targets.json", targets)) if data})
        try:
            bootstrap = None if self.established else self._first(files)
            self.dir.mkdir(parents=True, exist_ok=True)
            updater = Updater(str(self.dir), BASE, fetcher=Pushed(files), config=CONFIG,
                              bootstrap=bootstrap)
            updater.refresh()
        except (exceptions.RepositoryError, exceptions.DownloadError, ValueError) as exc:
            self._load()
            with self._lock:
                self.error = f"{type(exc).__name__}: {exc}"[:500]
            raise TrustRefused(f"release metadata refused: {self.error}") from None
        self._load()
        with self._lock:
            self.error = ""
        return self.state()

    def _first(self, files: dict[str, bytes]) -> bytes:
        """The root to start from: the provisioned root file, or root version 1 signed by
        the pinned key."""
        if self.first_root is not None:
            return self.first_root
        if self.pinned is None:
            raise TrustRefused("no key to trust a first root with")
        data = files.get("1.root.json")
        if data is None:
            raise TrustRefused("the registry did not push root version 1 to start from")
        md = Metadata[Root].from_bytes(data)
        key = SSlibKey.from_crypto(self.pinned.key)
        signature = md.signatures.get(key.keyid)
        if key.keyid not in md.signed.roles["root"].keyids or signature is None:
            raise TrustRefused(f"root version 1 is not signed by the provisioned key "
                               f"{self.pinned.key_id}")
        try:
            key.verify_signature(signature, md.signed_bytes)
        except UnverifiedSignatureError:
            raise TrustRefused(f"root version 1's signature does not verify with the "
                               f"provisioned key {self.pinned.key_id}") from None
        return data

    # --- what a release must pass ---------------------------------------------------------

    def check(self, data: bytes, signature: bytes | None, signed_by: str = "") -> None:
        """The store's check of a manifest (at start-up, at install): listed in the trusted
        targets by sha256 and length; before trust is established, the pinned signature."""
        with self._lock:
            targets, root = self.targets, self.root
        if root is None:
            if self.pinned is None:
                raise SigningError("no trusted release metadata yet")
            self.pinned.check(data, signature, signed_by)
            return
        digest = hashlib.sha256(data).hexdigest()
        for target in (targets.targets.values() if targets else ()):
            if target.path.endswith("/release.json") and \
                    target.hashes.get("sha256") == digest and target.length == len(data):
                return
        raise SigningError(f"release manifest {digest[:12]} is not in this node's trusted TUF "
                           f"targets (root version {root.version}, targets version "
                           f"{targets.version if targets else 0})")

    def check_release(self, manifest: Manifest, data: bytes) -> None:
        """A pushed release may be installed: fresh timestamp, manifest and artifacts listed
        in the trusted targets (SigningError with the reason otherwise)."""
        state = self.state()
        if state.stale:
            raise SigningError(f"release metadata is stale: the newest timestamp that verified "
                               f"expired at {state.as_dict()['stale_since']} (a frozen or "
                               f"replayed registry?); installing nothing until a fresh one")
        with self._lock:
            targets, root = self.targets, self.root
        prefix = f"{manifest.name}/{manifest.version}/"
        listed = targets.targets if targets is not None else {}
        entry = listed.get(prefix + "release.json")
        if entry is None:
            raise SigningError(
                f"{manifest.name} version {manifest.version} is not in the trusted TUF targets "
                f"(root version {root.version if root else 0}, targets version "
                f"{targets.version if targets else 0}): signed by too few publisher keys, or "
                f"by a key root no longer trusts")
        digest = hashlib.sha256(data).hexdigest()
        if entry.hashes.get("sha256") != digest or entry.length != len(data):
            raise SigningError(f"{manifest.name} version {manifest.version}: the manifest is "
                               f"not the one the trusted targets list")
        for artifact in manifest.by_role().values():
            target = listed.get(prefix + artifact.file)
            if target is None or target.hashes.get("sha256") != artifact.sha256 or \
                    target.length != artifact.size:
                raise SigningError(f"{manifest.name} version {manifest.version}: artifact "
                                   f"{artifact.file} is not the one the trusted targets list")

    def check_directive(self, data: bytes, signature: bytes) -> None:
        """A directive (Uptane's director role): signed by one of root's timestamp keys."""
        with self._lock:
            root = self.root
        if root is None:
            if self.pinned is None:
                raise SigningError("no trusted release metadata yet")
            self.pinned.check(data, signature)
            return
        role = root.roles["timestamp"]
        for keyid in role.keyids:
            key = root.get_key(keyid)
            try:
                key.verify_signature(Signature(keyid, signature.hex()), data)
                return
            except UnverifiedSignatureError:
                continue
        raise SigningError(f"directive is not signed by a timestamp key of root version "
                           f"{root.version}")


class Director:
    """``NodeTrust.check_directive`` as the ``sync.wire.directive`` verifier."""

    def __init__(self, trust: NodeTrust) -> None:
        self.trust = trust

    def check(self, data: bytes, signature: bytes | None, signed_by: str = "") -> None:
        self.trust.check_directive(data, signature or b"")


def first_root(path: Path | None) -> bytes | None:
    """``--release-key`` may name a TUF root file instead of a public key (its bytes)."""
    if path is None:
        return None
    try:
        data = path.read_bytes()
    except OSError:
        return None  # node_verifier says what is wrong with the file
    if not data.lstrip().startswith(b"{"):
        return None
    try:
        Metadata[Root].from_bytes(data)
    except (exceptions.RepositoryError, ValueError, TypeError, KeyError) as exc:
        raise SigningError(f"release key {path}: not a TUF root ({exc})") from None
    return data


def node_trust(store_root: Path, path: Path | None, tier: str) -> NodeTrust | None:
    """The store's release check for ``--release-key`` (None, with one warning, when unset)."""
    from serving.release.signing import node_verifier

    root = first_root(path)
    if root is not None:
        log.info("%s: trusting the TUF root in %s", tier, path)
        return NodeTrust(store_root, None, root)
    pinned = node_verifier(path, tier)
    return None if pinned is None else NodeTrust(store_root, pinned)
