from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from edge.settings import EdgeSettings
from serving.config.tokens import TokenError, Verifier, check_node_token, node_token, parse

SECRET = "unit-secret-0123456789"


def test_a_token_proves_its_node_and_generation_only() -> None:
    generations = {"edge-eu-1": 1, "edge-us-1": 3}
    verifier = Verifier(SECRET, lambda node: generations.get(node, 1))
    eu = node_token(SECRET, "edge-eu-1")
    assert verifier.node(eu) == "edge-eu-1"
    assert verifier.node(node_token(SECRET, "edge-us-1", 3)) == "edge-us-1"
    assert verifier.node(node_token(SECRET, "edge-us-1", 2)) is None  # revoked generation
    assert verifier.node(node_token(SECRET, "edge-us-1", 4)) is None  # not issued yet
    node, generation, mac = eu.rsplit(".", 2)
    assert verifier.node(f"edge-us-1.{generation}.{mac}") is None  # another node's MAC
    assert verifier.node(node_token("another-secret-0123456789", "edge-eu-1")) is None
    for junk in ("", SECRET, "edge-eu-1", f"{eu}x", f"{node}.0.{mac}", eu.upper()):
        assert verifier.node(junk) is None, junk


@pytest.mark.parametrize("secret", ["", "x" * 15, " " * 20])
def test_short_secrets_are_refused(secret: str) -> None:
    with pytest.raises(ValueError, match="at least 16"):
        node_token(secret, "edge-1")
    with pytest.raises(ValueError, match="at least 16"):
        Verifier(secret, lambda _: 1)


def test_node_ids_in_tokens_may_hold_dots() -> None:
    token = node_token(SECRET, "edge.eu.1")
    assert parse(token).node_id == "edge.eu.1" and parse(token).generation == 1
    with pytest.raises(TokenError):
        node_token(SECRET, "../etc")


def test_a_node_starts_only_with_its_own_token(tmp_path: Path) -> None:
    with pytest.raises(TokenError, match="edge-b"):
        check_node_token(node_token(SECRET, "edge-b"), "edge-a")
    with pytest.raises(ValidationError, match="edge-b"):
        EdgeSettings(node_id="edge-a", registry_token=node_token(SECRET, "edge-b"))
    token_file = tmp_path / "token"
    token_file.write_text(node_token(SECRET, "edge-a") + "\n")
    settings = EdgeSettings(node_id="edge-a", registry_token_file=token_file)
    assert settings.registry_token is not None
    assert settings.registry_token.get_secret_value() == node_token(SECRET, "edge-a")


def test_center_ca_means_https_centers_only(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    for plain in ("http://127.0.0.1:8100", "https://a:8100, grpc://127.0.0.1:8101"):
        with pytest.raises(ValidationError, match="over TLS only"):
            EdgeSettings(center_ca=ca, center_url=plain)
    both = "https://127.0.0.1:8100,grpcs://127.0.0.1:8101"
    assert EdgeSettings(center_ca=ca, center_url=both).center_ca == ca


@pytest.mark.parametrize("url", ["127.0.0.1:8100", "ftp://c:1", "unix:/tmp/s", "http:/c"])
def test_a_center_url_names_its_protocol(url: str) -> None:
    with pytest.raises(ValidationError, match="expected http://, https://, grpc://"):
        EdgeSettings(center_url=url)


def test_a_mac_wrong_in_any_one_hex_digit_is_refused() -> None:
    """The whole MAC is compared, not a prefix (nor a suffix): a token whose MAC differs from
    the right one in a single hex digit, the last included, proves nothing."""
    verifier = Verifier(SECRET, lambda _: 1)
    token = node_token(SECRET, "edge-eu-1")
    assert verifier.node(token) == "edge-eu-1"
    head, _, mac = token.rpartition(".")  # the MAC is the last field, whatever comes before
    for i, digit in enumerate(mac):
        wrong = "0" if digit != "0" else "1"
        forged = f"{head}.{mac[:i]}{wrong}{mac[i + 1:]}"
        assert verifier.node(forged) is None, f"MAC digit {i} not checked"
