"""Signed retire directives on the node side: a node unloads a model only on the registry's
signature, for this node and this model, newer than every directive it accepted for the model;
after a retire, no older release (or retire) is taken back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from registry.trust.keys import Signer
from serving.release.signing import Verifier
from sync.wire import directive, retire
from sync.wire.directive import Directive, DirectiveError, Directives
from sync.wire.retire import RetireDirective

SHA1, SHA2, HEAD = "1" * 64, "2" * 64, "a" * 64
SIGNER = Signer(Ed25519PrivateKey.generate())


def told(seq: int, node: str = "n1", model: str = "tiny",
         signer: Signer = SIGNER) -> tuple[bytes, bytes]:
    return retire.sign(signer, RetireDirective(node, model, seq, HEAD))


def release(seq: int, version: int = 1, sha: str = SHA1) -> tuple[bytes, bytes]:
    return directive.sign(SIGNER, Directive("n1", "tiny", version, sha, seq, HEAD))


@pytest.fixture
def node(tmp_path: Path) -> Directives:
    """A node that accepted version 1 of ``tiny`` at seq 10."""
    directives = Directives(tmp_path, "n1", Verifier(SIGNER.key.public_key()), floor=3)
    directives.accept(directives.check(*release(10), "tiny", 1, SHA1))
    return directives


def test_a_newer_retire_is_obeyed_and_remembered_across_a_restart(node: Directives,
                                                                  tmp_path: Path) -> None:
    made = retire.check(node, *told(11), "tiny")
    assert (made.node_id, made.model, made.seq) == ("n1", "tiny", 11)
    retire.accept(node, made)
    kept = json.loads((tmp_path / directive.FILE).read_text())["tiny"]
    assert kept == {"seq": 11, "version": 0, "manifest_sha256": ""}
    again = Directives(tmp_path, "n1", node.verifier, floor=3)  # a restarted node
    with pytest.raises(DirectiveError, match="seq 11 is not newer than seq 11"):
        retire.check(again, *told(11), "tiny")  # the same retire replayed


@pytest.mark.parametrize(("seq", "obeyed"), [(9, False), (10, False), (11, True)])
def test_a_retire_must_be_newer_than_the_release_the_node_runs(node: Directives, seq: int,
                                                               obeyed: bool) -> None:
    if obeyed:
        assert retire.check(node, *told(seq), "tiny").seq == seq
    else:
        with pytest.raises(DirectiveError, match=f"seq {seq} is not newer than seq 10"):
            retire.check(node, *told(seq), "tiny")


def test_a_retire_below_the_provisioning_floor_is_refused_for_a_model_never_seen(
        node: Directives) -> None:
    with pytest.raises(DirectiveError, match="older than seq 3"):
        retire.check(node, *told(2, model="other"), "other")
    assert retire.check(node, *told(3, model="other"), "other").seq == 3


@pytest.mark.parametrize(("data", "match"), [
    ((b"", b""), "no signed directive"),
    ((told(11)[0], b""), "signature rejected"),
    ((told(11)[0], told(12)[1]), "signature rejected"),
    (told(11, signer=Signer(Ed25519PrivateKey.generate())), "signature rejected"),
    (told(11, node="n2"), "is for node 'n2', this is 'n1'"),
    (told(11, model="other"), "names 'other', not 'tiny'"),
    # a release directive is no retire, however fresh and well signed
    (release(11), "unreadable retire directive"),
])
def test_an_unsigned_forged_or_misaddressed_retire_is_refused(
        node: Directives, data: tuple[bytes, bytes], match: str) -> None:
    with pytest.raises(DirectiveError, match=match):
        retire.check(node, *data, "tiny")


def test_a_node_that_verifies_nothing_unloads_nothing() -> None:
    with pytest.raises(DirectiveError, match="no release key"):
        retire.check(None, *told(11), "tiny")


def test_after_a_retire_only_a_newer_release_is_installed(node: Directives) -> None:
    retire.accept(node, retire.check(node, *told(11), "tiny"))
    for seq in (10, 11):  # the release it ran, replayed; one forged at the retire's seq
        with pytest.raises(DirectiveError, match="older"):
            node.check(*release(seq), "tiny", 1, SHA1)
    assert node.check(*release(12, 2, SHA2), "tiny", 2, SHA2).seq == 12  # published again
    # and a release directive is no retire either way round
    with pytest.raises(DirectiveError, match="unreadable directive"):
        node.check(*told(13), "tiny", 2, SHA2)
