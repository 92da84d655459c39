"""The model store that center and edge load from.

Layout: ``<root>/<model>/<version>/`` holds the release files and ``release.json``;
``<root>/<model>/CURRENT`` names the active version. A version folder is filled under a hidden
staging name, every file's sha256 is checked, and only then is it renamed into place with
``os.replace``: a folder under a version name is always complete. No symlinks.

``release.json`` holds the manifest exactly as the registry signed it and ``release.sig`` its
Ed25519 signature (base64). A store given a ``ReleaseCheck`` (the pinned key, or the node's TUF
trust: the manifest must be in its trusted targets) refuses to install or verify a version
whose signature is missing or does not verify; every manifest read or installed must name a
valid model and only plain file names (no paths, no hidden files).

``InstalledReleases`` reads and verifies what a store folder holds (what serving and the
downloads need); ``ModelStore`` is that plus the writes: install, activate (CURRENT), prune,
remove (a retired model).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal

from serving.errors import StoreError
from serving.release.manifest import Artifact, Manifest, decode, encode, is_valid_name
from serving.release.signing import (
    ReleaseCheck,
    SigningError,
    decode_signature,
    encode_signature,
)

MANIFEST = "release.json"
SIGNATURE = "release.sig"
SAFE_FILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
SHA256 = re.compile(r"[0-9a-f]{64}")
CURRENT = "CURRENT"
CHUNK = 1 << 20

Tier = Literal["edge", "center"]
Fetch = Callable[[Artifact, Path], None]


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def write_durably(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``: written beside it, fsynced, renamed over it, the folder
    fsynced; a crash leaves the old file or the new one, never half of one."""
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(name, path)
    finally:
        Path(name).unlink(missing_ok=True)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def check_release(manifest: Manifest) -> None:
    """Refuse a manifest that names an unsafe model or file, before anything touches disk."""
    if not is_valid_name(manifest.name):
        raise StoreError(f"unsafe model name {manifest.name!r}")
    if manifest.version < 1:
        raise StoreError(f"{manifest.name}: invalid version {manifest.version}")
    artifacts = list(manifest.by_role().values())
    for artifact in artifacts:
        _safe_file_name(artifact.file)
        if not SHA256.fullmatch(artifact.sha256) or artifact.size < 0:
            raise StoreError(f"{artifact.file}: invalid sha256 or size in the manifest")
    if len({a.file for a in artifacts}) != len(artifacts):
        raise StoreError(f"{manifest.name} version {manifest.version}: two artifacts share "
                         f"one file name")
    tokenizer = manifest.preprocessing.tokenizer
    if tokenizer is not None and (manifest.tokenizer is None or
                                  tokenizer != manifest.tokenizer.file):
        raise StoreError(f"preprocessing names tokenizer file {tokenizer!r}, which is not the "
                         f"release's verified tokenizer artifact")


class InstalledReleases:
    """The versions installed in one store folder (the layout in the module's docstring),
    read and verified; nothing here writes. ``ModelStore`` adds the writes.

    Why one class: every method is a path in that one layout plus the checks it keeps (valid
    names, sizes, sha256s, signatures), and the reads share them."""

    def __init__(self, root: Path, verifier: ReleaseCheck | None = None) -> None:
        """``verifier``: the key every version must be signed with (None: not checked)."""
        self.root = root
        self.verifier = verifier

    def model_dir(self, model: str) -> Path:
        if not is_valid_name(model):
            raise StoreError(f"invalid model name {model!r}")
        return self.root / model

    def version_dir(self, model: str, version: int) -> Path:
        return self.model_dir(model) / str(version)

    def versions(self, model: str) -> list[int]:
        folder = self.model_dir(model)
        if not folder.is_dir():
            return []
        return sorted(int(p.name) for p in folder.iterdir() if p.is_dir() and p.name.isdigit())

    def current(self, model: str) -> int | None:
        marker = self.model_dir(model) / CURRENT
        if not marker.is_file():
            return None
        text = marker.read_text().strip()
        if not text.isdigit():
            raise StoreError(f"{marker} does not name a version: {text!r}")
        return int(text)

    def manifest_bytes(self, model: str, version: int) -> bytes:
        path = self.version_dir(model, version) / MANIFEST
        if path.is_symlink() or not path.is_file():
            raise StoreError(f"{model} version {version} is not in the store")
        return path.read_bytes()

    def signature(self, model: str, version: int) -> bytes | None:
        path = self.version_dir(model, version) / SIGNATURE
        if path.is_symlink() or not path.is_file():
            return None
        try:
            return decode_signature(path.read_bytes())
        except SigningError as exc:
            raise StoreError(f"{path}: {exc}") from exc

    def manifest(self, model: str, version: int) -> Manifest:
        return self._decode(model, version, self.manifest_bytes(model, version))

    def _decode(self, model: str, version: int, raw: bytes) -> Manifest:
        manifest = decode(raw)
        check_release(manifest)
        if (manifest.name, manifest.version) != (model, version):
            raise StoreError(f"{model}/{version}/{MANIFEST} describes {manifest.name} version "
                             f"{manifest.version}")
        return manifest

    def verify(self, model: str, version: int, tier: Tier) -> Manifest:
        """Check the signature (with a verifier) and that every file the tier needs is there
        with its recorded size and sha256."""
        raw = self.manifest_bytes(model, version)
        if self.verifier is not None:
            self._check_signature(raw, self.signature(model, version), f"{model} version "
                                  f"{version} in {self.root}")
        manifest = self._decode(model, version, raw)
        folder = self.version_dir(model, version)
        for artifact in manifest.artifacts(tier):
            _check(folder / artifact.file, artifact)
        return manifest

    def _check_signature(self, raw: bytes, signature: bytes | None, what: str) -> None:
        assert self.verifier is not None
        try:
            self.verifier.check(raw, signature)
        except SigningError as exc:
            raise StoreError(f"{what}: {exc}") from exc

    def complete(self, manifest: Manifest, tier: Tier, raw: bytes | None = None,
                 signature: bytes | None = None) -> bool:
        """Is this exact release (these manifest bytes and signature, when given) installed
        for the tier, every file verified?"""
        model, version = manifest.name, manifest.version
        try:
            if self.verify(model, version, tier) != manifest:
                return False
            if raw is not None and self.manifest_bytes(model, version) != raw:
                return False
            return signature is None or self.signature(model, version) == signature
        except (StoreError, OSError, ValueError):
            return False

    def find(self, sha256: str) -> Path | None:
        """A file with this sha256 in some installed version (to copy instead of download)."""
        return next((path for sha, path in self.held() if sha == sha256), None)

    def held(self) -> Iterator[tuple[str, Path]]:
        """(sha256 as its manifest names it, path) of every file of every installed version,
        each sha256 once."""
        if not self.root.is_dir():
            return
        seen: set[str] = set()
        for folder in sorted(self.root.iterdir()):
            if not (folder.is_dir() and is_valid_name(folder.name)):
                continue
            for version in self.versions(folder.name):
                try:
                    manifest = self.manifest(folder.name, version)
                except (StoreError, ValueError):
                    continue
                for artifact in manifest.by_role().values():
                    path = self.version_dir(folder.name, version) / artifact.file
                    if artifact.sha256 not in seen and path.is_file():
                        seen.add(artifact.sha256)
                        yield artifact.sha256, path


