"""A node runs its background workers (the sync subscriber) only as the primary: with
``--workers N`` the second and later workers serve requests but never sync the store."""

from __future__ import annotations

import asyncio

from serving.config.settings import ServingSettings
from serving.fleet.node import Node
from tests.unit.serving.test_dataplane import OneModel


class Subscriber:
    def __init__(self) -> None:
        self.ran = self.closed = False

    async def run(self) -> None:
        self.ran = True
        await asyncio.Event().wait()

    async def close(self) -> None:
        self.closed = True


def started(primary: bool) -> Subscriber:
    subscriber = Subscriber()

    async def main() -> None:
        node = Node(ServingSettings(), OneModel(), {})  # type: ignore[arg-type]
        node.primary = primary
        node.add(subscriber)
        await node.start()
        await asyncio.sleep(0.01)
        await node.stop()

    asyncio.run(main())
    return subscriber


def test_only_the_primary_worker_runs_the_sync_subscriber() -> None:
    primary, follower = started(True), started(False)
    assert primary.ran and primary.closed
    assert not follower.ran and not follower.closed
