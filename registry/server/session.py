"""What the registry's services share: the database on its own thread (``Database``), the node
messages written behind (``WriteBehind``) and one node's open stream (``Session``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from registry.fleet import nodes
from registry.fleet.nodes import NodeBook
from registry.ha import changes
from registry.releases import steering, waves
from registry.releases.catalog import Catalog
from registry.releases.plan import RolloutNode, Target
from registry.settings import RegistrySettings
from registry.store import chain
from registry.store.chain import Head
from registry.store.db import connect, read
from registry.trust import anchor
from registry.trust.anchor import audited
from serving import tasks
from serving.protocol.budget import Budget
from sync.gen import sync_pb2 as pb

log = logging.getLogger(__name__)
T = TypeVar("T")
WAVES_ACTOR = "registry:waves"  # who the audit log names for what a wave rollout's gate did
MAX_PENDING = 200_000  # node writes kept while the database cannot take them


@dataclass(frozen=True)
class Desired:
    targets: list[list[Target]]  # per node asked about
    retired: dict[str, int]  # model -> its newest version: no node is to run it
    head: Head | None


class Database:
    """The registry database on one thread: sqlite3 connections belong to the thread that
    opened them, and a write waiting for a publisher's lock must not stall the event loop."""

    def __init__(self, settings: RegistrySettings) -> None:
        self.settings = settings
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="registry-db")
        self.catalog: Catalog
        self.nodes: NodeBook
        self.anchor: anchor.Anchor

    async def open(self) -> None:
        def opened() -> None:
            db = connect(self.settings.database)
            self.anchor = anchor.for_settings(self.settings)
            self.anchor.signer  # noqa: B018 - loads the key now: directives are signed with it
            self.catalog = Catalog(db, self.settings.actor, self.anchor)
            self.nodes = NodeBook(db, self.anchor)

        await self.run(opened)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    def desired(self, nodes: list[RolloutNode]) -> Desired:
        """Every node's desired releases, the retired models and the audit chain's head, from
        one snapshot (a read transaction): the head signed into each directive is the one
        they came from."""
        with read(self.catalog.db) as conn:
            plan = self.catalog.plan()
            return Desired([plan.desired(n) for n in nodes], plan.retired, chain.head(conn))

    def steer(self, at: float) -> list[str]:
        """One step of the wave rollouts (``registry.releases.waves``): what happened, for the
        log."""
        if not any(r.state in waves.STEPPED for r in waves.unfinished(self.catalog.db.conn)):
            return []  # nothing to step: no write transaction
        with audited(self.catalog.db, self.anchor) as conn:
            return steering.tick(conn, at, WAVES_ACTOR)

    def data_version(self) -> int:
        """How far the replicated data goes (the newest captured change): what pushes depend
        on. Not ``PRAGMA data_version``: the primary's lease renewals change the file every
        half second and would look like a publish."""
        return changes.position(self.catalog.db.conn)

    def reopen(self) -> None:
        """On this thread, after the database file was replaced (a standby's resync)."""
        db = connect(self.settings.database)
        self.catalog = Catalog(db, self.settings.actor, self.anchor)
        self.nodes = NodeBook(db, self.anchor)

    def close(self) -> None:
        self._thread.submit(lambda: self.catalog.db.conn.close()).result()
        self._thread.shutdown()


class WriteBehind:
    """What nodes send up (hellos, disconnections, acks, quality reports), written behind:
    queued on the event loop and written every ``interval_s`` in one transaction on the
    database thread (``NodeBook.write``) — one commit, fsync and signed-head move per interval
    instead of one per message. Each ack keeps its own audit record, in the same transaction
    as its change. ``stop`` writes what is still queued; a write the database could not take
    (busy, locked) is tried again with the next batch."""

    def __init__(self, db: Database, interval_s: float) -> None:
        self.db, self.interval_s = db, interval_s
        self.pending: list[nodes.Write] = []
        self._task: asyncio.Task[None] | None = None
        self._flushing = asyncio.Lock()

    def add(self, write: nodes.Write) -> None:
        self.pending.append(write)
        if len(self.pending) > MAX_PENDING:  # the database has been failing for a while
            dropped, self.pending = self.pending[:-MAX_PENDING], self.pending[-MAX_PENDING:]
            log.error("dropped %d node writes the database could not take (first: %s)",
                      len(dropped), dropped[0].what)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.flush()
            except Exception:  # the next interval tries again
                log.exception("writing node messages failed")

    async def flush(self) -> None:
        """Write everything queued so far (in order) and wait until it is committed."""
        async with self._flushing:
            writes, self.pending = self.pending, []
            if writes:
                again = await self.db.run(self.db.nodes.write, writes)
                self.pending[:0] = again

    async def stop(self) -> None:
        await tasks.stop(self._task)
        self._task = None
        await self.flush()


@dataclass
class Session:
    node: RolloutNode
    peer: str
    active: dict[str, int]  # what the node said it serves at hello
    generation: int  # of the token it connected with
    outbox: asyncio.Queue[pb.ServerMessage | None] = field(default_factory=asyncio.Queue)
    sent: dict[str, int] = field(default_factory=dict)  # model -> version pushed or held
    budgets: dict[str, Budget] = field(default_factory=dict)  # model -> last budget pushed
    seqs: dict[str, int] = field(default_factory=dict)  # model -> seq of the last directive
    holds: set[str] = field(default_factory=set)  # models it holds (hello) or was sent here
    retiring: dict[str, int] = field(default_factory=dict)  # model -> version told to retire
    pushed: asyncio.Event = field(default_factory=asyncio.Event)  # set after the first push
    root_version: int = 0  # the newest TUF root the node trusts (hello, then what was sent)
    trust_sent: tuple[int, str, str] = (0, "", "")  # timestamp version, snapshot, targets sha
    error: str | None = None  # a protocol violation: the stream ends INVALID_ARGUMENT

    def __post_init__(self) -> None:
        self.holds |= self.active.keys()  # what it serves, it holds

    def close(self) -> None:
        self.outbox.put_nowait(None)
