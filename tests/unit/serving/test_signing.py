"""Release signatures on the node side: keys, sign/verify, a store that checks them, and the
manifest checks that keep every file name inside its version folder."""

from __future__ import annotations

import hashlib
import stat
from pathlib import Path

import msgspec
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from registry.trust.keys import Signer, generate_key_pair, load_private_key
from serving.release.manifest import Manifest, encode, is_valid_name
from serving.release.signing import SigningError, Verifier, key_id, load_public_key
from serving.release.store import (
    SIGNATURE,
    InstalledReleases,
    ModelStore,
    StoreError,
    check_release,
)
from tests.unit.serving.test_store import manifest, write_good


def pair() -> tuple[Signer, Verifier]:
    key = Ed25519PrivateKey.generate()
    return Signer(key), Verifier(key.public_key())


def test_a_signature_verifies_only_for_its_bytes_and_its_key() -> None:
    signer, verifier = pair()
    body = encode(manifest())
    signature = signer.sign(body)
    verifier.check(body, signature)
    with pytest.raises(SigningError, match="does not verify"):
        verifier.check(body.replace(b"0.9", b"0.1"), signature)
    other, _ = pair()
    with pytest.raises(SigningError, match=rf"trusted key {verifier.key_id} \(signed by key "
                                           rf"{other.key_id}\)"):
        verifier.check(body, other.sign(body), other.key_id)
    for missing in (None, b""):
        with pytest.raises(SigningError, match="not signed"):
            verifier.check(body, missing)
    with pytest.raises(SigningError, match="63 bytes"):
        verifier.check(body, signature[:-1])


def test_key_files_round_trip_with_a_private_key_only_its_owner_reads(tmp_path: Path) -> None:
    private, public = tmp_path / "keys" / "signing.key", tmp_path / "keys" / "signing.pub"
    key = generate_key_pair(private, public)
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert key_id(load_public_key(public)) == key_id(key.public_key()) == \
        key_id(load_private_key(private).public_key())
    assert len(key_id(key.public_key())) == 16
    with pytest.raises(SigningError, match="exists already"):
        generate_key_pair(private, public)
    assert key_id(load_private_key(private).public_key()) == key_id(key.public_key())
    ssh = tmp_path / "id.pub"
    ssh.write_bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                  serialization.PublicFormat.OpenSSH))
    assert key_id(load_public_key(ssh)) == key_id(key.public_key())


