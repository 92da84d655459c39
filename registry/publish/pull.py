"""``registry pull``: materialize a release into a model store for one tier."""

from __future__ import annotations

from pathlib import Path

from registry.store.blobs import BlobStore
from serving.release.manifest import Artifact, Manifest
from serving.release.store import ModelStore, Tier


def pull(blobs: BlobStore, manifest: Manifest, tier: Tier, store: ModelStore,
         activate: bool = True, raw: bytes | None = None,
         signature: bytes | None = None) -> Path:
    """Copy the tier's blobs into ``<store>/<model>/<version>/`` (staged, verified, renamed),
    with the manifest as stored (``raw``) and its signature as ``release.sig``."""

    def fetch(artifact: Artifact, destination: Path) -> None:
        blobs.copy_to(artifact.sha256, destination)

    return store.install(manifest, tier, fetch, activate=activate, raw=raw, signature=signature)
