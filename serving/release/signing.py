"""Ed25519 release signatures, the checking side: nodes verify what the registry signed
(signing and key generation are the registry's: ``registry/trust/keys.py``).

A signature covers the exact ``release.json`` bytes the registry stores and sends; the
manifest names every artifact by sha256 and size, so a valid signature vouches for the files
too. Keys are PEM files (PKCS#8 private, SubjectPublicKeyInfo public; an OpenSSH
``ssh-ed25519`` public key line is accepted too). A key is named by its *key id*: the first 16
hex digits of the sha256 of the raw 32-byte public key.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from serving.errors import SigningError

log = logging.getLogger(__name__)
SIGNATURE_BYTES = 64


def key_id(public: Ed25519PublicKey) -> str:
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def public_pem(public: Ed25519PublicKey) -> bytes:
    return public.public_bytes(serialization.Encoding.PEM,
                               serialization.PublicFormat.SubjectPublicKeyInfo)


def encode_signature(signature: bytes) -> str:
    return base64.b64encode(signature).decode()


def decode_signature(text: str | bytes) -> bytes:
    try:
        return base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise SigningError(f"a signature is base64 text: {exc}") from exc


def read_key_file(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise SigningError(f"{what} {path}: no such file") from None
    except OSError as exc:
        raise SigningError(f"{what} {path}: {exc.strerror or exc}") from exc


def load_public_key(path: Path) -> Ed25519PublicKey:
    data = read_key_file(path, "release key")
    try:
        key = (serialization.load_ssh_public_key(data) if data.startswith(b"ssh-")
               else serialization.load_pem_public_key(data))
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise SigningError(f"release key {path}: not a PEM or OpenSSH public key "
                           f"({exc})") from exc
    if not isinstance(key, Ed25519PublicKey):
        raise SigningError(f"release key {path}: an Ed25519 key is needed, this is "
                           f"{type(key).__name__}")
    return key


class ReleaseCheck(Protocol):
    """What a store checks manifests with: a pinned ``Verifier``, or the node's TUF trust
    (``serving.release.trust.NodeTrust``)."""

    @property
    def key_id(self) -> str: ...

    def check(self, data: bytes, signature: bytes | None, signed_by: str = "") -> None: ...


@dataclass(frozen=True)
class Verifier:
    """The public key a node trusts; ``check`` raises SigningError with a reason for the
    operator when a manifest's signature is missing or does not verify."""

    key: Ed25519PublicKey

    @property
    def key_id(self) -> str:
        return key_id(self.key)

    def check(self, data: bytes, signature: bytes | None, signed_by: str = "") -> None:
        if not signature:
            raise SigningError(f"release is not signed; this node accepts only releases "
                               f"signed by key {self.key_id}")
        if len(signature) != SIGNATURE_BYTES:
            raise SigningError(f"release signature has {len(signature)} bytes, an Ed25519 "
                               f"signature has {SIGNATURE_BYTES}")
        try:
            self.key.verify(signature, data)
        except InvalidSignature:
            by = f" (signed by key {signed_by})" if signed_by and signed_by != self.key_id \
                else ""
            raise SigningError(f"release signature does not verify with the trusted key "
                               f"{self.key_id}{by}") from None


def node_verifier(path: Path | None, tier: str) -> Verifier | None:
    """The verifier for ``--release-key`` (None, with one warning, when it is unset)."""
    if path is None:
        log.warning("%s: no release key configured (--release-key / %s_RELEASE_KEY): release "
                    "signatures are NOT checked", tier, tier.upper())
        return None
    verifier = Verifier(load_public_key(path))
    log.info("%s: accepting releases signed by key %s (%s)", tier, verifier.key_id, path)
    return verifier
