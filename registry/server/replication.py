"""Registry to registry over gRPC: the primary's ``Replication`` service and the standby's
``Follower``.

A standby says how far it is (its newest change id and that change's digest, its audit head);
the primary checks that this is a prefix of its own history and streams whole transactions of
captured changes after it, or tells it to resync from a snapshot (empty, too far behind, or
diverged: a former primary that wrote what never reached the others). The standby fetches the
blobs a batch records (digest checked) before it commits the batch, applies it in one
transaction, signs its audit head and acks the position; the primary records the ack, which is
what a semi-synchronous commit waits for (``registry.ha.changes.wait_replicated``).

Everything the primary sends is checked before use: table and column names come from the
schema, never from the wire; a snapshot must pass its digest, ``integrity_check`` and the audit
chain walk before it replaces anything, and the database it replaces is kept aside.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import re
import shutil
import sqlite3
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import grpc

from registry.ha import changes
from registry.ha.changes import Change
from registry.server.fetch import SHA256
from registry.settings import RegistrySettings
from registry.store import chain, role
from registry.store.blobs import BlobStore, chunks
from registry.store.db import integrity_check, read, transaction
from registry.trust import anchor
from serving import tasks
from serving.config.tokens import node_token
from serving.protocol.keepalive import KEEPALIVE
from sync.gen import sync_pb2 as pb
from sync.gen import sync_pb2_grpc as pb_grpc
from sync.wire import auth
from sync.wire.chunk import misfit

if TYPE_CHECKING:
    from registry.server.session import Database

log = logging.getLogger(__name__)
SERVICE = "tiered.sync.v1.Replication"
TIER = "registry"  # the token tier that opens Replication, and nothing else
REGION = "fleet"
MAX_BEHIND = 100_000  # changes: a standby further behind takes a snapshot
MESSAGE_BYTES = 2 << 20  # changes per message, below gRPC's 4 MiB receive limit
MAX_PENDING_BYTES = 256 << 20  # one read of the primary, held until applied
POLL_S = 0.02  # how often a Follow stream looks for new changes
HEARTBEAT_S = 1.0
SILENCE_S = 5 * HEARTBEAT_S  # a standby reconnects after this long without a message
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 8 << 20),
                   # pings find a dead link under a long snapshot or blob transfer too; the
                   # primary's registry server permits them (the same policy)
                   *KEEPALIVE.client()]


def default_id(settings: RegistrySettings, port: int) -> str:
    """``registry-<address>-<port>`` as a DNS label (what a replica token can carry)."""
    if settings.registry_id:
        return settings.registry_id
    label = re.sub(r"[^a-z0-9-]+", "-", f"registry-{settings.advertised}-{port}".lower())
    return label.strip("-")[:63].strip("-")


def token(settings: RegistrySettings, registry_id: str) -> str:
    """The token a standby follows with: derived from the registry secret that every registry
    of the group holds (nodes' tokens are too), for tier ``registry``."""
    assert settings.token is not None
    return node_token(settings.token.get_secret_value(), registry_id, TIER, REGION)


async def _registry_only(context: grpc.aio.ServicerContext) -> str:
    proven = auth.proven(context)
    if proven is None or proven.tier != TIER:
        await context.abort(grpc.StatusCode.PERMISSION_DENIED, "replication is for registries "
                            "of this fleet (a token of tier 'registry')")
    assert proven is not None
    return proven.node_id


class ReplicationService(pb_grpc.ReplicationServicer):
    """The primary's side: the Follow stream, snapshots and blobs for standbys.

    Why one class: it is one gRPC servicer (grpc registers the service's methods from one
    object); what they share is the database thread and the check that the caller is a
    registry of this fleet."""

    def __init__(self, settings: RegistrySettings, db: Database,
                 registry_id: Callable[[], str]) -> None:
        self.settings, self.db, self.registry_id = settings, db, registry_id
        self.streams = 0

    async def Follow(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        replica = await _registry_only(context)
        hello = await self._hello(replica, context)
        reason = await self.db.run(self._misfit, hello)
        if reason is not None:
            log.info("standby %s must resync: %s", replica, reason)
            await context.write(pb.PrimaryMessage(resync=pb.Resync(reason=reason)))
            return
        reader = asyncio.create_task(self._acks(replica, context))
        self.streams += 1
        log.info("standby %s following from change %d", replica, hello.position)
        try:
            await self._stream(context, hello.position, reader)
        finally:
            self.streams -= 1
            await tasks.stop(reader)

    async def _hello(self, replica: str, context: grpc.aio.ServicerContext) -> pb.FollowHello:
        """The standby's first message, refused unless it is the token's registry, this one
        is not a standby itself, and both sign with the same key."""
        first = await context.read()
        if first is grpc.aio.EOF or first.WhichOneof("kind") != "hello":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first message must be "
                                "a hello")
        hello: pb.FollowHello = first.hello
        if hello.registry_id != replica:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"this token is registry "
                                f"{replica!r}'s")
        state = await self.db.run(lambda: role.state(self.db.catalog.db.conn))
        if state.role == "standby":
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"this registry is a "
                                f"standby; follow the primary ({state.leader or 'unknown'})")
        ours = self.db.anchor.signer.key_id
        if hello.signing_key_id != ours:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"this registry signs with "
                                f"key {ours}, the standby holds {hello.signing_key_id[:40]!r}: "
                                f"every registry of a group needs the same signing key")
        return hello

    async def _stream(self, context: grpc.aio.ServicerContext, at: int,
                      reader: asyncio.Task[None]) -> None:
        """The changes after ``at`` as they are written, a heartbeat a second when there are
        none, until the standby hangs up (or falls too far behind)."""
        beat = 0.0
        while not reader.done():
            found = await self.db.run(self._after, at)
            if found is None:
                await context.write(pb.PrimaryMessage(resync=pb.Resync(
                    reason=f"more than {MAX_BEHIND} changes behind")))
                return
            if found:
                await self._send(context, found)
                at = found[-1].id
            elif time.monotonic() - beat >= HEARTBEAT_S:
                term = await self.db.run(lambda: role.state(self.db.catalog.db.conn).term)
                await context.write(pb.PrimaryMessage(heartbeat=pb.Heartbeat(
                    position=at, term=term, registry_id=self.registry_id())))
                beat = time.monotonic()
            else:
                await asyncio.sleep(POLL_S)

    def _misfit(self, hello: pb.FollowHello) -> str | None:
        """Why the standby cannot go on from where it is (None: it can)."""
        conn = self.db.catalog.db.conn
        if hello.position <= 0:
            return "it holds no changes yet"
        first = changes.first_position(conn)
        if first == 0 or hello.position < first - 1:
            return f"its position {hello.position} is before the changes this primary keeps"
        if changes.digest_at(conn, hello.position) != hello.position_digest:
            return (f"its change {hello.position} is not this primary's (it wrote what never "
                    f"reached the primary, or the primary is behind it)")
        if hello.head_seq > 0 and chain.hash_at(conn, hello.head_seq) != hello.head_hash:
            return f"its audit record {hello.head_seq} is not this primary's"
        return None

    def _after(self, at: int) -> list[Change] | None:
        with read(self.db.catalog.db) as conn:
            found = changes.read_changes(conn, at, MAX_BEHIND + 1)
        return None if len(found) > MAX_BEHIND else found

    async def _send(self, context: grpc.aio.ServicerContext, found: list[Change]) -> None:
        batch, size = pb.Batch(), 0
        for c in found:
            if size and size + len(c.row) > MESSAGE_BYTES:
                await context.write(pb.PrimaryMessage(batch=batch))
                batch, size = pb.Batch(), 0
            batch.changes.append(pb.Change(id=c.id, table=c.table, op=c.op, row=c.row))
            size += len(c.row) + 64
        batch.last = True
        await context.write(pb.PrimaryMessage(batch=batch))

    async def _acks(self, replica: str, context: grpc.aio.ServicerContext) -> None:
        while (message := await context.read()) is not grpc.aio.EOF:
            if message.WhichOneof("kind") == "applied" and message.applied.position > 0:
                at = message.applied.position
                await self.db.run(self._acked, replica, at)

    def _acked(self, replica: str, at: int) -> None:
        with transaction(self.db.catalog.db) as conn:
            changes.acked(conn, replica, min(at, changes.position(conn)))

    async def Snapshot(self, request: pb.SnapshotRequest,
                       context: grpc.aio.ServicerContext) -> AsyncIterator[pb.SnapshotChunk]:
        replica = await _registry_only(context)
        loop = asyncio.get_running_loop()
        path, at = await loop.run_in_executor(None, snapshot, self.settings)
        log.info("sending a snapshot (up to change %d, %d bytes) to standby %s", at,
                 path.stat().st_size, replica)
        try:
            digest, size = hashlib.sha256(), path.stat().st_size
            async for offset, data in chunks(path, 0, size, self.settings.chunk_bytes):
                digest.update(data)
                yield pb.SnapshotChunk(data=data, offset=offset)
            yield pb.SnapshotChunk(offset=size, size=size, sha256=digest.hexdigest(),
                                   position=at)
        finally:
            path.unlink(missing_ok=True)

    async def Blob(self, request: pb.FetchRequest,
                   context: grpc.aio.ServicerContext) -> AsyncIterator[pb.Chunk]:
        await _registry_only(context)
        if not SHA256.fullmatch(request.sha256):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "sha256 must be 64 lower-case "
                                "hex digits")
        listed = await self.db.run(lambda: self.db.catalog.db.conn.execute(
            "SELECT size FROM blobs WHERE sha256 = ?", (request.sha256,)).fetchone())
        path = BlobStore(self.settings.blobs).path(request.sha256)
        if listed is None or not path.is_file():
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no blob {request.sha256}")
        size = path.stat().st_size
        if not 0 <= request.offset <= size:
            await context.abort(grpc.StatusCode.OUT_OF_RANGE, f"offset past {size}")
        async for offset, data in chunks(path, request.offset, size, self.settings.chunk_bytes):
            yield pb.Chunk(offset=offset, data=data, size=size)


