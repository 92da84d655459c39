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
from registry.store.db import connect
from registry.trust import keys
from serving.release.signing import Verifier
from tests.unit.registry.test_rollout import manifest


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