def test_unusable_key_files_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(SigningError, match="no such file"):
        load_public_key(tmp_path / "missing.pub")
    garbage = tmp_path / "garbage.pub"
    garbage.write_text("hello")
    with pytest.raises(SigningError, match="not a PEM"):
        load_public_key(garbage)
    ec_key = tmp_path / "ec.pub"
    ec_key.write_bytes(ec.generate_private_key(ec.SECP256R1()).public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    with pytest.raises(SigningError, match="Ed25519"):
        load_public_key(ec_key)


def signed_store(tmp_path: Path) -> tuple[ModelStore, Signer, Path]:
    signer, verifier = pair()
    store = ModelStore(tmp_path, verifier)
    body = encode(manifest())
    folder = store.install(manifest(), "edge", write_good, raw=body,
                           signature=signer.sign(body))
    return store, signer, folder


def test_store_keeps_the_signed_bytes_and_verifies_them(tmp_path: Path) -> None:
    store, _, folder = signed_store(tmp_path)
    assert (folder / "release.json").read_bytes() == encode(manifest())
    assert (folder / SIGNATURE).is_file()
    assert store.verify("sentiment", 1, "edge") == manifest()
    assert store.complete(manifest(), "edge")


def test_store_refuses_unsigned_and_foreign_releases_before_fetching(tmp_path: Path) -> None:
    _, verifier = pair()
    store = ModelStore(tmp_path, verifier)
    fetched: list[str] = []

    def fetch(artifact: object, destination: Path) -> None:
        fetched.append(str(destination))

    other, _ = pair()
    body = encode(manifest())
    for signature in (None, other.sign(body)):
        with pytest.raises(StoreError, match=r"not signed|does not verify"):
            store.install(manifest(), "edge", fetch, raw=body, signature=signature)
    assert fetched == [] and not (tmp_path / "sentiment").exists()


def test_an_edited_manifest_is_not_verified(tmp_path: Path) -> None:
    store, _, folder = signed_store(tmp_path)
    path = folder / "release.json"
    path.write_bytes(path.read_bytes().replace(b'"threshold": 0.9', b'"threshold": 0.1'))
    with pytest.raises(StoreError, match="does not verify"):
        store.verify("sentiment", 1, "edge")
    assert not store.complete(manifest(), "edge")
    assert InstalledReleases(tmp_path).verify("sentiment", 1, "edge")  # unchecked without a key


def test_a_swapped_file_with_a_rehashed_manifest_is_not_verified(tmp_path: Path) -> None:
    store, _, folder = signed_store(tmp_path)
    evil = b"evil onnx"
    (folder / "model.onnx").write_bytes(evil)
    rehashed = msgspec.structs.replace(manifest(), edge=msgspec.structs.replace(
        manifest().edge, sha256=hashlib.sha256(evil).hexdigest(), size=len(evil)))
    (folder / "release.json").write_bytes(encode(rehashed))
    with pytest.raises(StoreError, match="does not verify"):
        store.verify("sentiment", 1, "edge")
    (folder / SIGNATURE).unlink()
    with pytest.raises(StoreError, match="not signed"):
        store.verify("sentiment", 1, "edge")


def _with_file(role: str, name: str) -> Manifest:
    m = manifest()
    artifact = msgspec.structs.replace(getattr(m, role), file=name)
    return msgspec.structs.replace(m, **{role: artifact})


@pytest.mark.parametrize("name", ["../x.onnx", "/etc/passwd", "a/b.onnx", "..", ".", "",
                                  ".hidden", "release.json", "release.sig", "a\\b",
                                  "model\x00.onnx", "modèl.onnx", "x" * 200, " model.onnx"])
def test_unsafe_artifact_file_names_are_refused(tmp_path: Path, name: str) -> None:
    for role in ("edge", "center", "tokenizer"):
        with pytest.raises(StoreError, match="unsafe artifact file name"):
            check_release(_with_file(role, name))
    with pytest.raises(StoreError, match="unsafe"):
        ModelStore(tmp_path).install(_with_file("edge", name), "edge", write_good)
    assert list(tmp_path.iterdir()) in ([], [tmp_path / "sentiment"])
    assert not (tmp_path.parent / "x.onnx").exists()


def test_the_tokenizer_loaded_must_be_the_verified_artifact(tmp_path: Path) -> None:
    m = manifest()
    for name in ("../../etc/passwd", "other.json", "model.onnx"):
        bad = msgspec.structs.replace(m, preprocessing=msgspec.structs.replace(
            m.preprocessing, tokenizer=name))
        with pytest.raises(StoreError, match="tokenizer"):
            check_release(bad)
    shared = _with_file("tokenizer", "model.onnx")
    with pytest.raises(StoreError, match="share one file name"):
        check_release(shared)
    # a store whose release.json was edited to point elsewhere is not loaded either
    store = ModelStore(tmp_path)
    folder = store.install(m, "edge", write_good)
    (folder / "release.json").write_bytes(encode(msgspec.structs.replace(
        m, preprocessing=msgspec.structs.replace(m.preprocessing, tokenizer="../../x"))))
    with pytest.raises(StoreError, match="tokenizer"):
        store.verify("sentiment", 1, "edge")
    assert store.find(m.edge.sha256) is None


@pytest.mark.parametrize("name", ["../etc", "a/b", "/abs", ".hidden", "tiny\n", "tiny\x00",
                                  "ｔiny", "tiny\u200b", "tİny", "x" * 129, "a..b", "Tiny", ""])
def test_model_names_refuse_path_and_unicode_tricks(name: str) -> None:
    assert not is_valid_name(name)
    with pytest.raises(StoreError, match="unsafe model name"):
        check_release(msgspec.structs.replace(manifest(), name=name))


def test_good_names_pass() -> None:
    for name in ("tiny", "sentiment-v2", "a.b_c", "x" * 128):
        assert is_valid_name(name)