def snapshot(settings: RegistrySettings) -> tuple[Path, int]:
    """The database as of one read transaction (SQLite's online backup: writers go on), in a
    temporary file, with the newest change id in it."""
    tmp = settings.home / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=tmp, prefix="snapshot-", suffix=".sqlite3")
    os.close(fd)
    path = Path(name)
    source = sqlite3.connect(settings.database, timeout=30)
    target = sqlite3.connect(path)
    try:
        source.backup(target)
        at = changes.position(target)
    finally:
        target.close()
        source.close()
    return path, at


class Resync(Exception):
    """The primary asked for a snapshot."""


class BlobFetch:
    """The blobs a standby lacks, from the primary: each into a temporary file, its size and
    digest checked, then stored."""

    def __init__(self, settings: RegistrySettings, token: str) -> None:
        self.settings, self.token = settings, token
        self.store = BlobStore(settings.blobs)

    async def hold(self, stub: pb_grpc.ReplicationStub, sha: str, size: int) -> None:
        """Make sure this registry holds blob ``sha`` (fetched unless it does already)."""
        if not self.store.has(sha):
            await self.fetch(stub, sha, size)

    async def fetch(self, stub: pb_grpc.ReplicationStub, sha: str, size: int) -> None:
        tmp = self.settings.blobs / "tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=tmp, prefix="replica-")
        path = Path(name)
        try:
            with os.fdopen(fd, "wb") as out:
                got, digest = await self._download(stub, sha, size, out)
            if got != size or digest != sha:
                raise changes.BadChange(f"blob {sha}: {got} bytes with digest "
                                        f"{digest[:16]}, not what was listed")
            await asyncio.get_running_loop().run_in_executor(None, self.store.put, path)
        finally:
            path.unlink(missing_ok=True)

    async def _download(self, stub: pb_grpc.ReplicationStub, sha: str, size: int,
                        out: BinaryIO) -> tuple[int, str]:
        """Write the blob's chunks to ``out``, each checked as a node's download checks it;
        return how many bytes came and their digest."""
        digest, got = hashlib.sha256(), 0
        async for chunk in stub.Blob(pb.FetchRequest(sha256=sha, offset=0),
                                     metadata=auth.metadata(self.token)):
            problem = misfit(chunk, got, size)
            if problem is not None:
                raise changes.BadChange(f"blob {sha}: {problem}")
            digest.update(chunk.data)
            await asyncio.to_thread(out.write, chunk.data)
            got += len(chunk.data)
        return got, digest.hexdigest()


