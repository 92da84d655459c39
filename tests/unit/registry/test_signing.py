"""The registry side of signed releases: the signing key, signatures stored with each version
and sent with each release, audited refusals, and release folders that try to escape."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from registry.errors import InvalidRelease, RegistryError, SigningKeyError
from registry.fleet import nodes as node_writes
from registry.fleet.nodes import NodeBook
from registry.publish.source import load_source
from registry.releases.catalog import Catalog
from registry.settings import RegistrySettings
from registry.store import chain
from registry.store.db import connect
from registry.trust import keys
from serving.release.signing import SigningError, Verifier, load_public_key
from tests.unit.registry.test_rollout import EU_EDGE, manifest


def settings(home: Path, key: Path | None = None) -> RegistrySettings:
    return RegistrySettings(home=home, signing_key=key)


def test_the_default_key_is_created_once_owner_only(tmp_path: Path) -> None:
    s = settings(tmp_path / "reg")
    first = keys.signer(s)
    private = tmp_path / "reg" / "keys" / "signing.key"
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert keys.signer(s).key_id == first.key_id  # loaded, not replaced
    public = keys.public_key(s)
    assert public.public_path == tmp_path / "reg" / "keys" / "signing.pub"
    assert Verifier(load_public_key(public.public_path)).key_id == first.key_id


def test_publishers_making_the_first_key_at_once_all_sign_with_the_one_that_won(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three first publishes at once (seen in CI: one failed with "exists already" or read the
    key half written). Each generates only once all have found no key, so all race to write."""
    s = settings(tmp_path / "reg")
    ready = threading.Barrier(3, timeout=10)
    generate = Ed25519PrivateKey.generate

    def together() -> Ed25519PrivateKey:
        ready.wait()
        return generate()

    monkeypatch.setattr(keys.Ed25519PrivateKey, "generate", together)
    with ThreadPoolExecutor(3) as pool:
        ids = list(pool.map(lambda _: keys.signer(s).key_id, range(3)))
    monkeypatch.undo()
    assert len(set(ids)) == 1 and keys.signer(s).key_id == ids[0]
    assert Verifier(load_public_key(keys.public_key(s).public_path)).key_id == ids[0]
    assert sorted(p.name for p in (tmp_path / "reg" / "keys").iterdir()) == \
        ["signing.key", "signing.pub"]  # no temporary left behind


def test_a_configured_key_that_is_missing_is_an_error_not_a_new_key(tmp_path: Path) -> None:
    missing = tmp_path / "typo.key"
    with pytest.raises(SigningKeyError, match="no such file"):
        keys.signer(settings(tmp_path / "reg", missing))
    assert not missing.exists() and not (tmp_path / "reg" / "keys").exists()


def test_keygen_never_overwrites(tmp_path: Path) -> None:
    made = keys.keygen(tmp_path / "k")
    with pytest.raises(SigningKeyError, match="exists already"):
        keys.keygen(tmp_path / "k")
    assert keys.signer(settings(tmp_path, made.private_path)).key_id == made.key_id


def test_publish_signs_the_stored_bytes_and_audits_the_key(tmp_path: Path) -> None:
    s = settings(tmp_path)
    catalog = Catalog(connect(s.database), "tester")
    signer = keys.signer(s)
    catalog.create_version(manifest(), signer=signer)
    row = catalog.resolve("m", "1")
    verifier = Verifier(signer.key.public_key())
    verifier.check(row.manifest_bytes, row.signature)
    assert row.key_id == signer.key_id
    (target,) = catalog.desired(EU_EDGE)
    assert target.manifest == row.manifest_bytes and target.key_id == signer.key_id
    verifier.check(target.manifest, target.signature)
    (record,) = chain.records(catalog.db)
    assert json.loads(record.payload)["key_id"] == signer.key_id
    with pytest.raises(sqlite3.IntegrityError, match="immutable"):
        catalog.db.execute("UPDATE signatures SET signature = 'x'")