class ModelStore(InstalledReleases):
    """The store a node (or ``registry pull``) changes: installs a release (staged, verified,
    renamed into place), activates a version (CURRENT) and prunes old ones; every read is
    ``InstalledReleases``'s."""

    def install(self, manifest: Manifest, tier: Tier, fetch: Fetch, activate: bool = True,
                raw: bytes | None = None, signature: bytes | None = None) -> Path:
        """Stage the tier's files (``fetch`` writes each), verify them, rename into place.

        ``raw`` is the manifest exactly as signed (default: ``manifest`` encoded) and is
        written byte for byte, with ``signature`` beside it, so the signature stays checkable.
        """
        raw = encode(manifest) if raw is None else raw
        if decode(raw) != manifest:
            raise StoreError(f"{manifest.name} version {manifest.version}: the manifest bytes "
                             f"do not match the manifest")
        check_release(manifest)
        if self.verifier is not None:
            self._check_signature(raw, signature, f"{manifest.name} version {manifest.version}")
        target = self.version_dir(manifest.name, manifest.version)
        if not self.complete(manifest, tier, raw, signature):
            self._stage(manifest, tier, fetch, raw, signature, target)
        if activate:
            self.set_current(manifest.name, manifest.version)
        return target

    def _stage(self, manifest: Manifest, tier: Tier, fetch: Fetch, raw: bytes,
               signature: bytes | None, target: Path) -> None:
        """Fill a hidden staging folder, check every file, then rename it to ``target``."""
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".staging-"))
        try:
            for artifact in manifest.artifacts(tier):
                fetch(artifact, staging / artifact.file)
                _check(staging / artifact.file, artifact)
            write_durably(staging / MANIFEST, raw)
            if signature:
                write_durably(staging / SIGNATURE, encode_signature(signature).encode() + b"\n")
            if target.exists():  # incomplete, or laid out for the other tier
                shutil.rmtree(target)
            os.replace(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def set_current(self, model: str, version: int) -> None:
        if not (self.version_dir(model, version) / MANIFEST).is_file():
            raise StoreError(f"{model} version {version} is not in the store")
        write_durably(self.model_dir(model) / CURRENT, f"{version}\n".encode())

    def remove(self, model: str) -> list[int]:
        """Take a model out of the store (a retire): its folder renamed aside under a hidden
        name first, the store folder fsynced (at once and durably there is no CURRENT: a
        restart loads nothing of it), then deleted. Returns the versions it held."""
        folder = self.model_dir(model)
        if not folder.is_dir():
            return []
        versions = self.versions(model)
        aside = Path(tempfile.mkdtemp(dir=self.root, prefix=f".retired-{model}-"))
        os.replace(folder, aside)
        fd = os.open(self.root, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        shutil.rmtree(aside, ignore_errors=True)
        return versions

    def prune(self, model: str, keep: set[int]) -> list[int]:
        """Delete the model's version folders not in ``keep`` (never CURRENT); return them."""
        current = self.current(model)
        doomed = [v for v in self.versions(model) if v not in keep and v != current]
        for version in doomed:
            shutil.rmtree(self.version_dir(model, version))
        return doomed


def _safe_file_name(name: str) -> None:
    """A plain file name: no path, no hidden file, not one of the store's own files."""
    if not SAFE_FILE.fullmatch(name) or name in {MANIFEST, SIGNATURE}:
        raise StoreError(f"unsafe artifact file name {name!r}")


def _check(path: Path, artifact: Artifact) -> None:
    if path.is_symlink() or not path.is_file():
        raise StoreError(f"{path} is missing")
    if path.stat().st_size != artifact.size:
        raise StoreError(f"{path} has {path.stat().st_size} bytes, expected {artifact.size}")
    if file_sha256(path) != artifact.sha256:
        raise StoreError(f"{path} does not match its sha256 {artifact.sha256}")
