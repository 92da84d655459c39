from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from edge.settings import EdgeSettings
from serving.config import settings, tokens
from serving.config.tokens import (
    NodeToken,
    TokenError,
    TokenVerifier,
    check_node_token,
    node_token,
    parse,
)

SECRET = "unit-secret-0123456789"


def edge(node_id: str, generation: int = 1, region: str = "local") -> str:
    return node_token(SECRET, node_id, "edge", region, generation)


def test_a_token_proves_its_node_and_generation_only() -> None:
    generations = {"edge-eu-1": 1, "edge-us-1": 3}
    verifier = TokenVerifier(SECRET, lambda node: generations.get(node, 1))
    eu = edge("edge-eu-1", region="eu")
    proven = verifier.node(eu)
    assert proven is not None and proven.node_id == "edge-eu-1"
    assert (proven.tier, proven.region, proven.generation) == ("edge", "eu", 1)
    us = verifier.node(edge("edge-us-1", 3))
    assert us is not None and us.node_id == "edge-us-1"
    assert verifier.node(edge("edge-us-1", 2)) is None  # revoked generation
    assert verifier.node(edge("edge-us-1", 4)) is None  # not issued yet
    node, generation, tier, region, mac = eu.rsplit(".", 4)
    assert verifier.node(f"edge-us-1.{generation}.{tier}.{region}.{mac}") is None  # another's
    assert verifier.node(node_token("another-secret-0123456789", "edge-eu-1", "edge",
                                    "eu")) is None
    for junk in ("", SECRET, "edge-eu-1", f"{eu}x", f"{node}.0.{tier}.{region}.{mac}",
                 eu.upper()):
        assert verifier.node(junk) is None, junk


def test_the_tier_and_region_are_under_the_mac() -> None:
    """An edge's token edited to say center (or another region) proves nothing: the registry
    believes a node's tier and region only as it issued them."""
    verifier = TokenVerifier(SECRET, lambda _: 1)
    token = node_token(SECRET, "edge-eu-1", "edge", "eu")
    assert parse(token) == NodeToken("edge-eu-1", 1, "edge", "eu", token[-64:])
    node, generation, _, _, mac = token.rsplit(".", 4)
    for tier, region in (("center", "eu"), ("edge", "us"), ("center", "us")):
        forged = f"{node}.{generation}.{tier}.{region}.{mac}"
        assert parse(forged).tier == tier  # well-formed ...
        assert verifier.node(forged) is None, forged  # ... and refused
    center = node_token(SECRET, "center-1", "center", "local")
    assert verifier.node(center) == parse(center)
    assert center != node_token(SECRET, "center-1", "edge", "local")


@pytest.mark.parametrize(("tier", "region"), [("core", "eu"), ("", "eu"), ("edge", "EU"),
                                              ("edge", "eu.west"), ("edge", "-eu"),
                                              ("edge", "x" * 33), ("edge", "")])
def test_a_token_names_a_real_tier_and_a_region_tag(tier: str, region: str) -> None:
    with pytest.raises(TokenError):
        node_token(SECRET, "edge-1", tier, region)


def test_a_token_from_before_tiers_and_regions_says_to_re_provision() -> None:
    old = f"edge-eu-1.1.{'ab' * 32}"
    with pytest.raises(TokenError, match=r"made before tiers and regions.*registry node "
                                         r"provision edge-eu-1"):
        parse(old)
    assert TokenVerifier(SECRET, lambda _: 1).node(old) is None


def test_the_region_pattern_is_the_settings_one() -> None:
    assert settings.REGION == tokens.REGION


@pytest.mark.parametrize("secret", ["", "x" * 15, " " * 20])
def test_short_secrets_are_refused(secret: str) -> None:
    with pytest.raises(ValueError, match="at least 16"):
        node_token(secret, "edge-1", "edge", "local")
    with pytest.raises(ValueError, match="at least 16"):
        TokenVerifier(secret, lambda _: 1)


def test_node_ids_in_tokens_may_hold_dots() -> None:
    token = node_token(SECRET, "edge.eu.1", "edge", "eu")
    assert parse(token).node_id == "edge.eu.1" and parse(token).generation == 1
    assert (parse(token).tier, parse(token).region) == ("edge", "eu")
    with pytest.raises(TokenError):
        node_token(SECRET, "../etc", "edge", "eu")


def test_a_node_starts_only_with_its_own_token(tmp_path: Path) -> None:
    with pytest.raises(TokenError, match="edge-b"):
        check_node_token(edge("edge-b"), "edge-a")
    with pytest.raises(TokenError, match="tier 'edge'"):
        check_node_token(edge("edge-a"), "edge-a", tier="center")
    with pytest.raises(ValidationError, match="edge-b"):
        EdgeSettings(node_id="edge-a", registry_token=edge("edge-b"))
    with pytest.raises(ValidationError, match="region 'us'"):
        EdgeSettings(node_id="edge-a", region="eu", registry_token=edge("edge-a", region="us"))
    token_file = tmp_path / "token"
    token_file.write_text(edge("edge-a") + "\n")
    settings = EdgeSettings(node_id="edge-a", registry_token_file=token_file)
    assert settings.registry_token is not None
    assert settings.registry_token.get_secret_value() == edge("edge-a")


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
    verifier = TokenVerifier(SECRET, lambda _: 1)
    token = node_token(SECRET, "edge-eu-1", "edge", "eu")
    proven = verifier.node(token)
    assert proven is not None and proven.node_id == "edge-eu-1"
    head, _, mac = token.rpartition(".")  # the MAC is the last field, whatever comes before
    for i, digit in enumerate(mac):
        wrong = "0" if digit != "0" else "1"
        forged = f"{head}.{mac[:i]}{wrong}{mac[i + 1:]}"
        assert verifier.node(forged) is None, f"MAC digit {i} not checked"
