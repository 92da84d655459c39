"""The registry's push logic (``registry/server/push.py``): which releases each connected node's
stream is sent, once, with a signed directive; no gRPC is involved, only the real database."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

from registry.releases.plan import RolloutNode
from registry.server.metrics import SyncMetrics
from registry.server.service import SyncService
from registry.server.session import Database, Session
from registry.settings import RegistrySettings
from serving.release.signing import Verifier
from sync.gen import sync_pb2 as pb
from sync.wire import directive
from tests.unit.registry.test_rollout import manifest

EDGE = RolloutNode("edge-1", "edge", "eu")
OTHER = RolloutNode("edge-2", "edge", "us")


def queued(session: Session) -> list[tuple[str, int]]:
    """What the session's stream will send next, drained."""
    out = []
    while not session.outbox.empty():
        message = session.outbox.get_nowait()
        assert message is not None
        out.append((message.release.model, message.release.version))
    return out


def run(tmp_path: Path, scenario: Callable[[SyncService, Database], Awaitable[None]]) -> None:
    async def main() -> None:
        db = Database(RegistrySettings(home=tmp_path))
        await db.open()
        try:
            await scenario(SyncService(db.settings, db, SyncMetrics()), db)
        finally:
            db.close()

    asyncio.run(main())


def session(node: RolloutNode, active: dict[str, int] | None = None) -> Session:
    return Session(node, "ipv4:127.0.0.1:1", dict(active or {}), generation=0)


def test_a_release_is_queued_once_per_node_and_again_only_when_it_changes(
        tmp_path: Path) -> None:
    async def scenario(service: SyncService, db: Database) -> None:
        await db.run(db.catalog.create_version, manifest("m"))
        s = session(EDGE)
        await service.pusher.push(s)
        assert queued(s) == [("m", 1)]
        await service.pusher.push(s)
        assert queued(s) == []  # nothing changed for it
        await db.run(db.catalog.create_version, manifest("m", seed=1))
        await db.run(db.catalog.promote, "m", 2)
        await service.pusher.push(s)
        assert queued(s) == [("m", 2)]

    run(tmp_path, scenario)


def test_a_node_already_serving_the_version_is_sent_nothing(tmp_path: Path) -> None:
    async def scenario(service: SyncService, db: Database) -> None:
        await db.run(db.catalog.create_version, manifest("m"))
        s = session(EDGE, active={"m": 1})
        await service.pusher.push(s)
        assert queued(s) == []

    run(tmp_path, scenario)


def test_push_all_reaches_every_connected_node_with_its_own_signed_directive(
        tmp_path: Path) -> None:
    async def scenario(service: SyncService, db: Database) -> None:
        sessions = {n.node_id: session(n) for n in (EDGE, OTHER)}
        service.sessions.update(sessions)
        await db.run(db.catalog.create_version, manifest("m"))
        await service.pusher.push_all()
        verifier = Verifier(db.anchor.signer.key.public_key())
        for node_id, s in sessions.items():
            message = s.outbox.get_nowait()
            assert message is not None and s.outbox.empty()
            release = message.release
            assert (release.model, release.version, release.alias) == ("m", 1, "production")
            # what the node itself checks before installing: signature, node, release
            node_side = directive.Directives(tmp_path / node_id, node_id, verifier)
            d = node_side.check(release.directive, release.directive_signature, "m", 1,
                                release.manifest_sha256)
            assert d.node_id == node_id

    run(tmp_path, scenario)


def test_closing_a_session_ends_its_stream(tmp_path: Path) -> None:
    s = session(EDGE)
    s.outbox.put_nowait(pb.ServerMessage(release=pb.Release(model="m", version=1)))
    s.close()
    assert s.outbox.get_nowait() is not None and s.outbox.get_nowait() is None
