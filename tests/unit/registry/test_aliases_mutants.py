"""Promote and rollback as the audit log, the rollout rows and an operator see them
(``registry.releases.aliases``): what is recorded, which wave rollout ends how, what a refusal
says. The tests that kill `make mutate`'s mutants the older tests let through."""

from __future__ import annotations

import json

import pytest

from registry.errors import NotFound, RegistryError
from registry.releases import waves
from registry.releases.catalog import Catalog
from registry.store import chain
from tests.unit.registry.test_rollout import catalog, manifest
from tests.unit.registry.test_waves import FAST

__all__ = ["catalog"]  # the fixture, imported


def last(c: Catalog, action: str) -> tuple[str, str | None, int | None, dict[str, object]]:
    r = [r for r in chain.records(c.db) if r.action == action][-1]
    return r.actor, r.model, r.version, json.loads(r.payload)


def production_rows(c: Catalog) -> list[tuple[int, list[str]]]:
    return [(r["version"], json.loads(r["targets"])) for r in c.rollouts("m")
            if r["alias"] == "production"]


def test_rollback_is_audited_points_production_at_every_node_and_supersedes_waves(
        catalog: Catalog) -> None:
    for seed in range(3):
        catalog.create_version(manifest(seed=seed))
    rolling = catalog.create_version(manifest(seed=3), rollout=FAST)
    assert catalog.rollback("m") == (3, 2)
    assert last(catalog, "rollback") == ("tester", "m", 2, {"from": 3, "to": 2})
    assert catalog.resolve("m").version == 2
    assert production_rows(catalog)[-1] == (2, ["*"])
    r = waves.latest(catalog.db.conn, "m")
    assert r is not None and (r.version, r.state) == (rolling, "superseded")
    assert r.reason == "rolled back to version 2 by tester"
    assert last(catalog, "rollout-superseded")[1:3] == ("m", rolling)
    assert catalog.rollback("m", 1) == (2, 1)  # to a named version
    assert last(catalog, "rollback")[3] == {"from": 2, "to": 1}


def test_rollback_refusals_say_why(catalog: Catalog) -> None:
    with pytest.raises(NotFound, match="no model named 'm'"):
        catalog.rollback("m")
    catalog.create_version(manifest(), canary=["edge-1"])
    with pytest.raises(RegistryError, match="m has no production version to roll back from"):
        catalog.rollback("m")
    catalog.promote("m")
    with pytest.raises(RegistryError, match="m version 1 is the first version; there is "
                                            "nothing to roll back to"):
        catalog.rollback("m")
    catalog.create_version(manifest(seed=1))
    with pytest.raises(RegistryError, match="m production is already version 2"):
        catalog.rollback("m", 2)
    with pytest.raises(NotFound, match="m has no version 7"):
        catalog.rollback("m", 7)


def test_promote_is_audited_clears_the_canary_and_ends_waves_done_or_superseded(
        catalog: Catalog) -> None:
    catalog.create_version(manifest())
    catalog.create_version(manifest(seed=1), canary=["edge-1"])
    assert catalog.promote("m") == 2
    assert last(catalog, "promote") == ("tester", "m", 2, {"from": 1, "to": 2})
    assert catalog.alias("m", "canary") is None and catalog.alias("m", "production") == 2
    assert production_rows(catalog)[-1] == (2, ["*"])
    rolling = catalog.create_version(manifest(seed=2), rollout=FAST)
    assert catalog.promote("m", 1) == 1  # another version: the rollout is superseded
    r = waves.latest(catalog.db.conn, "m")
    assert r is not None and (r.version, r.state) == (rolling, "superseded")
    assert r.reason == "version 1 promoted by tester"
    again = catalog.create_version(manifest(seed=3), rollout=FAST)
    assert catalog.promote("m", again) == again  # its own version: done
    r = waves.latest(catalog.db.conn, "m")
    assert r is not None and (r.version, r.state) == (again, "done")
    assert r.reason == f"version {again} promoted by tester"
    assert last(catalog, "rollout-done")[1:] == ("m", again, {"wave": 1,
                                                              "reason": r.reason})


def test_promote_refusals_say_why(catalog: Catalog) -> None:
    catalog.create_version(manifest())
    with pytest.raises(RegistryError, match="m has no canary or wave rollout to promote; name "
                                            "a version"):
        catalog.promote("m")
    with pytest.raises(NotFound, match="m has no version 5"):
        catalog.promote("m", 5)


def test_promote_with_no_version_takes_the_models_own_wave_rollout_not_anothers(
        catalog: Catalog) -> None:
    catalog.create_version(manifest())
    rolling = catalog.create_version(manifest(seed=1), rollout=FAST)
    for seed in range(3):
        catalog.create_version(manifest("other", seed=seed), rollout=FAST if seed else None)
    assert catalog.promote("m") == rolling == 2
    r = waves.latest(catalog.db.conn, "m")
    assert r is not None and (r.version, r.state) == (rolling, "done")
    other = waves.latest(catalog.db.conn, "other")
    assert other is not None and (other.version, other.state) == (3, "running")
    assert catalog.alias("other", "production") == 1
