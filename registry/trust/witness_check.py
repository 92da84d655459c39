"""The registry's side of audit witnesses (``sync.wire.witness``): what it signs for the nodes, how
it checks what a node shows in its hello, and where that is kept.

A witness a node shows is the registry's own signed word, so it is believed only once its
signature verifies with a key this registry signs with (the online key, else the signing key):
a node cannot make one up, only show one it was sent. Verified, it is kept per node
(``nodes.witness_seq``/``witness_hash``, only ever raised:
``registry.fleet.nodes.witnessed``) and compared with the chain
(``conflict``); ``anchor.witnessed`` (``registry audit --verify``) compares again. The nodes'
rows are rebuilt whenever they reconnect: a host that lowers them meets the next hello.
"""

from __future__ import annotations

import logging
import sqlite3

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from registry.store import chain
from registry.trust.keys import Signer
from sync.gen import sync_pb2 as pb
from sync.wire import witness
from sync.wire.witness import WitnessedHead

log = logging.getLogger(__name__)


def sign(signer: Signer, head: chain.Head) -> pb.Witness:
    data = witness.statement(head.seq, head.hash)
    return pb.Witness(statement=data, signature=signer.sign(data))


def verified(message: pb.Witness, keys: list[Ed25519PublicKey]) -> WitnessedHead | None:
    """The head ``message`` names when one of ``keys`` signed it; None otherwise (malformed,
    oversized, or not this registry's word)."""
    try:
        head = witness.parse(message.statement, message.signature)
    except witness.WitnessError:
        return None
    for key in keys:
        try:
            key.verify(message.signature, message.statement)
        except InvalidSignature:
            continue
        return head
    return None


def conflict(conn: sqlite3.Connection, seen: WitnessedHead, who: str) -> str | None:
    """What is wrong with this chain given that ``who`` was told it reached ``seen`` (None:
    the chain holds it)."""
    ours = chain.head(conn)
    last = ours.seq if ours else 0
    if last < seen.seq:
        return (f"{who} was told the audit chain reached record {seen.seq}, but it ends at "
                f"{last}: records {last + 1}..{seen.seq} were removed (an older signed head "
                f"put back?)")
    if chain.hash_at(conn, seen.seq) != seen.hash:
        return (f"{who} was told record {seen.seq} has hash {seen.hash[:16]}, the chain holds "
                f"another there: the chain was rewritten")
    return None


def highest(conn: sqlite3.Connection) -> tuple[str, WitnessedHead] | None:
    """The newest witness any node showed, and that node."""
    columns = {r[1] for r in conn.execute("PRAGMA table_info(nodes)")}
    if "witness_seq" not in columns:  # a database from before witnesses
        return None
    row = conn.execute("SELECT node_id, witness_seq, witness_hash FROM nodes WHERE witness_seq "
                       "IS NOT NULL ORDER BY witness_seq DESC, node_id LIMIT 1").fetchone()
    return (str(row[0]), WitnessedHead(int(row[1]), str(row[2]))) if row else None
