"""Node tokens and the registry's secret, without gRPC (the registry's settings, the tiers'
settings and ``registry node token`` use them; ``sync.auth`` checks them on every call).

A node token names its node and is derived from the registry's secret (``REGISTRY_TOKEN``):

    <node id>.<generation>.<hex HMAC-SHA256(secret, "tiered-node:<node id>:<generation>")>

The registry recomputes the MAC (constant-time compare), so it stores no per-node secret;
raising a node's generation (``registry node revoke``) voids its old token.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from serving.errors import TokenError

MIN_SECRET = 16  # characters of REGISTRY_TOKEN; `secrets.token_hex(16)` gives 32
NODE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}")
MAC = re.compile(r"[0-9a-f]{64}")
MAX_GENERATION = 1 << 31
Generations = Callable[[str], int]  # node id -> its current token generation


@dataclass(frozen=True)
class NodeToken:
    node_id: str
    generation: int
    mac: str

    def __str__(self) -> str:
        return f"{self.node_id}.{self.generation}.{self.mac}"


def _mac(secret: str, node_id: str, generation: int) -> str:
    message = f"tiered-node:{node_id}:{generation}".encode()
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def check_secret(secret: str, what: str = "REGISTRY_TOKEN") -> str:
    """The registry's secret, refused when empty or short (an empty one once opened
    everything: ``compare_digest(b"", b"")`` is True)."""
    if len(secret.strip()) < MIN_SECRET:
        raise ValueError(f"{what} must be at least {MIN_SECRET} characters (it is "
                         f"{len(secret.strip())}); e.g. `python -c 'import secrets; "
                         f"print(secrets.token_hex(16))'`")
    return secret


def node_token(secret: str, node_id: str, generation: int = 1) -> str:
    """The token of ``node_id`` (at ``generation``) under the registry's ``secret``."""
    if not NODE_ID.fullmatch(node_id):
        raise TokenError(f"invalid node id {node_id[:64]!r}: letters, digits and ._:@- "
                         f"(at most 128, starting with a letter or digit)")
    if not 1 <= generation < MAX_GENERATION:
        raise TokenError(f"generation must be 1..{MAX_GENERATION - 1}")
    return str(NodeToken(node_id, generation, _mac(check_secret(secret), node_id, generation)))


def parse(token: str) -> NodeToken:
    """A node token's parts (not yet verified: only the registry can)."""
    node_id, _, rest = token.strip().rpartition(".")
    node_id, _, generation = node_id.rpartition(".")
    if not (NODE_ID.fullmatch(node_id) and generation.isdigit() and MAC.fullmatch(rest)
            and 1 <= int(generation) < MAX_GENERATION):
        raise TokenError("not a node token (`<node id>.<generation>.<64 hex digits>`, printed "
                         "by `registry node token NODE_ID`)")
    return NodeToken(node_id, int(generation), rest)


def check_node_token(token: str, node_id: str) -> str:
    """A node's own token, checked at start-up: the right shape and for this node."""
    parsed = parse(token)
    if parsed.node_id != node_id:
        raise TokenError(f"the registry token is node {parsed.node_id!r}'s, but this node is "
                         f"{node_id!r} (each node has its own: `registry node token "
                         f"{node_id}`)")
    return token


class Verifier:
    """Checks node tokens against the registry's secret and the nodes' generations."""

    def __init__(self, secret: str, generations: Generations) -> None:
        self.secret = check_secret(secret)
        self.generations = generations

    def node(self, token: str) -> str | None:
        """The node ``token`` proves, or None."""
        try:
            claimed = parse(token)
        except TokenError:
            return None
        expected = _mac(self.secret, claimed.node_id, claimed.generation)
        if not hmac.compare_digest(expected, claimed.mac):
            return None
        if claimed.generation != self.generations(claimed.node_id):
            return None  # revoked (an older generation) or not issued yet (a newer one)
        return claimed.node_id


def read_secret(path: Path, what: str) -> str:
    """A secret from a file (its first line), for settings that must not come from argv."""
    try:
        text = path.read_text().strip()
    except OSError as exc:
        raise ValueError(f"{what}: cannot read {path}: {exc.strerror}") from exc
    if not text:
        raise ValueError(f"{what}: {path} is empty")
    return text.splitlines()[0].strip()


def write_secret(path: Path, data: bytes) -> None:
    """``path`` holding ``data``, readable by its owner only and never for a moment by others
    (a token, a private key, a config with tokens in it)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # an older file keeps its mode through O_CREAT
    with os.fdopen(fd, "wb") as f:
        f.write(data)
