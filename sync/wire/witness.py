"""Audit witnesses: the registry's signed word of how far its audit chain reached, kept by every
node, so a registry whose newest records were removed cannot pass for a whole one.

The registry signs its chain's head (seq and hash) beside the database (``registry.trust.anchor``),
but whoever can write the registry's home can put an older, validly signed head back after
deleting the records written since, and lower what the database says nodes saw. The nodes are
witnesses no registry host can rewind: when the chain moved, ``registry serve`` sends each
connected node a ``Witness`` (a statement ``{"kind", "seq", "hash"}`` signed with the key
directives are signed with, at most once per ``REGISTRY_WITNESS_INTERVAL_S``); the node keeps
the newest that verifies (``<store>/.audit-witness.json``, written atomically) and shows it in
every hello (``sync.node.witness_store``). The registry checks it against its chain
(``registry.trust.witness_check``): a chain that ends
below the seq, or holds another hash there, lost records, and ``registry audit --verify`` says
so from then on.

A node that cannot verify (no release key) keeps nothing: an unverified statement would let a
rogue registry overwrite what the node was told by the real one.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

KIND = "tiered-audit-witness-v1"  # what the signature covers says what it is
MAX_STATEMENT = 256  # bytes: {"hash": 64 hex, "kind", "seq"} is ~120
MAX_SIGNATURE = 128  # bytes: Ed25519's are 64
SHA256 = re.compile(r"[0-9a-f]{64}")


class WitnessError(ValueError):
    """A witness statement that is not one (wrong kind, shape or size)."""


@dataclass(frozen=True)
class WitnessedHead:
    seq: int
    hash: str


def statement(seq: int, head_hash: str) -> bytes:
    """The signed bytes: canonical JSON of the head, tagged with its kind."""
    return json.dumps({"kind": KIND, "seq": seq, "hash": head_hash}, sort_keys=True,
                      separators=(",", ":")).encode()


def parse(data: bytes, signature: bytes = b"") -> WitnessedHead:
    """The head a statement names, bounded and checked before it is parsed (WitnessError)."""
    if not 0 < len(data) <= MAX_STATEMENT or len(signature) > MAX_SIGNATURE:
        raise WitnessError(f"a witness of {len(data)} bytes with a {len(signature)}-byte "
                           f"signature (at most {MAX_STATEMENT} and {MAX_SIGNATURE})")
    try:
        body = json.loads(data)
    except ValueError as exc:
        raise WitnessError(f"unreadable witness ({exc})") from None
    if not isinstance(body, dict) or body.get("kind") != KIND or set(body) != {"kind", "seq",
                                                                               "hash"}:
        raise WitnessError(f"not a {KIND}")
    seq, head_hash = body["seq"], body["hash"]
    if not (isinstance(seq, int) and not isinstance(seq, bool) and 1 <= seq < 1 << 62
            and isinstance(head_hash, str) and SHA256.fullmatch(head_hash)):
        raise WitnessError("a witness field of the wrong type")
    return WitnessedHead(seq, head_hash)
