"""The registry's release signing key: where it lives, created on first use like a host key.

``REGISTRY_SIGNING_KEY`` names the private key (PEM). Unset, it is
``<REGISTRY_HOME>/keys/signing.key``, generated with mode 0600 the first time something needs
it, ``signing.pub`` beside it. An explicitly configured path is never created.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from registry.errors import SigningKeyError
from registry.settings import RegistrySettings
from registry.store.role import read_state
from serving.release.signing import (
    SigningError,
    key_id,
    load_public_key,
    public_pem,
    read_key_file,
)

PRIVATE, PUBLIC = "signing.key", "signing.pub"


@dataclass(frozen=True)
class Signer:
    key: Ed25519PrivateKey

    @property
    def key_id(self) -> str:
        return key_id(self.key.public_key())

    def sign(self, data: bytes) -> bytes:
        return self.key.sign(data)


def load_private_key(path: Path) -> Ed25519PrivateKey:
    try:
        key = serialization.load_pem_private_key(read_key_file(path, "signing key"), password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise SigningError(f"signing key {path}: not an unencrypted PEM private key "
                           f"({exc})") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise SigningError(f"signing key {path}: an Ed25519 key is needed, this is "
                           f"{type(key).__name__}")
    return key


def generate_key_pair(private_path: Path, public_path: Path) -> Ed25519PrivateKey:
    """Write a new key pair: the private key with mode 0600 (never overwriting a file), the
    public key beside it. The private key appears whole or not at all: it is written and synced
    under a temporary name, then linked into place, which fails when the name exists (two
    publishers making the first key at once: one wins, the other raises)."""
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    private_path.parent.mkdir(parents=True, exist_ok=True)
    if private_path.exists():
        raise SigningError(f"{private_path} exists already; not overwriting a key")
    fd, temporary = tempfile.mkstemp(prefix=f".{private_path.name}.", dir=private_path.parent)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(temporary, private_path)
        except FileExistsError:
            raise SigningError(f"{private_path} exists already; not overwriting a key") from None
    finally:
        os.unlink(temporary)
    public = public_path.with_name(f".{public_path.name}.{os.getpid()}")
    public.write_bytes(public_pem(key.public_key()))
    os.replace(public, public_path)
    return key


def public_path(private: Path) -> Path:
    """``signing.key`` -> ``signing.pub``; any other name gets ``.pub`` appended."""
    return private.with_name(PUBLIC) if private.name == PRIVATE else \
        private.with_name(private.name + ".pub")


def signer(settings: RegistrySettings) -> Signer:
    """The key publish signs with (the default one is created on first use)."""
    path = settings.signing_key_path
    try:
        if settings.signing_key is None and not path.exists():
            if _replicated(settings):
                raise SigningKeyError(
                    f"no signing key at {path}, and this registry is one of a replicated group: "
                    f"every registry of a group signs with the one key nodes pin, so it is "
                    f"provisioned (REGISTRY_SIGNING_KEY), never made here")
            if public_path(path).is_file():
                raise SigningKeyError(
                    f"no signing key at {path}, only its public half {public_path(path).name} "
                    f"(a restored home?): put the private key back there or set "
                    f"REGISTRY_SIGNING_KEY; a new key would sign releases no node accepts")
            try:
                key = generate_key_pair(path, public_path(path))
            except SigningError:
                if not path.exists():
                    raise
                key = load_private_key(path)  # another publisher made it first: theirs it is
        else:
            key = load_private_key(path)
    except SigningError as exc:
        raise SigningKeyError(f"{exc} (REGISTRY_SIGNING_KEY; `registry keygen` makes a key pair)") \
            from exc
    return Signer(key)


def online_signer(settings: RegistrySettings) -> Signer:
    """The key ``registry serve`` signs snapshot, timestamp and directives with: the online
    key when one is set, else the signing key (read from its file each time it is asked for,
    so a replaced file takes effect at once)."""
    if settings.online_key is None:
        return signer(settings)
    try:
        return Signer(load_private_key(settings.online_key))
    except SigningError as exc:
        raise SigningKeyError(f"{exc} (REGISTRY_ONLINE_KEY)") from exc


def _replicated(settings: RegistrySettings) -> bool:
    """Whether the registry at ``settings.home`` is a primary or standby of a group."""
    state = read_state(settings.database)
    return state is not None and state.role != "standalone"


def verifying_key(settings: RegistrySettings) -> Ed25519PublicKey | None:
    """The key that checks what this registry signed, from public material first: the
    ``signing.pub`` beside the signing key (a restored home has it, and no private key), else
    the private key's public half; None when neither exists (nothing is created here)."""
    public = public_path(settings.signing_key_path)
    if public.is_file():
        try:
            return load_public_key(public)
        except SigningError as exc:
            raise SigningKeyError(str(exc)) from exc
    return existing_public(settings)


def existing_public(settings: RegistrySettings) -> Ed25519PublicKey | None:
    """The signing key's public half when the key exists (None: nothing is created here, for
    checks that must not mint a key)."""
    if not settings.signing_key_path.exists():
        return None
    return signer(settings).key.public_key()


@dataclass(frozen=True)
class PublicKey:
    key: Ed25519PublicKey
    private_path: Path
    public_path: Path

    @property
    def key_id(self) -> str:
        return key_id(self.key)

    @property
    def pem(self) -> str:
        return public_pem(self.key).decode()


def public_key(settings: RegistrySettings) -> PublicKey:
    """The signing key's public half, written beside the private key when it is not there
    yet (that file is what edges and centers are given as ``--release-key``)."""
    private = settings.signing_key_path
    key = signer(settings).key.public_key()
    pub = public_path(private)
    if not pub.is_file() or pub.read_bytes() != public_pem(key):
        try:
            pub.write_bytes(public_pem(key))
        except OSError as exc:
            raise SigningKeyError(f"cannot write the public key {pub}: {exc}") from exc
    return PublicKey(key, private, pub)


def keygen(folder: Path) -> PublicKey:
    """A new key pair in ``folder`` (refused when a key is already there)."""
    private = folder / PRIVATE
    try:
        key = generate_key_pair(private, folder / PUBLIC)
    except SigningError as exc:
        raise SigningKeyError(str(exc)) from exc
    except OSError as exc:
        raise SigningKeyError(f"cannot write a key pair into {folder}: {exc}") from exc
    return PublicKey(key.public_key(), private, folder / PUBLIC)
