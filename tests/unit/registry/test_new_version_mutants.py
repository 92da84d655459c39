"""Publishing a version (``registry.releases.new_version``) as the catalog, the audit log and a
node see it: numbered N+1 per model whatever the manifest says, its rows and blobs stored, its
publish audited with the digest, destination and artifacts (and the key and TUF targets version
when signed), and sent out: production, a canary, or the first wave of a rollout that supersedes
the one before. The tests that kill `make mutate`'s mutants the older tests let through."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import msgspec
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from registry.errors import RegistryError
from registry.releases import waves
from registry.releases.catalog import Catalog
from registry.store import chain
from registry.store.db import connect
from registry.trust import tuf
from registry.trust.keys import Signer
from tests.unit.registry.test_rollout import CENTER, EU_EDGE, US_EDGE, catalog, manifest
from tests.unit.registry.test_waves import FAST

__all__ = ["catalog"]  # the fixture, imported


def publishes(c: Catalog) -> list[chain.Record]:
    return [r for r in chain.records(c.db) if r.action == "publish"]


def artifacts(c: Catalog, version: int) -> dict[str, str]:
    return dict(c.db.execute("SELECT role, sha256 FROM artifacts WHERE model = 'm' AND "
                             "version = ? ORDER BY role", [version]).fetchall())


def test_versions_are_numbered_per_model_from_one_whatever_the_manifest_says(
        catalog: Catalog) -> None:
    m = msgspec.structs.replace(manifest(), version=41)
    assert catalog.create_version(m) == 1
    assert catalog.create_version(manifest(seed=1)) == 2
    assert catalog.create_version(manifest("other")) == 1  # another model: its own numbers
    assert catalog.create_version(manifest(seed=2)) == 3
    assert [v.version for v in catalog.versions("m")] == [1, 2, 3]
    assert [v.manifest.version for v in catalog.versions("m")] == [1, 2, 3]  # as stored
    assert [v.version for v in catalog.versions("other")] == [1]


def test_a_publish_to_production_is_audited_with_its_digest_and_artifacts_and_stored(
        catalog: Catalog) -> None:
    catalog.create_version(manifest(seed=3))
    row = catalog.resolve("m", "1")
    digest = hashlib.sha256(row.manifest_bytes).hexdigest()
    (record,) = publishes(catalog)
    assert (record.actor, record.model, record.version, record.sha256) == \
        ("tester", "m", 1, digest)
    edge, center = "03on".ljust(64, "0"), "03to".ljust(64, "0")
    assert json.loads(record.payload) == {
        "manifest_sha256": digest, "alias": "production", "targets": ["*"],
        "artifacts": {"center": center, "edge": edge}}
    assert row.manifest_sha256 == digest and row.publisher == "t"
    assert json.loads(row.manifest_bytes)["version"] == 1
    assert catalog.db.execute("SELECT source_sha256, created_at FROM versions WHERE model = "
                              "'m'").fetchone() == ("3", "now")
    assert artifacts(catalog, 1) == {"center": center, "edge": edge}
    assert catalog.artifact_size(edge) == 10 and catalog.artifact_size(center) == 10
    assert [m["name"] for m in catalog.models()] == ["m"]
    assert row.aliases == ["production"] and row.signature is None
    assert [(r["alias"], r["version"], json.loads(r["targets"])) for r in catalog.rollouts("m")] \
        == [("production", 1, ["*"])]


def test_a_canary_publish_targets_only_its_nodes_and_says_so_in_the_audit(
        catalog: Catalog) -> None:
    catalog.create_version(manifest())
    catalog.create_version(manifest(seed=1), canary=["edge-1", "tier:center"])
    payload = json.loads(publishes(catalog)[-1].payload)
    assert (payload["alias"], payload["targets"]) == ("canary", ["edge-1", "tier:center"])
    assert "waves" not in payload
    assert catalog.alias("m", "canary") == 2 and catalog.alias("m", "production") == 1
    assert {n.node_id: catalog.desired(n)[0].version for n in (EU_EDGE, US_EDGE, CENTER)} == \
        {"edge-1": 2, "edge-2": 1, "center-1": 2}


def test_an_empty_canary_list_is_a_production_publish(catalog: Catalog) -> None:
    catalog.create_version(manifest(), canary=[])
    payload = json.loads(publishes(catalog)[-1].payload)
    assert (payload["alias"], payload["targets"]) == ("production", ["*"])
    assert catalog.alias("m", "production") == 1 and catalog.alias("m", "canary") is None


def test_a_publish_in_waves_records_its_policy_and_starts_from_production(
        catalog: Catalog) -> None:
    catalog.create_version(manifest())
    before = time.time()
    new = catalog.create_version(manifest(seed=1), rollout=FAST)
    payload = json.loads(publishes(catalog)[-1].payload)
    assert (payload["alias"], payload["targets"]) == ("wave", [])
    assert msgspec.convert(payload["waves"], waves.WavePolicy) == FAST  # the whole policy
    assert catalog.alias("m", "production") == 1  # production moves only after the last wave
    r = waves.latest(catalog.db.conn, "m")
    assert r is not None
    assert (r.model, r.version, r.previous, r.policy, r.state, r.wave, r.cutoff) == \
        ("m", new, 1, FAST, "running", 0, 0.0)
    assert before <= r.wave_started <= time.time()


def test_a_publish_supersedes_the_unfinished_rollout_and_audits_it_as_the_publisher(
        catalog: Catalog) -> None:
    catalog.create_version(manifest())
    rolling = catalog.create_version(manifest(seed=1), rollout=FAST)
    newer = catalog.create_version(manifest(seed=2), rollout=FAST)
    (first,) = waves.unfinished(catalog.db.conn, "m")
    assert first.version == newer
    ended = catalog.db.execute("SELECT state, reason FROM waves WHERE version = ?",
                               [rolling]).fetchone()
    assert tuple(ended) == ("superseded", f"version {newer} was published")
    (record,) = [r for r in chain.records(catalog.db) if r.action == "rollout-superseded"]
    assert (record.actor, record.model, record.version) == ("tester", "m", rolling)
    assert json.loads(record.payload) == {"wave": 1, "reason": f"version {newer} was published"}
    assert first.previous == 1  # still judged against production, not the superseded one


def test_canary_and_waves_together_are_refused_with_the_whole_reason(catalog: Catalog) -> None:
    with pytest.raises(RegistryError) as refused:
        catalog.create_version(manifest(), canary=["edge-1"], rollout=FAST)
    assert str(refused.value) == "a release goes out to a canary or in waves, not both"
    assert catalog.models() == [] and list(chain.records(catalog.db)) == []
    with pytest.raises(RegistryError, match="invalid"):
        catalog.create_version(manifest("Bad Name!"))


def test_a_signed_publish_stores_the_signature_and_lists_it_in_the_tuf_targets(
        tmp_path: Path) -> None:
    key = Signer(Ed25519PrivateKey.generate())
    catalog = Catalog(connect(tmp_path / "r.sqlite3"), "tester")
    catalog.create_version(manifest(), signer=key)  # no TUF root yet: signed the old way
    assert json.loads(publishes(catalog)[-1].payload)["key_id"] == key.key_id
    assert "tuf_targets" not in json.loads(publishes(catalog)[-1].payload)
    assert tuf.ensure(catalog.db, key, key.key.public_key())
    for seed, expected in ((1, 2), (2, 3)):
        catalog.create_version(manifest(seed=seed), signer=key)
        record = publishes(catalog)[-1]
        assert json.loads(record.payload) == {
            "manifest_sha256": record.sha256, "alias": "production", "targets": ["*"],
            "artifacts": artifacts(catalog, seed + 1), "key_id": key.key_id,
            "tuf_targets": {"version": expected, "complete": True, "missing": 0}}
    stored = tuf.latest(catalog.db.conn, tuf.TARGETS)
    assert stored is not None
    assert tuf.releases(stored.md.signed) >= {("m", 2), ("m", 3)}
    row = catalog.resolve("m", "3")
    assert row.key_id == key.key_id and row.signature
    (target,) = catalog.desired(EU_EDGE)
    assert (target.version, target.key_id, target.signature) == (3, key.key_id, row.signature)

