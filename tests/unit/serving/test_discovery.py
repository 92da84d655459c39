"""What discovery accepts from Consul: every value of a service entry is checked, and an entry
with any value outside Tiered's patterns is skipped (logged, rate-limited), never used."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from serving.fleet import discovery
from serving.fleet.discovery import InvalidInstance, Watch, instance

INJECTION = 'eu" tiered_edges;\n}\nserver { listen 8080 default_server; location /leak/ ' \
            '{ alias /etc/; } }\nmap $x $y {\n "a'


def entry(address: str = "127.0.0.1", port: Any = 8200, sid: Any = "edge-eu-1",
          tags: Any = ("edge", "region-eu"), checks: Any = None, **meta: Any) -> dict[str, Any]:
    return {"Node": {"Node": "tiered", "Address": "127.0.0.1"},
            "Service": {"ID": sid, "Service": "tiered-edge", "Address": address, "Port": port,
                        "Tags": list(tags), "Meta": {"tier": "edge", "region": "eu",
                                                     "node_id": "edge-eu-1",
                                                     "versions": "tiny=1,big=12", **meta}},
            "Checks": checks if checks is not None else [{"Status": "passing"}]}


def test_what_tiered_registers_is_accepted() -> None:
    edge = instance(entry())
    assert (edge.service_id, edge.target, edge.region, edge.passing) == (
        "edge-eu-1", "127.0.0.1:8200", "eu", True)
    assert instance(entry("edge-us", region="us")).url == "http://edge-us:8200"
    assert instance(entry("::1")).target == "[::1]:8200"
    registry = entry(sid="registry-127.0.0.1-50051", tags=["registry"], metrics_port="9300")
    assert instance(registry).metrics_port == 9300
    assert instance(entry(metrics_port="")).metrics_port is None  # registry without metrics
    assert instance(entry(checks=[{"Status": "critical"}])).passing is False
    node_address = entry("")  # no service address: the node's
    assert instance(node_address).address == "127.0.0.1"
    for region in ("local", "eu", "us", "bench", "eu-west-1"):
        assert instance(entry(region=region)).region == region


HOSTILE = {
    "newline in address": entry("127.0.0.1\nserver 10.0.0.1:80"),
    "brace in address": entry("a}b"),
    "semicolon in address": entry("127.0.0.1;"),
    "space in address": entry("127.0.0.1 backup"),
    "IPv6 zone": entry("fe80::1%eth0;x"),
    "digits hostname": entry("01.2.3.4"),
    "300-char hostname": entry(".".join(["a" * 60] * 5)),
    "64-char label": entry("a" * 64 + ".example"),
    "label edge hyphen": entry("-edge"),
    "unicode hostname": entry("édge"),
    "port 0": entry(port=0),
    "huge port": entry(port=70000),
    "port as text": entry(port="8200"),
    "port bool": entry(port=True),
    "injected region": entry(region=INJECTION),
    "region with quote": entry(region='eu"'),
    "region with dollar": entry(region="$host"),
    "upper-case region": entry(region="EU"),
    "long region": entry(region="r" * 33),
    "unicode region": entry(region="eü"),
    "metrics_port not int": entry(metrics_port="9300; listen 1"),
    "metrics_port huge": entry(metrics_port="99999"),
    "metrics_port unicode digits": entry(metrics_port="٩٣٠٠"),
    "meta value with space": entry(versions="tiny=1 x"),
    "meta key with brace": entry(**{"k{": "v"}),
    "meta value not text": entry(node_id=["a"]),
    "service id with slash": entry(sid="../edge"),
    "service id not text": entry(sid=7),
    "tag with newline": entry(tags=["edge\n"]),
    "too many tags": entry(tags=[f"t{i}" for i in range(17)]),
    "no service": {"Node": {"Address": "127.0.0.1"}},
    "not a dict": ["Service"],
    "meta a list": {**entry(), "Service": {**entry()["Service"], "Meta": ["region"]}},
}


@pytest.mark.parametrize("node", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_hostile_entry_is_refused(node: Any) -> None:
    with pytest.raises(InvalidInstance):
        instance(node)


def test_a_watch_skips_hostile_entries_and_logs_a_flood_once(
        caplog: pytest.LogCaptureFixture) -> None:
    watch = Watch(None, "tiered-edge", lambda _: None)  # type: ignore[arg-type]
    good = entry("127.0.0.1", 8201, "edge-us-1", region="us")
    with caplog.at_level(logging.WARNING, logger=discovery.log.name):
        found = watch.valid([*HOSTILE.values(), good] * 100)
    assert [i.service_id for i in found] == ["edge-us-1"]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "skipping an invalid tiered-edge entry" in lines[0]
    assert watch.skips.held == len(HOSTILE) * 100 - 1  # counted for the next line


def test_node_tls_names_are_the_names_node_certificates_carry() -> None:
    """``serving.fleet`` may not import the registry: its copy of the rule must agree with
    ``registry.trust.pki.node_name`` (what ``pki.node`` signs)."""
    from registry.trust import pki

    for node_id, tier in (("center-1", "center"), ("edge-us-1", "edge"), ("a", "center")):
        assert discovery.node_tls_name(node_id, tier) == pki.node_name(node_id, tier)
    for node_id, tier in (("Center_1", "center"), ("-x", "edge"), ("c1", "registry"),
                          ("x" * 64, "edge")):
        with pytest.raises(ValueError):
            pki.node_name(node_id, tier)
        with pytest.raises(ValueError):
            discovery.node_tls_name(node_id, tier)


class Recording:
    """Stands in for the Consul client where nothing may reach it: records any use."""

    def __init__(self) -> None:
        self.used: list[str] = []

    def __getattr__(self, name: str) -> Any:
        self.used.append(name)
        raise AssertionError(f"Consul reached: {name}")


@pytest.mark.parametrize("service_id", ["edge-eu-1\x01", "edge\x7f", "edge eu", "edge/eu",
                                        "-edge", "", "e" * 129, "edge\n"])
def test_a_service_id_consul_could_not_delete_is_refused_before_consul(service_id: str) -> None:
    client = Recording()
    with pytest.raises(InvalidInstance, match="service id"):
        discovery.Registration(client, "tiered-edge", service_id, "127.0.0.1", 8200,  # type: ignore[arg-type]
                               {}, ["edge"], dict)
    assert client.used == []


def test_service_ids_and_names_a_node_may_register() -> None:
    for service_id in ("edge-eu-1", "edge-host.example-8200", "edge:a@b", "e" * 128):
        made = discovery.Registration(Recording(), "tiered-edge", service_id,  # type: ignore[arg-type]
                                      "127.0.0.1", 8200, {}, ["edge"], dict)
        assert made.service_id == service_id
    for name in ("tiered edge", "tiered-edge\x01", "Tiered-Edge"):
        with pytest.raises(InvalidInstance, match="service name"):
            discovery.Registration(Recording(), name, "edge-eu-1", "127.0.0.1",  # type: ignore[arg-type]
                                   8200, {}, ["edge"], dict)


def test_a_node_id_that_would_be_such_a_service_id_stops_the_node_at_its_settings() -> None:
    from pydantic import ValidationError

    from center.settings import CenterSettings
    from edge.settings import EdgeSettings

    for settings in (EdgeSettings, CenterSettings):
        with pytest.raises(ValidationError, match="node_id 'edge-eu-1\\\\x1b"):
            settings(node_id="edge-eu-1\x1b[2J")
        assert settings(node_id="edge-eu-1:a@b").node_id == "edge-eu-1:a@b"
    from registry.settings import RegistrySettings  # its id names its lock's service in Consul

    with pytest.raises(ValidationError, match="registry_id"):
        RegistrySettings(registry_id="registry-a\x01")
    assert RegistrySettings(registry_id="registry-a").registry_id == "registry-a"
