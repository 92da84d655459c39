"""What the catalog's reads answer (``registry.releases.reads``), value by value: the tests
that kill `make mutate`'s mutants of the reads the CLI and the server list."""

from __future__ import annotations

import msgspec
import pytest

from registry.errors import NotFound
from registry.releases.catalog import Catalog
from registry.releases.reads import _latest
from tests.unit.registry.test_rollout import catalog, manifest

__all__ = ["catalog"]  # the fixture, imported


def test_models_lists_each_with_its_count_latest_production_and_canary(
        catalog: Catalog) -> None:
    assert catalog.models() == []
    catalog.create_version(manifest("b"))
    catalog.create_version(manifest("a"))
    catalog.create_version(manifest("a", seed=1))
    catalog.create_version(manifest("a", seed=2), canary=["edge-1"])
    rows = [{k: r[k] for k in ("name", "versions", "latest", "production", "canary")}
            for r in catalog.models()]
    assert rows == [{"name": "a", "versions": 3, "latest": 3, "production": 2, "canary": 3},
                    {"name": "b", "versions": 1, "latest": 1, "production": 1,
                     "canary": None}]
    assert all(r["created_at"] for r in catalog.models())


def test_versions_are_in_order_with_their_aliases_and_an_unknown_model_is_not_found(
        catalog: Catalog) -> None:
    catalog.create_version(manifest())
    catalog.create_version(manifest(seed=1), canary=["edge-1"])
    rows = catalog.versions("m")
    assert [(r.version, r.aliases, r.manifest.version) for r in rows] == \
        [(1, ["production"], 1), (2, ["canary"], 2)]
    assert [r.publisher for r in rows] == ["t", "t"]
    assert rows[0].signature is None and rows[0].key_id is None
    with pytest.raises(NotFound, match="no model named 'other' in the registry"):
        catalog.versions("other")


def test_resolve_takes_a_number_an_alias_or_production_else_the_latest(
        catalog: Catalog) -> None:
    catalog.create_version(manifest(), canary=["edge-1"])  # no production yet
    assert catalog.resolve("m").version == 1  # the latest
    catalog.create_version(manifest(seed=1))
    catalog.create_version(manifest(seed=2), canary=["edge-1"])
    assert catalog.resolve("m").version == 2  # production
    assert catalog.resolve("m", "canary").version == 3
    assert catalog.resolve("m", "1").version == 1
    with pytest.raises(NotFound, match="m has no alias 'beta'"):
        catalog.resolve("m", "beta")
    with pytest.raises(NotFound, match="m has no version 9"):
        catalog.resolve("m", "9")


def test_the_latest_source_is_the_newest_versions_and_none_for_an_unknown_model(
        catalog: Catalog) -> None:
    assert catalog.latest_source("m") is None
    catalog.create_version(manifest(seed=3))
    catalog.create_version(manifest(seed=4))
    assert catalog.latest_source("m") == (2, "4")
    assert _latest(catalog.db, "m") == 2
    with pytest.raises(NotFound, match="other has no versions"):
        _latest(catalog.db, "other")


def test_rollouts_are_a_models_rows_in_order(catalog: Catalog) -> None:
    catalog.create_version(manifest())
    catalog.create_version(manifest(seed=1), canary=["edge-1"])
    catalog.create_version(manifest("other"))
    rows = catalog.rollouts("m")
    assert [(r["model"], r["version"], r["alias"]) for r in rows] == \
        [("m", 1, "production"), ("m", 2, "canary")]
    assert [r["id"] for r in rows] == sorted(r["id"] for r in rows)


def test_an_artifacts_size_is_known_only_while_a_version_ships_it(catalog: Catalog) -> None:
    catalog.create_version(manifest())
    shipped = manifest().edge.sha256
    assert catalog.artifact_size(shipped) == 10
    assert catalog.artifact_size("f" * 64) is None
    catalog.require_version("m", 1)
    with pytest.raises(NotFound, match="m has no version 2"):
        catalog.require_version("m", 2)


def test_a_version_row_names_its_model_and_when_it_was_published(catalog: Catalog) -> None:
    """What `registry versions` and `registry show` print as the model and ``published_at``."""
    at = "2026-01-02T03:04:05.678+00:00"
    catalog.create_version(msgspec.structs.replace(manifest("a"), published_at=at))
    catalog.create_version(manifest("b"))
    for row in (catalog.versions("a")[0], catalog.resolve("a", "1")):
        assert (row.model, row.version, row.created_at) == ("a", 1, at)
    assert catalog.resolve("b").model == "b"
