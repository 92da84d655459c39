"""Node tokens and the registry's secret, without gRPC (the registry's settings, the tiers'
settings and ``registry node provision``/``token`` use them; ``sync.wire.auth`` checks them on every
call). Standard library only (``scripts/compose-env.sh`` runs it with a bare ``python3``).

A node token names its node, its tier and its region, and is derived from the registry's
secret (``REGISTRY_TOKEN``):

    <node id>.<generation>.<tier>.<region>.<hex HMAC-SHA256(secret,
        "tiered-node:<node id>:<generation>:<tier>:<region>")>

The registry recomputes the MAC (constant-time compare), so it stores no per-node secret and
believes a node's tier and region only as it issued them (a hello that says otherwise is
refused); raising a node's generation (``registry node revoke``) voids its old token.
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

REGION = r"[a-z0-9][a-z0-9-]{0,31}"  # a region tag: what discovery accepts from Consul too
TIERS = ("edge", "center", "registry")  # registry: a standby following its primary
MIN_SECRET = 16  # characters of REGISTRY_TOKEN; `secrets.token_hex(16)` gives 32
NODE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}")
MAC = re.compile(r"[0-9a-f]{64}")
MAX_GENERATION = 1 << 31
Generations = Callable[[str], int]  # node id -> its current token generation


@dataclass(frozen=True)
class NodeToken:
    node_id: str
    generation: int
    tier: str
    region: str
    mac: str

    def __str__(self) -> str:
        return f"{self.node_id}.{self.generation}.{self.tier}.{self.region}.{self.mac}"


def _mac(secret: str, node_id: str, generation: int, tier: str, region: str) -> str:
    message = f"tiered-node:{node_id}:{generation}:{tier}:{region}".encode()
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def check_identity(node_id: str, tier: str, region: str) -> None:
    """TokenError unless ``node_id``, ``tier`` and ``region`` can be put in a token."""
    if not NODE_ID.fullmatch(node_id):
        raise TokenError(f"invalid node id {node_id[:64]!r}: letters, digits and ._:@- "
                         f"(at most 128, starting with a letter or digit)")
    if tier not in TIERS:
        raise TokenError(f"tier must be one of {', '.join(TIERS)}, not {tier[:32]!r}")
    if not re.fullmatch(REGION, region):
        raise TokenError(f"invalid region {region[:40]!r}: lower-case letters, digits and '-' "
                         f"(at most 32, starting with a letter or digit)")


def check_secret(secret: str, what: str = "REGISTRY_TOKEN") -> str:
    """The registry's secret, refused when empty or short (an empty one once opened
    everything: ``compare_digest(b"", b"")`` is True)."""
    if len(secret.strip()) < MIN_SECRET:
        raise ValueError(f"{what} must be at least {MIN_SECRET} characters (it is "
                         f"{len(secret.strip())}); e.g. `python -c 'import secrets; "
                         f"print(secrets.token_hex(16))'`")
    return secret


def node_token(secret: str, node_id: str, tier: str, region: str, generation: int = 1) -> str:
    """The token of ``node_id``, a ``tier`` node in ``region`` (at ``generation``), under the
    registry's ``secret``."""
    check_identity(node_id, tier, region)
    if not 1 <= generation < MAX_GENERATION:
        raise TokenError(f"generation must be 1..{MAX_GENERATION - 1}")
    mac = _mac(check_secret(secret), node_id, generation, tier, region)
    return str(NodeToken(node_id, generation, tier, region, mac))


def parse(token: str) -> NodeToken:
    """A node token's parts (not yet verified: only the registry can), read from the right:
    node ids may hold dots, the other parts cannot."""
    text = token.strip()
    parts = text.rsplit(".", 4)
    if len(parts) == 5:
        node_id, generation, tier, region, mac = parts
        if (NODE_ID.fullmatch(node_id) and generation.isdigit() and tier in TIERS
                and re.fullmatch(REGION, region) and MAC.fullmatch(mac)
                and 1 <= int(generation) < MAX_GENERATION):
            return NodeToken(node_id, int(generation), tier, region, mac)
    old, _, generation = text.rpartition(".")[0].rpartition(".")
    if NODE_ID.fullmatch(old) and generation.isdigit() and MAC.fullmatch(text[-64:]):
        raise TokenError(f"this node token was made before tiers and regions were in tokens: "
                         f"re-provision with `registry node provision {old[:64]} --tier "
                         f"edge|center --region R`")
    raise TokenError("not a node token (`<node id>.<generation>.<tier>.<region>.<64 hex "
                     "digits>`, made by `registry node provision NODE_ID`)")


def check_node_token(token: str, node_id: str, tier: str | None = None,
                     region: str | None = None) -> str:
    """A node's own token, checked at start-up: the right shape, for this node and (when
    given) its tier and region; the registry refuses a hello that disagrees with its token."""
    parsed = parse(token)
    if parsed.node_id != node_id:
        raise TokenError(f"the registry token is node {parsed.node_id!r}'s, but this node is "
                         f"{node_id!r} (each node has its own: `registry node provision "
                         f"{node_id}`)")
    for what, mine, theirs in (("tier", tier, parsed.tier), ("region", region, parsed.region)):
        if mine is not None and mine != theirs:
            raise TokenError(f"node {node_id!r}'s registry token was issued for {what} "
                             f"{theirs!r}, but this node's {what} is {mine!r} (the registry "
                             f"believes the token: start the node as issued, or re-provision)")
    return token


class TokenVerifier:
    """Checks node tokens against the registry's secret and the nodes' generations."""

    def __init__(self, secret: str, generations: Generations) -> None:
        self.secret = check_secret(secret)
        self.generations = generations

    def node(self, token: str) -> NodeToken | None:
        """The node (id, generation, tier, region) ``token`` proves, or None."""
        try:
            claimed = parse(token)
        except TokenError:
            return None
        expected = _mac(self.secret, claimed.node_id, claimed.generation, claimed.tier,
                        claimed.region)
        if not hmac.compare_digest(expected, claimed.mac):
            return None
        if claimed.generation != self.generations(claimed.node_id):
            return None  # revoked (an older generation) or not issued yet (a newer one)
        return claimed


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