class Resyncer:
    """A standby's resync: a snapshot of the primary's database, checked first, replaces this
    registry's; the database it replaces is kept in ``<home>/replaced/``."""

    def __init__(self, settings: RegistrySettings, db: Database, registry_id: str, token: str,
                 blobs: BlobFetch) -> None:
        self.settings, self.db, self.registry_id, self.token = settings, db, registry_id, token
        self.blobs = blobs

    async def resync(self, stub: pb_grpc.ReplicationStub, target: str, reason: str) -> int:
        """Replace the database; return the newest change the snapshot holds."""
        tmp = self.settings.home / "tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=tmp, prefix="snapshot-in-", suffix=".sqlite3")
        path = Path(name)
        try:
            with os.fdopen(fd, "wb") as out:
                position = await self._download(stub, out)
            wanted = await asyncio.get_running_loop().run_in_executor(
                None, _checked_snapshot, path, target)
            for sha, size in wanted:
                await self.blobs.hold(stub, sha, size)
            kept = await self.db.run(self._swap, path, reason)
            log.warning("replaced this registry's database with the primary's snapshot "
                        "(up to change %d)%s", position,
                        f"; the one it replaced is kept at {kept}" if kept else "")
            return position
        finally:
            path.unlink(missing_ok=True)

    async def _download(self, stub: pb_grpc.ReplicationStub, out: BinaryIO) -> int:
        """Write the snapshot's chunks to ``out`` (fsynced) and check them against the digest
        that ends the stream; return the newest change the snapshot holds."""
        digest, got, last = hashlib.sha256(), 0, None
        async for chunk in stub.Snapshot(pb.SnapshotRequest(registry_id=self.registry_id),
                                         metadata=auth.metadata(self.token)):
            if chunk.sha256:
                last = chunk
                break
            if chunk.offset != got:
                raise changes.BadChange("snapshot chunks out of order")
            digest.update(chunk.data)
            out.write(chunk.data)
            got += len(chunk.data)
        out.flush()
        os.fsync(out.fileno())
        if last is None or last.size != got or last.sha256 != digest.hexdigest():
            raise changes.BadChange("the snapshot does not match its digest")
        return int(last.position)

    def _swap(self, path: Path, reason: str) -> Path | None:
        """On the database thread: close, move the old database (and its signed head) aside,
        put the snapshot in place, reopen."""
        db = self.db
        conn = db.catalog.db.conn
        head = chain.head(conn)
        conn.close()
        kept = None if head is None else self._keeping(reason)
        for suffix in ("", "-wal", "-shm"):
            _set_aside(Path(f"{self.settings.database}{suffix}"), kept)
        _set_aside(self.settings.home / anchor.FILE, kept)
        os.replace(path, self.settings.database)
        db.reopen()
        db.anchor.create(db.catalog.db)
        return kept

    def _keeping(self, reason: str) -> Path:
        """A new folder for the database being replaced, saying why."""
        kept = self.settings.home / "replaced" / time.strftime("%Y%m%dT%H%M%S")
        kept.mkdir(parents=True, exist_ok=True)
        (kept / "why.txt").write_text(f"{reason}\n")
        return kept


