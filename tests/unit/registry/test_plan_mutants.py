"""What each node is told to run (``registry.releases.plan``), per model: the canary where its
targets name the node, else the version of a wave rollout that admitted the edge (the centers
only on a first release), else production; each release as stored, with its signature when it
was signed. The tests that kill `make mutate`'s mutants the older tests let through."""

from __future__ import annotations

import time

from registry.releases import steering, waves
from registry.releases.catalog import Catalog
from registry.releases.plan import RolloutNode
from registry.trust.anchor import audited
from tests.unit.registry.test_rollout import CENTER, EU_EDGE, US_EDGE, catalog, desired, manifest
from tests.unit.registry.test_waves import EDGES, FAST, fleet, tick

__all__ = ["catalog"]  # the fixture, imported


def by_node(c: Catalog, nodes: list[RolloutNode]) -> dict[str, tuple[int, str] | None]:
    return {n.node_id: desired(c, n).get("m") for n in nodes}


def test_an_unsigned_release_travels_with_no_signature_and_no_key(catalog: Catalog) -> None:
    catalog.create_version(manifest())
    (target,) = catalog.desired(EU_EDGE)
    assert (target.model, target.version, target.alias) == ("m", 1, "production")
    assert target.signature == b"" and target.key_id == ""
    assert target.manifest == catalog.resolve("m", "1").manifest_bytes


def test_every_model_is_planned_each_with_its_own_versions(catalog: Catalog) -> None:
    catalog.create_version(manifest("a"))
    catalog.create_version(manifest("b"))
    catalog.create_version(manifest("b", seed=1))
    catalog.create_version(manifest("a", seed=1), canary=["edge-1"])
    got = sorted((t.model, t.version, t.alias) for t in catalog.desired(EU_EDGE))
    assert got == [("a", 2, "canary"), ("b", 2, "production")]
    got = sorted((t.model, t.version, t.alias) for t in catalog.desired(US_EDGE))
    assert got == [("a", 1, "production"), ("b", 2, "production")]


def test_a_canary_goes_to_the_targets_of_its_own_version_not_an_older_canarys(
        catalog: Catalog) -> None:
    catalog.create_version(manifest())
    catalog.create_version(manifest(seed=1), canary=["edge-1"])
    catalog.create_version(manifest(seed=2), canary=["region:us"])
    assert by_node(catalog, [EU_EDGE, US_EDGE, CENTER]) == {
        "edge-1": (1, "production"), "edge-2": (3, "canary"), "center-1": (1, "production")}


def test_a_wave_rollout_reaches_its_admitted_edges_and_a_canary_still_its_targets(
        catalog: Catalog) -> None:
    """The order a node is told: its canary, else the wave that admitted it, else production;
    the centers stay on production until the rollout makes it."""
    fleet(catalog)
    catalog.create_version(manifest(seed=1))
    catalog.create_version(manifest(seed=2), canary=[EDGES[0].node_id])
    new = catalog.create_version(manifest(seed=3), rollout=FAST)
    tick(catalog, time.time())
    r = waves.latest(catalog.db.conn, "m")
    assert r is not None and 0 < r.cutoff < 1
    inside = {n.node_id for n in EDGES if waves.position("m", n.node_id) < r.cutoff}
    assert len(inside) == 3
    for node in EDGES:
        want = (2, "canary") if node == EDGES[0] else \
            (new, "wave") if node.node_id in inside else (1, "production")
        assert desired(catalog, node)["m"] == want, node
    assert desired(catalog, CENTER)["m"] == (1, "production")
    (target,) = [t for t in catalog.desired(next(n for n in EDGES if n.node_id in inside
                                                 and n != EDGES[0]))]
    assert target.manifest == catalog.resolve("m", str(new)).manifest_bytes


def test_a_finished_rollout_tells_nobody_its_version(catalog: Catalog) -> None:
    fleet(catalog)
    catalog.create_version(manifest(seed=1))
    catalog.create_version(manifest(seed=2), rollout=FAST)
    tick(catalog, time.time())
    with audited(catalog.db, None) as conn:
        steering.steer(conn, "m", "abort", "ops", time.time())
    assert set(by_node(catalog, [*EDGES, CENTER]).values()) == {(1, "production")}


def test_a_canary_for_every_node_reaches_every_node(catalog: Catalog) -> None:
    catalog.create_version(manifest())
    catalog.create_version(manifest(seed=1), canary=["*"])
    assert by_node(catalog, [EU_EDGE, US_EDGE, CENTER]) == {
        "edge-1": (2, "canary"), "edge-2": (2, "canary"), "center-1": (2, "canary")}
