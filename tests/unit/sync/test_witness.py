"""A node keeps the newest audit witness that verifies, never an older, unsigned or oversized one,
and the registry believes only what its own key signed (``sync.wire.witness``,
``registry.trust.witness_check``)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from registry.store import chain
from registry.trust import witness_check as told
from registry.trust.keys import Signer
from serving.release.signing import Verifier
from sync.gen import sync_pb2 as pb
from sync.node import witness_store
from sync.wire import witness

HASH = "ab" * 32


def signed(signer: Signer, seq: int, head_hash: str = HASH) -> pb.Witness:
    return told.sign(signer, chain.Head(seq, head_hash))


@pytest.fixture
def signer() -> Signer:
    return Signer(Ed25519PrivateKey.generate())


def test_a_node_keeps_the_newest_verified_witness_across_restarts(
        tmp_path: Path, signer: Signer) -> None:
    node = witness_store.Witnesses(tmp_path, Verifier(signer.key.public_key()))
    assert node.message() is None
    assert node.offer(signed(signer, 5))
    assert not node.offer(signed(signer, 5))  # the same seq again: nothing new
    assert not node.offer(signed(signer, 4))  # older: a rewound registry's head
    assert node.offer(signed(signer, 6))
    again = witness_store.Witnesses(tmp_path, Verifier(signer.key.public_key()))
    shown = again.message()
    assert shown is not None and witness.parse(shown.statement).seq == 6


def test_a_node_keeps_nothing_it_cannot_verify(tmp_path: Path, signer: Signer) -> None:
    other = Signer(Ed25519PrivateKey.generate())
    node = witness_store.Witnesses(tmp_path, Verifier(signer.key.public_key()))
    assert not node.offer(signed(other, 99))  # a rogue registry's: would hide the real one
    forged = signed(signer, 3)
    forged.statement = witness.statement(300, HASH)  # the signature is over seq 3
    assert not node.offer(forged)
    assert node.message() is None
    unverifying = witness_store.Witnesses(tmp_path / "plain", None)  # no release key
    assert not unverifying.offer(signed(signer, 1)) and unverifying.message() is None


@pytest.mark.parametrize(("data", "ok"), [
    (witness.statement(1, HASH), True),
    (witness.statement(0, HASH), False),
    (witness.statement(1, "AB" * 32), False),
    (b'{"kind":"tiered-directive-v1","seq":1,"hash":"' + HASH.encode() + b'"}', False),
    (b"[1, 2]", False),
    (b'{"hash":"' + HASH.encode() + b'","kind":"tiered-audit-witness-v1","seq":1,"x":1}', False),
    (b" " * (witness.MAX_STATEMENT - 1) + b"1", False),  # inside the bound: parsed, refused
    (b" " * witness.MAX_STATEMENT + b"1", False),  # outside it: refused unparsed
])
def test_a_statement_is_bounded_and_checked(data: bytes, ok: bool) -> None:
    if ok:
        assert witness.parse(data) == witness.WitnessedHead(1, HASH)
    else:
        with pytest.raises(witness.WitnessError):
            witness.parse(data)


def test_the_bound_on_the_signature() -> None:
    data = witness.statement(1, HASH)
    assert witness.parse(data, b"s" * witness.MAX_SIGNATURE).seq == 1
    with pytest.raises(witness.WitnessError, match="signature"):
        witness.parse(data, b"s" * (witness.MAX_SIGNATURE + 1))


def test_the_registry_believes_only_its_own_signature(signer: Signer) -> None:
    keys = [Signer(Ed25519PrivateKey.generate()).key.public_key(), signer.key.public_key()]
    assert told.verified(signed(signer, 7), keys) == witness.WitnessedHead(7, HASH)
    assert told.verified(signed(signer, 7), keys[:1]) is None
    assert told.verified(pb.Witness(statement=b"junk", signature=b"x"), keys) is None


def chain_of(records: int) -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE audit (seq INTEGER PRIMARY KEY, hash TEXT)")
    conn.executemany("INSERT INTO audit VALUES (?, ?)",
                     [(i, f"{i:064x}") for i in range(1, records + 1)])
    return conn


def test_a_chain_holds_a_witness_only_with_the_same_hash_at_its_seq() -> None:
    conn = chain_of(10)
    assert told.conflict(conn, witness.WitnessedHead(10, f"{10:064x}"), "node e") is None  # its end
    assert told.conflict(conn, witness.WitnessedHead(4, f"{4:064x}"), "node e") is None  # inside
    removed = told.conflict(conn, witness.WitnessedHead(11, f"{11:064x}"), "node e")
    assert removed is not None and "records 11..11 were removed" in removed
    rewritten = told.conflict(conn, witness.WitnessedHead(10, HASH), "node e")
    assert rewritten is not None and "rewritten" in rewritten
