"""A node's provisioning bundle: everything a new edge or center needs to prove who it is, in
one file readable by its owner only (mode 0600), written by ``registry node provision``.

    {"kind": "tiered-node-bundle-v1", "node_id": "edge-eu-1", "tier": "edge", "region": "eu",
     "token": "<node token>", "cert": "<PEM>", "key": "<PEM>", "ca": "<PEM fleet CA>",
     "directive_floor": 42}

- ``token``: the node's registry token (its tier and region are in it, MACed by the registry).
- ``cert``/``key``: the node's own TLS certificate (``registry.trust.pki.node``: SAN
  ``<node id>.<tier>.tiered.invalid``, OU tier, L region) and its private key.
- ``ca``: the fleet CA that every registry, center and edge certificate chains to.
- ``directive_floor``: the audit chain's seq when the bundle was made; the node refuses any
  release directive below it, even with an empty store (no trust on first use).

The node's identity, tier and region come from here, never from a flag that disagrees.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from serving.config.tokens import write_secret

KIND = "tiered-node-bundle-v1"
MAX_BYTES = 64 * 1024  # a token, two certificates and a key are a few KiB


class Bundle(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    kind: str
    node_id: str
    tier: str
    region: str
    token: str
    cert: str
    key: str
    ca: str
    directive_floor: int = 0


class BundleError(ValueError):
    """A bundle that cannot be used (unreadable, too big, readable by others, malformed)."""


def write(path: Path, bundle: Bundle) -> None:
    """``bundle`` as JSON at ``path``, mode 0600 from the first byte."""
    write_secret(path, msgspec.json.format(msgspec.json.encode(bundle), indent=1))


def load(path: Path) -> Bundle:
    """The bundle at ``path``; BundleError says why it cannot be used."""
    try:
        st = os.stat(path)
        if st.st_size > MAX_BYTES:
            raise BundleError(f"{path}: {st.st_size} bytes; a bundle is at most {MAX_BYTES}")
        if st.st_mode & 0o077:
            raise BundleError(f"{path} is readable by others (mode {st.st_mode & 0o777:o}); "
                              f"it holds a private key: chmod 600 {path}")
        data = path.read_bytes()
    except OSError as exc:
        raise BundleError(f"cannot read the bundle {path}: {exc.strerror}") from exc
    try:
        bundle = msgspec.json.decode(data, type=Bundle)
    except msgspec.DecodeError as exc:
        raise BundleError(f"{path} is not a node bundle: {exc}") from exc
    if bundle.kind != KIND:
        raise BundleError(f"{path}: kind {bundle.kind[:40]!r}, expected {KIND!r}")
    if bundle.directive_floor < 0:
        raise BundleError(f"{path}: directive_floor must be >= 0")
    return bundle