def test_unsigned_versions_can_be_signed_once(tmp_path: Path) -> None:
    catalog = Catalog(connect(tmp_path / "r.sqlite3"), "tester")
    catalog.create_version(manifest())
    assert catalog.resolve("m", "1").signature is None
    assert catalog.desired(EU_EDGE)[0].signature == b""
    signer = keys.signer(settings(tmp_path))
    assert catalog.sign("m", signer) == ([1], None)
    assert catalog.sign("m", signer) == ([], None)
    with pytest.raises(RegistryError, match="signed already"):
        catalog.sign("m", signer, 1)
    row = catalog.resolve("m", "1")
    Verifier(signer.key.public_key()).check(row.manifest_bytes, row.signature)
    assert [r.action for r in chain.records(catalog.db)] == ["publish", "sign"]


def test_a_refused_release_is_audited_as_its_own_action(tmp_path: Path) -> None:
    catalog = Catalog(connect(tmp_path / "r.sqlite3"), "tester")
    catalog.create_version(manifest())
    nodes = NodeBook(catalog.db)
    nodes.write([node_writes.hello(EU_EDGE, "ipv4:127.0.0.1:1", [])])
    nodes.write([node_writes.ack(EU_EDGE, "m", 1, "FAILED", "TransferError: broken")])
    nodes.write([node_writes.ack(EU_EDGE, "m", 1, "REFUSED", "release signature does not verify")])
    actions = [(r.action, json.loads(r.payload).get("reason")) for r in chain.records(catalog.db)]
    assert actions[1:] == [("ack", "TransferError: broken"),
                           ("refused", "refused: release signature does not verify")]
    (row,) = nodes.status(catalog)
    assert row["state"] == "FAILED" and "signature does not verify" in row["reason"]


# -- release folders that reach outside themselves ---------------------------------------

SPEC = {"labels": ["neg", "pos"], "center": "center.pt", "edge": "edge.pt"}


def folder(tmp_path: Path, **spec: str) -> Path:
    root = tmp_path / "release"
    root.mkdir()
    (root / "center.pt").write_bytes(b"c")
    (root / "edge.pt").write_bytes(b"e")
    (root / "tiered.json").write_text(json.dumps({**SPEC, **spec}))
    (tmp_path / "secret.pt").write_bytes(b"outside")
    return root


@pytest.mark.parametrize("name", ["../secret.pt", "sub/../../secret.pt", "", "a\nb.pt",
                                  "a\\..\\secret.pt"])
def test_relative_escapes_are_refused(tmp_path: Path, name: str) -> None:
    root = folder(tmp_path, center=name)
    with pytest.raises(InvalidRelease, match="plain relative paths"):
        load_source(root)


def test_absolute_paths_are_refused(tmp_path: Path) -> None:
    root = folder(tmp_path, edge=str(tmp_path / "secret.pt"))
    with pytest.raises(InvalidRelease, match="plain relative paths"):
        load_source(root)


def test_symlinks_are_refused_wherever_they_are(tmp_path: Path) -> None:
    root = folder(tmp_path, center="link.pt", edge="sub/edge.pt")
    (root / "link.pt").symlink_to(root / "center.pt")  # even one pointing inside
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "edge.pt").write_bytes(b"e")
    (root / "sub").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(InvalidRelease, match="symlinks are not accepted"):
        load_source(root)
    (root / "link.pt").unlink()
    (root / "tiered.json").write_text(json.dumps({**SPEC, "edge": "sub/edge.pt"}))
    with pytest.raises(InvalidRelease, match=r"sub: symlinks are not accepted"):
        load_source(root)


def test_the_spec_itself_must_not_be_a_symlink(tmp_path: Path) -> None:
    root = folder(tmp_path)
    (tmp_path / "spec.json").write_text(json.dumps(SPEC))
    (root / "tiered.json").unlink()
    (root / "tiered.json").symlink_to(tmp_path / "spec.json")
    with pytest.raises(InvalidRelease, match="symlinks are not accepted"):
        load_source(root)


def test_non_regular_files_are_refused(tmp_path: Path) -> None:
    root = folder(tmp_path, center="fifo.pt", edge="dir.pt")
    os.mkfifo(root / "fifo.pt")
    (root / "dir.pt").mkdir()
    with pytest.raises(InvalidRelease, match="not a regular file"):
        load_source(root)
    with pytest.raises(InvalidRelease, match="not a regular file"):
        load_source(root / "fifo.pt")  # a single "TorchScript file" that is a FIFO


def test_a_node_key_error_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(SigningError, match=r"missing\.pub"):
        load_public_key(tmp_path / "missing.pub")
