"""Signed directives on the node side: for this node, for this release, never older."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from registry.trust.keys import Signer
from serving.release.signing import Verifier
from sync.wire import directive
from sync.wire.directive import Directive, DirectiveError, Directives

SHA1, SHA2, HEAD = "1" * 64, "2" * 64, "a" * 64
SIGNER = Signer(Ed25519PrivateKey.generate())


def signed(seq: int, version: int = 1, sha: str = SHA1, node: str = "n1",
           signer: Signer = SIGNER) -> tuple[bytes, bytes]:
    return directive.sign(signer, Directive(node, "tiny", version, sha, seq, HEAD))


@pytest.fixture
def node(tmp_path: Path) -> Directives:
    return Directives(tmp_path, "n1", Verifier(SIGNER.key.public_key()))


def accept(node: Directives, data: tuple[bytes, bytes], version: int, sha: str) -> None:
    node.accept(node.check(*data, "tiny", version, sha))


def test_an_older_directive_is_refused_and_the_floor_survives_a_restart(
        node: Directives, tmp_path: Path) -> None:
    old, new = signed(5, 1, SHA1), signed(9, 2, SHA2)
    accept(node, old, 1, SHA1)
    accept(node, new, 2, SHA2)
    with pytest.raises(DirectiveError, match="seq 5 is older than seq 9"):
        node.check(*old, "tiny", 1, SHA1)
    again = Directives(tmp_path, "n1", node.verifier)  # a restarted node
    with pytest.raises(DirectiveError, match="older"):
        again.check(*old, "tiny", 1, SHA1)
    rollback = signed(12, 1, SHA1)  # a real rollback: a new audit record, a higher seq
    accept(again, rollback, 1, SHA1)
    assert json.loads((tmp_path / directive.FILE).read_text())["tiny"]["seq"] == 12
    accept(again, rollback, 1, SHA1)  # the same push again (a reconnect) is fine


def test_the_same_seq_for_another_release_is_refused(node: Directives) -> None:
    accept(node, signed(9, 2, SHA2), 2, SHA2)
    with pytest.raises(DirectiveError, match="older"):
        node.check(*signed(9, 1, SHA1), "tiny", 1, SHA1)


@pytest.mark.parametrize(("data", "match"), [
    ((b"", b""), "no signed directive"),
    ((signed(5)[0], b""), "signature rejected"),
    ((signed(5)[0], signed(6)[1]), "does not verify"),
    (signed(5, signer=Signer(Ed25519PrivateKey.generate())), "does not verify"),
    (signed(5, node="n2"), "for node 'n2'"),
    (signed(5, version=2), "not this release"),
    (signed(5, sha=SHA2), "not this release"),
])
def test_a_missing_forged_or_misdirected_directive_is_refused(
        node: Directives, data: tuple[bytes, bytes], match: str) -> None:
    with pytest.raises(DirectiveError, match=match):
        node.check(*data, "tiny", 1, SHA1)


@pytest.mark.parametrize("body", [b"[]", b"{}", b"not json", json.dumps(
    {"kind": directive.KIND, "node_id": "n1", "model": "tiny", "version": "1",
     "manifest_sha256": SHA1, "seq": 1, "head": HEAD}).encode(), json.dumps(
    {"kind": "tiered-audit-head-v1", "seq": 1, "hash": HEAD}).encode()])
def test_a_signed_but_malformed_directive_is_refused(node: Directives, body: bytes) -> None:
    with pytest.raises(DirectiveError, match="unreadable directive"):
        node.check(body, SIGNER.sign(body), "tiny", 1, SHA1)


def test_a_damaged_floor_file_is_said_and_starts_over(tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / directive.FILE).write_text("{broken")
    node = Directives(tmp_path, "n1", Verifier(SIGNER.key.public_key()))
    assert node.accepted == {} and "unreadable" in caplog.text
