"""The bundles ``tiered up`` and ``tiered sites`` make carry the chain's seq as their directive
floor, as ``registry node provision``'s do: they carried 0, so a node whose store was wiped
took a replayed older release's directive on trust."""

from __future__ import annotations

from pathlib import Path

import pytest

from registry.store import chain
from registry.store.db import connect, transaction
from serving.config import bundle
from tiered import bundles
from tiered.stack import Stack
from tiered.views import registry_database

SECRET = "bundle-floor-secret-0123456789"


def chain_in(home: Path, records: int) -> None:
    """A registry home whose audit chain holds ``records`` records."""
    home.mkdir(parents=True)
    db = connect(registry_database(home))
    with transaction(db) as conn:
        for i in range(records):
            chain.append(conn, actor="test", action="test", payload={"i": i})
    db.conn.close()


def test_a_stack_provisions_its_nodes_at_the_chains_seq(tmp_path: Path) -> None:
    home = tmp_path / "registry"
    chain_in(home, 7)
    stack = Stack(tmp_path / "stack", home, SECRET)
    made = bundle.load(stack.provision_node("edge-eu-1", "edge", "eu"))
    assert made.directive_floor == 7
    db = connect(registry_database(home))
    with transaction(db) as conn:
        chain.append(conn, actor="test", action="test", payload={})
    db.conn.close()
    later = bundle.load(stack.provision_node("edge-eu-2", "edge", "eu"))
    assert later.directive_floor == 8  # the seq when each was made, not a fixed number


@pytest.mark.parametrize("records", [0, 1])
def test_the_floor_of_an_empty_or_new_chain(tmp_path: Path, records: int) -> None:
    home = tmp_path / "registry"
    assert bundles.floor(registry_database(home)) == 0  # no database yet
    chain_in(home, records)
    assert bundles.floor(registry_database(home)) == records
