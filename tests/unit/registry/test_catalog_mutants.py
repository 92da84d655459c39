"""The catalog's changes (``registry.releases.catalog``) as an operator checks them afterwards:
each one audited under the catalog's actor, and the signed audit head beside the database
moved to the record it made (``registry audit --verify`` then finds nothing missing). The tests
that kill `make mutate`'s mutants the older tests let through."""

from __future__ import annotations

from pathlib import Path

from registry.releases.catalog import Catalog
from registry.settings import RegistrySettings
from registry.store import chain
from registry.store.db import connect
from registry.trust import anchor, keys
from tests.unit.registry.test_rollout import manifest


def test_every_change_is_audited_by_its_actor_and_moves_the_signed_head_to_it(
        tmp_path: Path) -> None:
    settings = RegistrySettings(home=tmp_path / "registry")
    catalog = Catalog(connect(tmp_path / "registry" / "registry.sqlite3"), "alice",
                      anchor.for_settings(settings))
    head_file = settings.home / anchor.FILE

    def signed_through() -> tuple[str, int]:
        """The newest record's action, and the head a verify finds it signed through."""
        kept, problem = anchor.check(catalog.db, head_file, keys.existing_public(settings),
                                     settings.signing_key_path)
        assert problem is None and kept is not None
        newest = chain.records(catalog.db)[-1]
        assert newest.actor == "alice" and newest.seq == kept.head.seq
        return newest.action, kept.head.seq

    assert catalog.create_version(manifest()) == 1
    assert signed_through() == ("publish", 1)
    catalog.create_version(manifest(seed=1), canary=["edge-1"])
    assert catalog.promote("m") == 2
    assert signed_through() == ("promote", 3)
    catalog.create_version(manifest(seed=2))
    assert catalog.rollback("m") == (3, 2)
    assert signed_through() == ("rollback", 5)
    assert catalog.sign("m", keys.signer(settings), 1) == ([1], None)
    assert signed_through() == ("sign", 6)
