"""Who should run what: production, canaries by node, region or tier; node state and acks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import fleet_state
from registry.fleet import nodes as node_writes
from registry.fleet.nodes import Held, NodeBook
from registry.releases.catalog import Catalog
from registry.releases.plan import RolloutNode
from registry.store import chain
from registry.store.db import connect
from serving.release.manifest import (
    Manifest,
)

EU_EDGE = RolloutNode("edge-1", "edge", "eu")
US_EDGE = RolloutNode("edge-2", "edge", "us")
CENTER = RolloutNode("center-1", "center", "eu")


def manifest(name: str = "m", seed: int = 0) -> Manifest:
    return fleet_state.manifest(name, seed, publisher="t")


@pytest.fixture
def catalog(tmp_path: Path) -> Catalog:
    return Catalog(connect(tmp_path / "r.sqlite3"), "tester")


def desired(catalog: Catalog, node: RolloutNode) -> dict[str, tuple[int, str]]:
    return {t.model: (t.version, t.alias) for t in catalog.desired(node)}


def test_production_goes_everywhere_and_the_manifest_travels_byte_for_byte(
        catalog: Catalog) -> None:
    assert desired(catalog, EU_EDGE) == {}
    catalog.create_version(manifest())
    (target,) = catalog.desired(EU_EDGE)
    row = catalog.resolve("m", "1")
    assert (target.version, target.alias, target.manifest_sha256) == \
        (1, "production", row.manifest_sha256)
    assert json.loads(target.manifest)["version"] == 1
    assert desired(catalog, CENTER) == {"m": (1, "production")}


@pytest.mark.parametrize("targets, chosen", [
    (["edge-1"], {"edge-1"}),
    (["region:us"], {"edge-2"}),
    (["tier:center"], {"center-1"}),
    (["edge-1", "tier:center"], {"edge-1", "center-1"}),
    (["nobody"], set()),
])
def test_a_canary_reaches_only_the_nodes_it_names(catalog: Catalog, targets: list[str],
                                                  chosen: set[str]) -> None:
    catalog.create_version(manifest())
    catalog.create_version(manifest(seed=1), canary=targets)
    for node in (EU_EDGE, US_EDGE, CENTER):
        expected = (2, "canary") if node.node_id in chosen else (1, "production")
        assert desired(catalog, node)["m"] == expected, node
    catalog.promote("m")
    assert {desired(catalog, n)["m"] for n in (EU_EDGE, US_EDGE, CENTER)} == {(2, "production")}
    catalog.rollback("m")
    assert {desired(catalog, n)["m"] for n in (EU_EDGE, US_EDGE, CENTER)} == {(1, "production")}


def test_a_canary_first_release_has_nothing_for_the_other_nodes(catalog: Catalog) -> None:
    catalog.create_version(manifest(), canary=["edge-1"])
    assert desired(catalog, EU_EDGE) == {"m": (1, "canary")}
    assert desired(catalog, US_EDGE) == {}


def test_acks_are_audited_and_status_names_the_laggards(catalog: Catalog) -> None:
    book = NodeBook(catalog.db)
    catalog.create_version(manifest())
    book.write([node_writes.hello(EU_EDGE, "ipv4:127.0.0.1:1", [Held("m", [1], 1)])])
    book.write([node_writes.hello(US_EDGE, "ipv4:127.0.0.1:2", [])])
    catalog.create_version(manifest(seed=1))
    book.write([node_writes.ack(EU_EDGE, "m", 2, "DOWNLOADING", "")])
    book.write([node_writes.ack(US_EDGE, "m", 2, "FAILED", "sha256 mismatch")])
    rows = {r["node"]: r for r in book.status(catalog)}
    assert (rows["edge-1"]["version"], rows["edge-1"]["state"], rows["edge-1"]["lagging"]) == \
        (1, "DOWNLOADING", True)
    assert rows["edge-2"]["reason"] == "version 2: sha256 mismatch"
    book.write([node_writes.ack(EU_EDGE, "m", 2, "ACTIVE", "")])
    book.write([node_writes.goodbye("edge-2")])
    rows = {r["node"]: r for r in book.status(catalog)}
    assert (rows["edge-1"]["version"], rows["edge-1"]["lagging"]) == (2, False)
    assert rows["edge-2"]["connected"] is False
    book.all_disconnected()  # what a restarted registry serve does first
    assert not any(r["connected"] for r in book.status(catalog))
    acks = [(r.actor, r.version, json.loads(r.payload)["state"])
            for r in chain.records(catalog.db) if r.action == "ack"]
    assert acks == [("node:edge-1", 2, "DOWNLOADING"), ("node:edge-2", 2, "FAILED"),
                    ("node:edge-1", 2, "ACTIVE")]
    assert chain.verify(catalog.db)[1] is None


def test_reports_are_kept_per_node_and_model(catalog: Catalog) -> None:
    book = NodeBook(catalog.db)
    catalog.create_version(manifest())
    book.write([node_writes.hello(EU_EDGE, "p", [Held("m", [1], 1)])])
    book.write([node_writes.quality("edge-1", "m", {"escalation_rate": 0.25, "p99_ms": 12.5,
                                                    "requests": 40})])
    (row,) = book.status(catalog)
    assert (row["escalation_rate"], row["p99_ms"], row["requests"]) == (0.25, 12.5, 40)