def _set_aside(old: Path, kept: Path | None) -> None:
    """Move ``old`` into ``kept`` (None: an empty database, nothing worth keeping: delete)."""
    if not old.exists():
        return
    if kept is not None:
        shutil.move(old, kept / old.name)
    else:
        old.unlink()


class PendingRead:
    """The changes of one read of the primary, which may come in several messages: applied
    together once the last is in."""

    def __init__(self) -> None:
        self.changes: list[Change] = []
        self.size = 0

    def add(self, message: pb.Batch) -> list[Change] | None:
        """Take one message's changes; the whole read when this was its last message."""
        for c in message.changes:
            self.changes.append(Change(c.id, c.table, c.op, c.row))
            self.size += len(c.row)
        if self.size > MAX_PENDING_BYTES:
            raise Resync("one read of the primary is larger than a standby holds")
        if not (message.last and self.changes):
            return None
        found, self.changes, self.size = self.changes, [], 0
        return found


class Follower:
    """The standby's side: one stream to the primary at a time, re-opened with backoff; a
    snapshot when the primary says so. ``target()`` names the primary now (Consul's lock
    holder, or the static ``--follow``). The metrics read its positions and snapshots."""

    def __init__(self, settings: RegistrySettings, db: Database, registry_id: str,
                 target: Callable[[], str | None], on_replaced: Callable[[], None] | None = None
                 ) -> None:
        self.settings, self.db, self.registry_id, self.target = settings, db, registry_id, target
        self.token = token(settings, registry_id)
        self.blobs = BlobFetch(settings, self.token)
        self.resyncer = Resyncer(settings, db, registry_id, self.token, self.blobs)
        self.primary_position = 0
        self.position = 0
        self.applied_at = 0.0  # when the last batch was committed here (monotonic)
        self.following: str | None = None
        self.snapshots = 0
        self.on_replaced = on_replaced

    async def run(self) -> None:
        delay = 0.2
        while True:
            target = self.target()
            if target is None:
                await asyncio.sleep(0.2)
                continue
            try:
                await self.follow(target)
                delay = 0.2
            except Resync as exc:
                log.warning("resyncing from %s: %s", target, exc)
                await self.resync(target, str(exc))
                delay = 0.2
            except asyncio.CancelledError:
                raise
            except (grpc.RpcError, changes.BadChange, OSError, ValueError,
                    sqlite3.Error) as exc:
                log.warning("following %s: %s", target, _said(exc))
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
            except Exception:
                log.exception("following %s failed", target)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    def _channel(self, target: str) -> grpc.aio.Channel:
        return auth.channel(target, self.settings.ca_pem, CHANNEL_OPTIONS)

    def _hello(self) -> pb.FollowHello:
        with read(self.db.catalog.db) as conn:
            at = changes.position(conn)
            head = chain.head(conn)
            return pb.FollowHello(registry_id=self.registry_id, position=at,
                                  position_digest=changes.digest_at(conn, at) or "",
                                  head_seq=head.seq if head else 0,
                                  head_hash=head.hash if head else "",
                                  signing_key_id=self.db.anchor.signer.key_id)

    async def follow(self, target: str) -> None:
        """Say how far this registry is, then apply what the primary streams until the
        stream ends or the primary moves."""
        async with self._channel(target) as channel:
            stub = pb_grpc.ReplicationStub(channel)
            hello = await self.db.run(self._hello)
            self.position = hello.position
            call = stub.Follow(metadata=auth.metadata(self.token))
            await call.write(pb.FollowerMessage(hello=hello))
            self.following = target
            try:
                await self._stream(stub, call, target)
            finally:
                self.following = None
                call.cancel()

    async def _stream(self, stub: pb_grpc.ReplicationStub, call: Any, target: str) -> None:
        pending = PendingRead()
        while (message := await self._next(call)) is not None:
            if self.target() != target:
                return  # the primary moved
            kind = message.WhichOneof("kind")
            if kind == "resync":
                raise Resync(message.resync.reason)
            if kind == "heartbeat":  # answered: the primary sees who follows
                self.primary_position = message.heartbeat.position
                await self._ack(call)
                continue
            found = pending.add(message.batch)
            if found is not None:
                await self._apply(stub, found)
                self.primary_position = max(self.primary_position, self.position)
                await self._ack(call)

    async def _next(self, call: Any) -> pb.PrimaryMessage | None:
        """The primary's next message; None when it ended the stream."""
        # the primary sends at least a heartbeat a second: silence is a dead link (a cut that
        # drops packets ends no TCP connection by itself)
        try:
            message = await asyncio.wait_for(call.read(), SILENCE_S)
        except TimeoutError:
            raise ConnectionError(f"nothing from the primary for {SILENCE_S:g}s: "
                                  f"reconnecting") from None
        return None if message is grpc.aio.EOF else message

    async def _ack(self, call: Any) -> None:
        await call.write(pb.FollowerMessage(applied=pb.Applied(position=self.position)))

    async def _apply(self, stub: pb_grpc.ReplicationStub, found: list[Change]) -> None:
        """Fetch the blobs the changes record, then commit them in one transaction and sign
        the new audit head."""
        for sha, size in changes.blobs_in(found):
            if not SHA256.fullmatch(sha):
                raise changes.BadChange(f"a blob named {sha[:70]!r}")
            await self.blobs.hold(stub, sha, size)
        db = self.db
        self.position = await db.run(changes.apply, db.catalog.db, found)
        await db.run(db.anchor.advance, db.catalog.db)
        self.applied_at = time.monotonic()

    async def resync(self, target: str, reason: str) -> None:
        async with self._channel(target) as channel:
            position = await self.resyncer.resync(pb_grpc.ReplicationStub(channel), target,
                                                  reason)
        self.snapshots += 1
        self.position = position
        if self.on_replaced is not None:
            self.on_replaced()


def _checked_snapshot(path: Path, leader: str) -> list[tuple[str, int]]:
    """A received snapshot, before it replaces anything: intact, its chain whole; made a
    standby's (its role and the primary's standbys reset). Returns the blobs it lists."""
    from registry.store.db import connect

    db = connect(path)
    try:
        result = integrity_check(db)
        if result != "ok":
            raise changes.BadChange(f"the snapshot fails integrity_check: {result[:200]}")
        checked, finding = chain.verify(db)
        if finding is not None:
            raise changes.BadChange(f"the snapshot's audit chain is broken at record "
                                        f"{finding.seq}: {finding.reason}")
        with transaction(db) as conn:
            role.set_role(conn, "standby", leader=leader)
            role.promoted_term(conn)
            conn.execute("DELETE FROM replicas")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        rows = conn.execute("SELECT sha256, size FROM blobs").fetchall()
        for sha, _ in rows:
            if not SHA256.fullmatch(str(sha)):
                raise changes.BadChange("the snapshot lists a malformed blob digest")
        log.info("snapshot checked: %d audit records", checked)
        return [(str(s), int(n)) for s, n in rows]
    finally:
        db.conn.close()


def _said(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    return str(exc)
