"""A node started from its provisioning bundle: identity, token, certificate and CA come from
it; a setting that disagrees, or a bundle others can read, stops the node at start-up."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from pydantic import ValidationError

from center.settings import CenterSettings
from edge.settings import EdgeSettings
from registry.trust.keys import Signer
from serving.config import bundle
from serving.release.signing import Verifier
from sync.node.converge import node_directives
from sync.wire import directive
from sync.wire.directive import Directive, DirectiveError
from tiered import bundles

SECRET = "bundle-test-secret-0123456789"


@pytest.fixture
def tls(tmp_path: Path) -> Path:
    from registry.trust import pki

    pki.ca(tmp_path / "tls")
    return tmp_path / "tls"


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings without a store use the default ./var/edge: here, not in the checkout."""
    monkeypatch.chdir(tmp_path)


def edge_bundle(tmp_path: Path, tls: Path, floor: int = 0) -> Path:
    return bundles.write(tmp_path / "bundles", tls, SECRET, "edge-eu-1", "edge", "eu",
                         ("127.0.0.1",), directive_floor=floor)


def test_a_node_takes_its_identity_token_certificate_and_ca_from_its_bundle(
        tmp_path: Path, tls: Path) -> None:
    path = edge_bundle(tmp_path, tls, floor=42)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    s = EdgeSettings(bundle=path)
    b = bundle.load(path)
    assert (s.node_id, s.region, s.directive_floor) == ("edge-eu-1", "eu", 42)
    assert s.registry_token is not None and s.registry_token.get_secret_value() == b.token
    assert s.tls_cert is not None and s.tls_key is not None and s.scheme == "https"
    assert s.tls_cert.read_text() == b.cert and s.tls_key.read_text() == b.key
    assert s.tls_key.parent == tmp_path / "var" / "edge" / ".bundle"  # the node's own store
    assert stat.S_IMODE(s.tls_key.parent.stat().st_mode) == 0o700  # a private folder
    assert stat.S_IMODE(s.tls_key.stat().st_mode) == 0o600
    assert s.registry_ca == s.center_ca and s.center_ca is not None
    assert s.center_ca.read_text() == (tls / "ca.pem").read_text()
    names = x509.load_pem_x509_certificate(b.cert.encode()).extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert "edge-eu-1.edge.tiered.invalid" in names
    # the same values given again are fine; an explicit CA is kept
    again = EdgeSettings(bundle=path, node_id="edge-eu-1", region="eu", center_ca=tls / "ca.pem")
    assert again.center_ca == tls / "ca.pem"
    plain = EdgeSettings(bundle=path, serve_tls=False)
    assert plain.tls_cert is None and plain.scheme == "http" and plain.center_ca is not None


@pytest.mark.parametrize(("overrides", "match"), [
    ({"node_id": "edge-us-1"}, "node_id is 'edge-us-1' but the bundle"),
    ({"region": "us"}, "region is 'us' but the bundle"),
    ({"registry_token": "edge-eu-1.1." + "0" * 64}, "not the one in the bundle"),
    ({"tls_cert": "/etc/hostname", "tls_key": "/etc/hostname"}, "holds this node's certificate"),
])
def test_a_setting_that_disagrees_with_the_bundle_stops_the_node(
        tmp_path: Path, tls: Path, overrides: dict[str, str], match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        EdgeSettings(bundle=edge_bundle(tmp_path, tls), **overrides)


def test_an_edge_bundle_does_not_start_a_center(tmp_path: Path, tls: Path) -> None:
    with pytest.raises(ValidationError, match="'edge' bundle; this is a center"):
        CenterSettings(bundle=edge_bundle(tmp_path, tls))


def test_a_bundle_others_can_read_or_that_is_not_one_is_refused(tmp_path: Path,
                                                                 tls: Path) -> None:
    path = edge_bundle(tmp_path, tls)
    os.chmod(path, 0o644)
    with pytest.raises(ValidationError, match=r"readable by others \(mode 644\).*chmod 600"):
        EdgeSettings(bundle=path)
    os.chmod(path, 0o600)
    path.write_text('{"kind": "tiered-node-bundle-v1"}')
    with pytest.raises(ValidationError, match="is not a node bundle"):
        EdgeSettings(bundle=path)
    with pytest.raises(ValidationError, match="cannot read the bundle"):
        EdgeSettings(bundle=tmp_path / "missing.json")


def test_the_environment_names_the_bundle(tmp_path: Path, tls: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGE_BUNDLE", str(edge_bundle(tmp_path, tls)))
    assert EdgeSettings().node_id == "edge-eu-1"


def test_a_wiped_store_refuses_a_replayed_old_directive(tmp_path: Path, tls: Path) -> None:
    """A node provisioned when the audit chain was at seq 42 is shown, with an empty store
    (no ``.directives.json``), an old release's validly signed directive (seq 5): refused.
    Before bundles the first directive an empty store saw was trusted."""
    signer = Signer(Ed25519PrivateKey.generate())
    settings = EdgeSettings(bundle=edge_bundle(tmp_path, tls, floor=42), store=tmp_path / "s")
    node = node_directives(settings, settings.store, Verifier(signer.key.public_key()))
    assert node is not None and not (settings.store / directive.FILE).exists()
    sha, head = "1" * 64, "a" * 64
    old = directive.sign(signer, Directive("edge-eu-1", "tiny", 1, sha, 5, head))
    with pytest.raises(DirectiveError, match="seq 5 is older than seq 42"):
        node.check(*old, "tiny", 1, sha)
    new = directive.sign(signer, Directive("edge-eu-1", "tiny", 2, sha, 43, head))
    node.accept(node.check(*new, "tiny", 2, sha))  # what the registry pushes now is taken


def test_the_key_is_kept_in_the_nodes_store_and_replaced_at_each_start(
        tmp_path: Path, tls: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not a new temporary folder per start (a killed node left one behind, key and all,
    every time): one 0700 folder in the store, its files replaced, nothing else written."""
    path = edge_bundle(tmp_path, tls)
    store = tmp_path / "store"
    (store / ".bundle").mkdir(parents=True, mode=0o755)
    (store / ".bundle" / "key.pem").write_text("a stale key")
    (store / ".bundle" / "key.pem").chmod(0o644)
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    first = EdgeSettings(bundle=path, store=store)
    second = EdgeSettings(bundle=path, store=store)
    assert first.tls_key == second.tls_key == store / ".bundle" / "key.pem"
    assert second.tls_key.read_text() == bundle.load(path).key
    assert stat.S_IMODE((store / ".bundle").stat().st_mode) == 0o700
    assert stat.S_IMODE(second.tls_key.stat().st_mode) == 0o600
    assert sorted(p.name for p in (store / ".bundle").iterdir()) == [
        "ca.pem", "cert.pem", "key.pem"]
    assert list(temp.iterdir()) == []
    # the store still lists no model: the folder is not a model name
    assert [p.name for p in store.iterdir()] == [".bundle"]
