"""Retiring a model in the catalog (``registry.releases.retire``): no node's plan holds it, the
change is audited and replicated, its history stays, publishing or promoting brings it back;
and the registry's push tells each node that holds it, once, with a retire directive signed for
that node."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from registry.errors import RegistryError
from registry.fleet import nodes
from registry.ha import changes
from registry.releases.catalog import Catalog
from registry.releases.retire import NotRetirable
from registry.server.service import SyncService
from registry.server.session import Database, Session
from registry.store import chain
from registry.store.db import connect
from serving.release.signing import Verifier
from sync.gen import sync_pb2 as pb
from sync.wire import retire
from tests.unit.registry.test_push import run, session
from tests.unit.registry.test_rollout import CENTER, EU_EDGE, US_EDGE, desired, manifest


@pytest.fixture
def catalog(tmp_path: Path) -> Catalog:
    c = Catalog(connect(tmp_path / "r.sqlite3"), "tester")
    c.create_version(manifest("gone"))
    c.create_version(manifest("keep"))
    return c


def test_a_retired_model_is_no_nodes_to_run_and_its_history_stays(catalog: Catalog) -> None:
    catalog.create_version(manifest("gone", seed=1), canary=["edge-1"])  # version 2, a canary
    made, changed = catalog.retire("gone", "misnamed calibration")
    assert changed and (made.model, made.version, made.actor) == ("gone", 1, "tester")
    for node in (EU_EDGE, US_EDGE, CENTER):
        assert desired(catalog, node) == {"keep": (1, "production")}
    assert catalog.plan().retired == {"gone": 2}  # its newest version, for the nodes' acks
    record = chain.records(catalog.db, model="gone")[-1]
    assert (record.action, record.seq, record.version) == ("retire", made.seq, 1)
    assert json.loads(record.payload) == {"production": 1, "canary": 2,
                                          "reason": "misnamed calibration"}
    assert [v.version for v in catalog.versions("gone")] == [1, 2]  # nothing deleted
    assert all(v.aliases == [] for v in catalog.versions("gone"))
    models = {m["name"]: m for m in catalog.models()}
    assert models["gone"]["retired"] == made.retired_at and models["keep"]["retired"] is None
    assert chain.verify(catalog.db) == (len(chain.records(catalog.db)), None)


def test_retiring_twice_changes_nothing_and_an_unknown_model_is_a_usage_error(
        catalog: Catalog) -> None:
    first, _ = catalog.retire("gone")
    records = len(chain.records(catalog.db))
    again, changed = catalog.retire("gone", "again")
    assert (again, changed) == (first, False) and len(chain.records(catalog.db)) == records
    with pytest.raises(NotRetirable, match="no model named 'nosuch'") as refused:
        catalog.retire("nosuch")
    assert refused.value.exit_code == 2
    with pytest.raises(RegistryError, match="invalid model name"):
        catalog.retire("Not/A/Name")


def test_the_retirement_is_replicated_in_its_transaction(catalog: Catalog) -> None:
    at = changes.position(catalog.db.conn)
    made, _ = catalog.retire("gone")
    written = changes.read_changes(catalog.db.conn, at, 100)
    assert {c.table for c in written} == {"audit", "aliases", "retirements"}
    (row,) = [json.loads(c.row) for c in written if c.table == "retirements"]
    assert (row["model"], row["seq"], row["version"]) == ("gone", made.seq, 1)


@pytest.mark.parametrize("how", ["publish", "promote"])
def test_publishing_or_promoting_brings_it_back_audited(catalog: Catalog, how: str) -> None:
    catalog.retire("gone")
    if how == "publish":
        version = catalog.create_version(manifest("gone", seed=3))
    else:
        version = catalog.promote("gone", 1)
    assert desired(catalog, CENTER) == {"gone": (version, "production"),
                                        "keep": (1, "production")}
    assert catalog.plan().retired == {}
    unretired = [r for r in chain.records(catalog.db, model="gone") if r.action == "unretire"]
    assert [(r.version, json.loads(r.payload)["by"]) for r in unretired] == [(version, how)]
    assert {m["name"]: m for m in catalog.models()}["gone"]["retired"] is None


def test_a_retired_model_has_nothing_to_roll_back(catalog: Catalog) -> None:
    catalog.retire("gone")
    with pytest.raises(RegistryError, match="no production version to roll back from"):
        catalog.rollback("gone")


def retires(s: Session) -> list[pb.Retire]:
    out = []
    while not s.outbox.empty():
        message = s.outbox.get_nowait()
        assert message is not None
        if message.WhichOneof("kind") == "retire":
            out.append(message.retire)
    return out


def test_each_node_holding_it_is_told_once_with_a_directive_signed_for_it(
        tmp_path: Path) -> None:
    async def scenario(service: SyncService, db: Database) -> None:
        await db.run(db.catalog.create_version, manifest("gone"))
        await db.run(db.catalog.create_version, manifest("keep"))
        pushed, held, bare = session(EU_EDGE), session(US_EDGE, {"gone": 1}), session(CENTER)
        await service.pusher.push(pushed)  # sent both releases on this stream
        bare_sent = len(retires(bare))
        for s in (pushed, held):
            retires(s)
        await db.run(db.catalog.retire, "gone")
        for s in (pushed, held, bare):
            await service.pusher.push(s)
        assert bare_sent == 0 and retires(bare) == []
        verifier = Verifier(db.anchor.signer.key.public_key())
        for s in (pushed, held):
            (told,) = retires(s)
            verifier.check(told.directive, told.directive_signature)
            d = retire.parse(told.directive)
            assert (d.node_id, d.model, told.model, told.version) == \
                (s.node.node_id, "gone", "gone", 1)
            assert d.seq == s.seqs["gone"] and s.retiring == {"gone": 1}
            await service.pusher.push(s)
            assert retires(s) == []  # once per stream
        # its RETIRED ack is taken and shown in status
        service.writes.add(nodes.hello(EU_EDGE, pushed.peer, [], None))
        await service.intake.ack(pushed, pb.Ack(model="gone", version=1, state=pb.RETIRED,
                                                reason="unloaded version 1",
                                                directive_seq=pushed.seqs["gone"]))
        await service.writes.flush()
        rows = await db.run(db.nodes.status, db.catalog)
        (row,) = [r for r in rows if r["node"] == "edge-1" and r["model"] == "gone"]
        assert (row["state"], row["version"], row["directive_seq"]) == \
            ("RETIRED", None, pushed.seqs["gone"])

    run(tmp_path, scenario)

