"""The model store that center and edge load from.

Layout: ``<root>/<model>/<version>/`` holds the release files and ``release.json``;
``<root>/<model>/CURRENT`` names the active version. A version folder is filled under a hidden
staging name, every file's sha256 is checked, and only then is it renamed into place with
``os.replace``: a folder under a version name is always complete. No symlinks.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from serving.manifest import Artifact, Manifest, decode, encode, is_valid_name

MANIFEST = "release.json"
CURRENT = "CURRENT"
CHUNK = 1 << 20

Tier = Literal["edge", "center"]
Fetch = Callable[[Artifact, Path], None]


class StoreError(Exception):
    """A store folder is missing, incomplete, or does not match its manifest."""


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync_write(path: Path, data: bytes) -> None:
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(name, path)
    finally:
        Path(name).unlink(missing_ok=True)


class ModelStore:
    def __init__(self, root: Path) -> None:
        self.root = root

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

    def set_current(self, model: str, version: int) -> None:
        if not (self.version_dir(model, version) / MANIFEST).is_file():
            raise StoreError(f"{model} version {version} is not in the store")
        _fsync_write(self.model_dir(model) / CURRENT, f"{version}\n".encode())

    def manifest(self, model: str, version: int) -> Manifest:
        path = self.version_dir(model, version) / MANIFEST
        if not path.is_file():
            raise StoreError(f"{model} version {version} is not in the store")
        return decode(path.read_bytes())

    def verify(self, model: str, version: int, tier: Tier) -> Manifest:
        """Check that every file the tier needs is there with its recorded size and sha256."""
        manifest = self.manifest(model, version)
        folder = self.version_dir(model, version)
        for artifact in manifest.artifacts(tier):
            _check(folder / artifact.file, artifact)
        return manifest

    def install(self, manifest: Manifest, tier: Tier, fetch: Fetch, activate: bool = True) -> Path:
        """Stage the tier's files (``fetch`` writes each), verify them, rename into place."""
        target = self.version_dir(manifest.name, manifest.version)
        if not self.complete(manifest, tier):
            target.parent.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".staging-"))
            try:
                for artifact in manifest.artifacts(tier):
                    _safe_file_name(artifact.file)
                    fetch(artifact, staging / artifact.file)
                    _check(staging / artifact.file, artifact)
                _fsync_write(staging / MANIFEST, encode(manifest))
                if target.exists():  # incomplete, or laid out for the other tier
                    shutil.rmtree(target)
                os.replace(staging, target)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        if activate:
            self.set_current(manifest.name, manifest.version)
        return target

    def prune(self, model: str, keep: set[int]) -> list[int]:
        """Delete the model's version folders not in ``keep`` (never CURRENT); return them."""
        current = self.current(model)
        doomed = [v for v in self.versions(model) if v not in keep and v != current]
        for version in doomed:
            shutil.rmtree(self.version_dir(model, version))
        return doomed

    def find(self, sha256: str) -> Path | None:
        """A file with this sha256 in some installed version (to copy instead of download)."""
        if not self.root.is_dir():
            return None
        for folder in self.root.iterdir():
            if not (folder.is_dir() and is_valid_name(folder.name)):
                continue
            for version in self.versions(folder.name):
                try:
                    manifest = self.manifest(folder.name, version)
                except (StoreError, ValueError):
                    continue
                for artifact in manifest.by_role().values():
                    path = self.version_dir(folder.name, version) / artifact.file
                    if artifact.sha256 == sha256 and path.is_file():
                        return path
        return None

    def complete(self, manifest: Manifest, tier: Tier) -> bool:
        """Is this exact release installed for the tier, every file verified?"""
        try:
            return self.verify(manifest.name, manifest.version, tier) == manifest
        except (StoreError, OSError, ValueError):
            return False


def _safe_file_name(name: str) -> None:
    if not name or "/" in name or "\\" in name or name in {".", ".."} or name == MANIFEST:
        raise StoreError(f"unsafe artifact file name {name!r}")


def _check(path: Path, artifact: Artifact) -> None:
    if path.is_symlink() or not path.is_file():
        raise StoreError(f"{path} is missing")
    if path.stat().st_size != artifact.size:
        raise StoreError(f"{path} has {path.stat().st_size} bytes, expected {artifact.size}")
    if file_sha256(path) != artifact.sha256:
        raise StoreError(f"{path} does not match its sha256 {artifact.sha256}")
