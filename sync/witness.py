"""Audit witnesses: the registry's signed word of how far its audit chain reached, kept by every
node, so a registry whose newest records were removed cannot pass for a whole one.

The registry signs its chain's head (seq and hash) beside the database (``registry.anchor``),
but whoever can write the registry's home can put an older, validly signed head back after
deleting the records written since, and lower what the database says nodes saw. The nodes are
witnesses no registry host can rewind: when the chain moved, ``registry serve`` sends each
connected node a ``Witness`` (a statement ``{"kind", "seq", "hash"}`` signed with the key
directives are signed with, at most once per ``REGISTRY_WITNESS_INTERVAL_S``); the node keeps
the newest that verifies (``<store>/.audit-witness.json``, written atomically) and shows it in
every hello. The registry checks it against its chain (``registry.witness``): a chain that ends
below the seq, or holds another hash there, lost records, and ``registry audit --verify`` says
so from then on.

A node that cannot verify (no release key) keeps nothing: an unverified statement would let a
rogue registry overwrite what the node was told by the real one.
"""

from __future__ import annotations

import base64
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

from serving.release.signing import SigningError
from serving.release.store import write_durably
from sync.directive import Checker
from sync.gen import sync_pb2 as pb

log = logging.getLogger(__name__)
KIND = "tiered-audit-witness-v1"  # what the signature covers says what it is
FILE = ".audit-witness.json"
MAX_STATEMENT = 256  # bytes: {"hash": 64 hex, "kind", "seq"} is ~120
MAX_SIGNATURE = 128  # bytes: Ed25519's are 64
SHA256 = re.compile(r"[0-9a-f]{64}")


class WitnessError(ValueError):
    """A witness statement that is not one (wrong kind, shape or size)."""


@dataclass(frozen=True)
class Head:
    seq: int
    hash: str


def statement(seq: int, head_hash: str) -> bytes:
    """The signed bytes: canonical JSON of the head, tagged with its kind."""
    return json.dumps({"kind": KIND, "seq": seq, "hash": head_hash}, sort_keys=True,
                      separators=(",", ":")).encode()


def parse(data: bytes, signature: bytes = b"") -> Head:
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
    return Head(seq, head_hash)


class Witnesses:
    """A node's side: keep the newest verified witness, show it in the hello."""

    def __init__(self, store_root: Path, checker: Checker | None) -> None:
        self.path, self.checker = store_root / FILE, checker
        self.newest: tuple[Head, bytes, bytes] | None = self._load()

    def _load(self) -> tuple[Head, bytes, bytes] | None:
        try:
            kept = json.loads(self.path.read_bytes())
            data = base64.b64decode(kept["statement"], validate=True)
            signature = base64.b64decode(kept["signature"], validate=True)
            return parse(data, signature), data, signature
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError, KeyError) as exc:
            log.error("%s is unreadable (%s): the next witness the registry sends is kept",
                      self.path, exc)
            return None

    def offer(self, message: pb.Witness) -> bool:
        """Keep ``message`` when it verifies and is newer than what is kept (blocking: a file
        write); whether it was kept."""
        if self.checker is None:
            return False
        try:
            head = parse(message.statement, message.signature)
            self.checker.check(message.statement, message.signature)
        except (WitnessError, SigningError) as exc:
            log.warning("ignoring an audit witness from the registry: %s", exc)
            return False
        if self.newest is not None and head.seq <= self.newest[0].seq:
            return False
        self.newest = head, message.statement, message.signature
        body = {"statement": base64.b64encode(message.statement).decode(),
                "signature": base64.b64encode(message.signature).decode(), "seq": head.seq}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_durably(self.path, json.dumps(body, indent=2).encode() + b"\n")
        return True

    def message(self) -> pb.Witness | None:
        """What the hello carries (None: nothing kept)."""
        if self.newest is None:
            return None
        return pb.Witness(statement=self.newest[1], signature=self.newest[2])
