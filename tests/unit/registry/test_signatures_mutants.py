"""Signing after publish (``registry.releases.signatures``) as the audit log and a node see
it: only the named version signed, each signature over its own stored bytes, audited with its
key and digest. The tests that kill `make mutate`'s mutants the older tests let through."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from registry.errors import NotFound, RegistryError
from registry.releases.catalog import Catalog
from registry.settings import RegistrySettings
from registry.store import chain
from registry.store.db import connect, transaction
from registry.trust import keys, tuf
from registry.trust.keys import Signer
from serving.errors import SigningError
from serving.release.signing import Verifier
from tests.unit.registry.test_rollout import manifest
from tests.unit.registry.test_trust import Fleet, fleet, new_key, send

__all__ = ["fleet"]  # the fixture, imported


def test_signing_one_version_signs_it_alone_and_audits_its_key_and_digest(
        tmp_path: Path) -> None:
    catalog = Catalog(connect(tmp_path / "r.sqlite3"), "tester")
    for seed in range(3):
        catalog.create_version(manifest(seed=seed))
    signer = keys.signer(RegistrySettings(home=tmp_path / "reg"))
    assert catalog.sign("m", signer, 2) == ([2], None)
    assert [v.signature is not None for v in catalog.versions("m")] == [False, True, False]
    (record,) = [r for r in chain.records(catalog.db) if r.action == "sign"]
    row = catalog.resolve("m", "2")
    assert (record.actor, record.model, record.version, record.sha256) == \
        ("tester", "m", 2, row.manifest_sha256)
    assert json.loads(record.payload) == {"key_id": signer.key_id}
    Verifier(signer.key.public_key()).check(row.manifest_bytes, row.signature)
    assert row.key_id == signer.key_id
    with pytest.raises(RegistryError, match="m version 2 is signed already"):
        catalog.sign("m", signer, 2)
    assert catalog.sign("m", signer) == ([1, 3], None)  # the rest, in order
    for v in catalog.versions("m"):
        Verifier(signer.key.public_key()).check(v.manifest_bytes, v.signature)
    with pytest.raises(NotFound, match="m has no version 4"):
        catalog.sign("m", signer, 4)
    with pytest.raises(NotFound, match="no model named 'other'"):
        catalog.sign("other", signer)


# k-of-n publishing: a registry with a TUF root whose targets role two publishers hold at
# threshold 2 (``tests.unit.registry.test_trust``'s fleet); what `registry sign` approves, what
# it leaves waiting, and what a node then installs.

def sign_targets_records(fleet: Fleet) -> list[tuple[str, str | None, dict[str, object]]]:
    return [(r.actor, r.model, json.loads(r.payload)) for r in chain.records(fleet.db)
            if r.action == "sign-targets"]


def two_publishers(fleet: Fleet) -> Signer:
    """Root and targets made by ``fleet.key``; the targets role rotated to it and a second key
    at threshold 2 (both sign the re-signed targets, so nothing waits yet)."""
    tuf.ensure(fleet.db, fleet.key, fleet.key.key.public_key())
    second = new_key()
    with transaction(fleet.db) as conn:
        tuf.rotate(conn, "targets", [fleet.key.key.public_key(), second.key.public_key()], 2,
                   [fleet.key], [fleet.key, second])
    return second


def pending(fleet: Fleet) -> dict[str, object] | None:
    with transaction(fleet.db) as conn:
        return tuf.pending(conn)


def test_signing_an_old_unsigned_version_lists_it_in_the_tuf_targets_a_node_trusts(
        fleet: Fleet) -> None:
    fleet.catalog.create_version(manifest())  # published before signing existed
    tuf.ensure(fleet.db, fleet.key, fleet.key.key.public_key())
    fleet.advance()
    node = fleet.node()
    send(node, fleet.push())
    with pytest.raises(SigningError, match="not in the trusted TUF targets"):
        node.check_release(*fleet.release("m", 1))
    assert fleet.catalog.sign("m", fleet.key) == ([1], None)  # nothing awaited signatures
    fleet.advance()
    send(node, fleet.push())
    node.check_release(*fleet.release("m", 1))
    assert sign_targets_records(fleet) == []


def test_a_publishers_sign_approves_only_the_named_release_of_the_waiting_targets(
        fleet: Fleet) -> None:
    fleet.publish("x")  # signed and trusted before the second publisher
    second = two_publishers(fleet)
    fleet.publish("m")
    fleet.publish("m", seed=1)
    assert pending(fleet) == {"version": 4, "signed": 1, "threshold": 2,
                              "releases": ["m@1", "m@2"]}
    # another model's sign approves nothing it does not hold
    assert fleet.catalog.sign("x", second) == ([], None)
    with pytest.raises(RegistryError, match=r"x version 1 is signed already \(and no targets "
                                            r"metadata awaits signatures for it\)"):
        fleet.catalog.sign("x", second, 1)
    assert pending(fleet) == {"version": 4, "signed": 1, "threshold": 2,
                              "releases": ["m@1", "m@2"]}
    assert sign_targets_records(fleet) == []
    signed, verdict = fleet.catalog.sign("m", second, 1)
    assert signed == [] and verdict is not None
    assert (verdict.version, verdict.complete, verdict.missing) == (4, True, 0)
    assert pending(fleet) is None
    assert sign_targets_records(fleet) == [
        ("tester", "m", {"key_id": second.key_id, "targets_version": 4, "releases": ["m@1"],
                         "complete": True, "missing": 0})]
    fleet.advance()
    node = fleet.node()
    send(node, fleet.push())
    for name, version in (("m", 1), ("m", 2), ("x", 1)):
        node.check_release(*fleet.release(name, version))


def test_a_sign_naming_no_version_approves_every_release_of_the_model_waiting(
        fleet: Fleet) -> None:
    second = two_publishers(fleet)
    fleet.publish("m")
    fleet.publish("m", seed=1)
    fleet.publish("mm")  # a model whose name starts with the other's
    signed, verdict = fleet.catalog.sign("m", second)
    assert signed == [] and verdict is not None and verdict.complete
    (record,) = sign_targets_records(fleet)
    assert record[2]["releases"] == ["m@1", "m@2"]


def test_a_sign_short_of_the_threshold_is_audited_with_how_many_are_missing(
        fleet: Fleet) -> None:
    tuf.ensure(fleet.db, fleet.key, fleet.key.key.public_key())
    second, third = new_key(), new_key()
    with transaction(fleet.db) as conn:
        tuf.rotate(conn, "targets", [k.key.public_key() for k in (fleet.key, second, third)],
                   3, [fleet.key], [fleet.key, second, third])
    fleet.publish("m")
    signed, verdict = fleet.catalog.sign("m", second, 1)
    assert signed == [] and verdict is not None
    assert (verdict.complete, verdict.missing) == (False, 1)
    assert sign_targets_records(fleet) == [
        ("tester", "m", {"key_id": second.key_id, "targets_version": 3, "releases": ["m@1"],
                         "complete": False, "missing": 1})]
    assert pending(fleet) == {"version": 3, "signed": 2, "threshold": 3, "releases": ["m@1"]}


def test_a_rotation_waiting_for_a_publisher_is_approved_by_any_models_sign(
        fleet: Fleet) -> None:
    tuf.ensure(fleet.db, fleet.key, fleet.key.key.public_key())
    fleet.publish("m")
    second = new_key()
    with transaction(fleet.db) as conn:
        tuf.rotate(conn, "targets", [fleet.key.key.public_key(), second.key.public_key()], 2,
                   [fleet.key], [fleet.key])
    assert pending(fleet) == {"version": 3, "signed": 1, "threshold": 2, "releases": []}
    signed, verdict = fleet.catalog.sign("m", second, 1)
    assert signed == [] and verdict is not None and verdict.complete
    assert sign_targets_records(fleet) == [
        ("tester", "m", {"key_id": second.key_id, "targets_version": 3, "releases": [],
                         "complete": True, "missing": 0})]
