"""The loops beside ``registry serve``'s streams, each on its own interval; a step that fails
is logged and tried again on the next, never ends its loop.

Desired releases are pushed: the watcher notices commits made by other processes (``registry
publish``/``promote``/``rollback`` write the same SQLite file) and sends each connected node the
releases that changed for it. The others keep the TUF timestamp fresh, tell the nodes the audit
chain's head and step the wave rollouts."""

from __future__ import annotations

import asyncio
import logging
import time

from registry.errors import NotPrimary
from registry.releases import gate, waves
from registry.server.metrics import SyncMetrics
from registry.server.service import SyncService
from registry.server.session import Database
from registry.settings import RegistrySettings
from registry.store.chain import Head
from serving import tasks

log = logging.getLogger(__name__)


class Ticks:
    def __init__(self, settings: RegistrySettings, db: Database, service: SyncService,
                 metrics: SyncMetrics) -> None:
        self.settings, self.db, self.service, self.metrics = settings, db, service, metrics
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [asyncio.create_task(loop()) for loop in
                       (self._watch, self._steer, self._keep_fresh, self._tell)]

    async def stop(self) -> None:
        await tasks.stop(*self._tasks)
        self._tasks = []

    async def advance(self) -> None:
        """The TUF metadata signed and sent (``registry.server.metadata``), and releases that
        now have their signatures pushed."""
        if await self.service.metadata.advance(signing=self.service.refusing is None):
            await self.service.pusher.push_all()

    async def _watch(self) -> None:
        seen = await self.db.run(self.db.data_version)
        while True:
            await asyncio.sleep(self.settings.watch_interval_s)
            try:
                version = await self.db.run(self.db.data_version)
                if version != seen and self.service.refusing is None:
                    await self.service.load_generations()
                    await self.advance()  # before releases: nodes check them against it
                    await self.service.pusher.push_all()
                    await self.service.intake.load_policies()
                    seen = version  # only once pushed: a failed push is tried again
            except Exception:  # a bad moment must not end pushing for good
                log.exception("pushing changes failed; retrying")

    async def _keep_fresh(self) -> None:
        interval = min(60.0, max(0.5, self.settings.timestamp_expiry_s / 6))
        while True:
            await asyncio.sleep(interval)
            await self.advance()

    async def _tell(self) -> None:
        """Every ``witness_interval_s``: when the audit chain moved, tell the nodes its new
        head (``registry.server.witness_teller``; in a group once a standby holds it)."""
        told: Head | None = None
        while True:
            await asyncio.sleep(self.settings.witness_interval_s)
            if self.service.refusing is not None:
                continue
            try:
                head = await self.db.run(self.service.witnesses.due)
                if head is not None and head != told:
                    self.service.witnesses.tell(head)
                    told = head
            except Exception:  # a busy database or a bad key file: tell them next time
                log.exception("telling the nodes the audit head failed; retrying")

    async def _steer(self) -> None:
        """The wave rollouts, stepped every ``wave_tick_s`` on the registry that may write (a
        standby's turn comes when it is promoted); their changes are pushed by ``_watch``."""
        while True:
            await asyncio.sleep(self.settings.wave_tick_s)
            if self.service.refusing is not None:
                continue
            try:
                for line in await self.db.run(self.db.steer, time.time()):
                    log.info("rollout: %s", line)
                self.metrics.rollouts(await self.db.run(waves.newest, self.db.catalog.db.conn),
                                      waves.STATES, gate.HOLDS)
            except NotPrimary:
                pass  # lost the lease: the next primary steers
            except Exception:  # a bad moment must not end the rollouts for good
                log.exception("stepping the wave rollouts failed; retrying")
