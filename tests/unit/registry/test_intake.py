"""What nodes send up, as ``registry serve`` takes it (``registry/server/intake.py``, the
write-behind in ``registry/server/session.py``): acks and reports written in batches, none lost,
each ack with its own audit record; budgets split at most once per interval per model, and still
moved. No gRPC: the real database and the real service objects."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from registry.fleet import nodes
from registry.releases.plan import RolloutNode
from registry.server.intake import Coalesced
from registry.server.service import SyncService
from registry.server.session import Database, Session
from registry.store import chain
from registry.trust.anchor import read
from sync.gen import sync_pb2 as pb
from tests.unit.registry.test_push import run
from tests.unit.registry.test_rollout import manifest

CENTER = RolloutNode("center-1", "center", "eu")


def edge(i: int) -> RolloutNode:
    return RolloutNode(f"edge-{i}", "edge", "eu")


def session(service: SyncService, node: RolloutNode, version: int = 1) -> Session:
    s = Session(node, "ipv4:127.0.0.1:1", {}, generation=0, sent={"m": version})
    service.sessions[node.node_id] = s
    service.writes.add(nodes.hello(node, s.peer, []))
    return s


async def acks(db: Database) -> list[chain.Record]:
    return await db.run(lambda: [r for r in chain.records(db.catalog.db, "m")
                                 if r.action == "ack"])


def test_acks_written_behind_are_all_recorded_each_with_its_audit_record(
        tmp_path: Path) -> None:
    """Hundreds of acks in one batch: every one is a row change and an audit record, the chain
    verifies, and the signed head names the newest record (moved once, after the commit)."""
    async def scenario(service: SyncService, db: Database) -> None:
        await db.run(db.catalog.create_version, manifest("m"))
        sessions = [session(service, edge(i)) for i in range(300)]
        for s in sessions:
            await service.intake.ack(s, pb.Ack(model="m", version=1, state=pb.DOWNLOADING))
            await service.intake.ack(s, pb.Ack(model="m", version=1, state=pb.ACTIVE))
        assert len(service.writes.pending) == 300 * 3  # nothing written yet: one batch
        await service.writes.flush()
        assert service.writes.pending == []
        rows = await db.run(lambda: list(db.catalog.db.query(
            "SELECT node_id, state, version FROM node_models")))
        assert {(r["node_id"], r["state"], r["version"]) for r in rows} == \
            {(f"edge-{i}", "ACTIVE", 1) for i in range(300)}
        recorded = await acks(db)
        assert len(recorded) == 600
        assert [r.actor for r in recorded[:2]] == ["node:edge-0", "node:edge-0"]
        assert [json.loads(r.payload)["state"] for r in recorded[:2]] == ["DOWNLOADING", "ACTIVE"]
        checked, finding = await db.run(chain.verify, db.catalog.db)
        assert finding is None and checked >= 600
        signed = read(db.anchor.path)
        assert signed is not None and signed.head == await db.run(chain.head, db.catalog.db.conn)

    run(tmp_path, scenario)


def test_a_write_that_fails_costs_the_others_in_its_batch_nothing(tmp_path: Path) -> None:
    async def scenario(service: SyncService, db: Database) -> None:
        await db.run(db.catalog.create_version, manifest("m"))
        good = [session(service, edge(i)) for i in range(3)]

        def broken(conn: object) -> None:
            raise ValueError("a bad row")

        await service.intake.ack(good[0], pb.Ack(model="m", version=1, state=pb.ACTIVE))
        service.writes.add(nodes.Write("a broken write", broken, audited=True))
        for s in good[1:]:
            await service.intake.ack(s, pb.Ack(model="m", version=1, state=pb.ACTIVE))
        await service.writes.flush()
        assert sorted(r.actor for r in await acks(db)) == [f"node:edge-{i}" for i in range(3)]
        assert service.writes.pending == []  # dropped, not retried for ever

    run(tmp_path, scenario)


def test_stopping_the_server_writes_every_ack_still_queued(tmp_path: Path) -> None:
    """A clean stop loses nothing acknowledged: what the write-behind holds is written before
    the database closes (here: the stop path of SyncServer, minus gRPC)."""
    async def scenario(service: SyncService, db: Database) -> None:
        await db.run(db.catalog.create_version, manifest("m"))
        service.writes.start()
        s = session(service, edge(1))
        await service.intake.ack(s, pb.Ack(model="m", version=1, state=pb.ACTIVE))
        await service.writes.stop()  # at once: well before the first interval is up
        assert [r.actor for r in await acks(db)] == ["node:edge-1"]

    run(tmp_path, scenario)


def report(model: str, version: int, **fields: float) -> pb.QualityReport:
    return pb.QualityReport(model=model, version=version, window_s=10, **fields)  # type: ignore[arg-type]


def test_reports_move_budgets_at_most_once_per_interval_and_the_last_one_counts(
        tmp_path: Path) -> None:
    """Many reports within the debounce interval: one split at once, one coalesced split when
    the interval is up, and the budgets that moved in between are pushed then."""
    async def scenario(service: SyncService, db: Database) -> None:
        await db.run(db.catalog.create_version, manifest("m"))
        await service.intake.load_policies()
        intake = service.intake
        splits = 0

        def counted(model: str) -> None:
            nonlocal splits
            splits += 1
            intake.rebalance(model)

        intake.splits = Coalesced(counted, 0.3)
        center = session(service, CENTER)
        edges = [session(service, edge(i)) for i in range(50)]
        await intake.report(center, report("m", 1, capacity_rows_s=100))
        assert splits == 1  # the first report splits at once
        for e in edges:
            await intake.report(e, report("m", 1, requests=50, rows=50))
        assert splits == 1  # the rest wait for the interval
        await asyncio.sleep(0.45)
        assert splits == 2  # ... and are split together, once
        budgets = {e.node.node_id: e.budgets["m"] for e in edges}
        assert all(b.controlled for b in budgets.values())
        assert sum(b.rows_per_s for b in budgets.values()) == \
            pytest.approx(100)
        # one edge's traffic jumps: its budget moves and is pushed after the interval
        while not edges[0].outbox.empty():
            edges[0].outbox.get_nowait()
        before = edges[0].budgets["m"].rows_per_s
        await intake.report(edges[0], report("m", 1, requests=100, rows=100))
        await asyncio.sleep(0.45)
        assert edges[0].budgets["m"].rows_per_s > 1.5 * before
        pushed = edges[0].outbox.get_nowait()
        assert pushed is not None and pushed.budget.rows_per_s == \
            pytest.approx(edges[0].budgets["m"].rows_per_s)
        await intake.stop()

    run(tmp_path, scenario)
