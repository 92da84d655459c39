"""Who is the primary: a Consul session lock, a lease that fences writes, promotion and
demotion (``registry serve`` with ``REGISTRY_HA``).

Each registry registers a TTL check (on a service of its own, ``tiered-registry-lock``) that
its process passes every third of ``lock_ttl_s`` and holds a session tied to that check and to
its node's ``serfHealth``: when the process or the host dies, or the host is cut off from
Consul, the check or the node fails and Consul invalidates the session, which releases the
lock key. The lock then waits ``lock_ttl_s`` (Consul's lock-delay) before another session may
take it.

Fencing: the primary accepts writes only while its lease (in the database, checked by SQLite
triggers on every write to a replicated table) is unexpired, and it extends the lease only to
one second less than the lock-delay past the moment it last *asked* Consul and saw its own
session still holding the key. Whatever invalidated the session happened after that question
was asked, so the next primary can take the lock only after the old lease has run out: at no
moment do two registries accept writes.

Restarts: a supervisor (compose ``restart: unless-stopped``, systemd, Swarm) restarts a killed
registry within a fraction of a second, with the same home, port and id. Each process therefore
has a lock check of its own (``<registry_id>-lock-<random>``): one that kept its predecessor's
check id would pass the dead process's check, keep its session valid and the lock held, and
follow its own address as the primary's, while no live process led (every write refused). And
before its first session, a process ends what its predecessors left (``clear_predecessors``):
it deregisters their lock checks on its agent and destroys every session in its registry's
name, which frees the lock and their candidate entries at once rather than a TTL later.

Why destroying a predecessor's session is safe: it is one more way a session ends, and the
fencing above holds for every way. The predecessor (dead, paused, or a live process given the
same id by mistake on another host) saw its session holding the key last at some moment before
the destroy; its lease runs out less than ``lock_ttl_s`` after that, and Consul's lock-delay
keeps the key from anyone for ``lock_ttl_s`` after the destroy. A paused predecessor on the same
home shares the database file with its successor, which sets the role to standby when it starts:
that file refuses writes at once, sooner than the lease would (two live ``registry serve`` on
one home are not supported: each demotion writes the shared role).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import re
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

import consul
import sqlite_utils

from registry.ha import changes
from registry.settings import RegistrySettings
from registry.store import chain, role
from registry.store.db import transaction
from serving import tasks
from serving.fleet import discovery

log = logging.getLogger(__name__)
LOCK_SERVICE = "tiered-registry-lock"  # one per registry of a group: its lock check
JOINING = "(joining)"  # deferred_to while REGISTRY_JOIN waits for a history to copy
ERRORS = (consul.ConsulException, OSError, asyncio.TimeoutError, ValueError)


def leader_value(raw: Any) -> tuple[str, str, int] | None:
    """The lock key's value (``{"registry_id", "address", "term"}``) as written by a registry;
    None when it is anything else: the catalog is hostile until checked."""
    try:
        data = json.loads(raw)
        registry_id, address, term = data["registry_id"], data["address"], data["term"]
        if not (isinstance(registry_id, str) and discovery.NODE_LABEL.fullmatch(registry_id)
                and isinstance(term, int) and term >= 0 and isinstance(address, str)):
            return None
        host, _, port = address.rpartition(":")
        return registry_id, discovery.host_port(discovery.checked_address(host.strip("[]")),
                                                discovery.checked_port(int(port))), term
    except (TypeError, ValueError, KeyError, AttributeError):
        return None


def candidate(raw: Any) -> tuple[str, int, int] | None:
    """A peer's candidate entry (``{"registry_id", "history_term", "position"}``), checked."""
    try:
        data = json.loads(raw)
        registry_id, term, position = data["registry_id"], data["history_term"], \
            data["position"]
    except (TypeError, ValueError, KeyError):
        return None
    if not (isinstance(registry_id, str) and discovery.NODE_LABEL.fullmatch(registry_id)
            and isinstance(term, int) and isinstance(position, int)
            and 0 <= term < 1 << 62 and 0 <= position < 1 << 62):
        return None
    return registry_id, term, position


def lock_value(registry_id: str, address: str, term: int) -> str:
    """What the lock key holds while a registry leads (``leader_value`` reads it back)."""
    return json.dumps({"registry_id": registry_id, "address": address, "term": term})


class LockSession:
    """This process's part of the lock in Consul: the TTL check it keeps passing, the session
    tied to that check (and to ``serfHealth``), the lock key and this process's candidate
    entry; and, once at start, what its predecessors left there."""

    def __init__(self, settings: RegistrySettings, registry_id: str, client: Any) -> None:
        self.consul = client
        self.settings, self.registry_id = settings, registry_id
        self.key = settings.lock_key
        self.candidates = f"{settings.lock_key.rsplit('/', 1)[0]}/candidates/"
        # this process's own: a predecessor's check or entry is never this one's (see above)
        incarnation = secrets.token_hex(4)
        self.candidate_key = f"{self.candidates}{registry_id}/{incarnation}"
        self.check_id = f"{registry_id}-lock-{incarnation}"
        self.session_name = f"tiered registry {registry_id}"
        self.session: str | None = None
        self.lock_delay = math.ceil(settings.lock_ttl_s)

    async def keep_passing(self) -> None:
        """Keep the lock check passing while this process runs (and re-register it when the
        agent lost it)."""
        interval = self.settings.lock_ttl_s / 3
        registered = False
        while True:
            try:
                if not registered:
                    # a service of its own: a critical node-level check would take every
                    # service of the host out of Consul's passing lists
                    await self.consul.agent.service.register(
                        LOCK_SERVICE, service_id=self.check_id, tags=["registry-lock"],
                        check={"CheckID": self.check_id, "Name": "registry lock",
                               "TTL": f"{self.settings.lock_ttl_s:g}s",
                               "DeregisterCriticalServiceAfter": "1m"})
                    registered = True
                await self.consul.agent.check.ttl_pass(self.check_id)
            except ERRORS as exc:
                registered = False
                log.warning("consul: cannot pass the lock check: %s", exc)
            await asyncio.sleep(interval)

    async def open(self) -> str:
        """This process's session, created when it has none (yet, or any more)."""
        if self.session is None:
            self.session = await self.consul.session.create(
                name=self.session_name,
                checks=["serfHealth", self.check_id], lock_delay=self.lock_delay,
                behavior="release")
        return self.session

    def forget(self) -> None:
        """The session is gone (invalidated, or the lock lost under it): the next round opens
        a new one."""
        self.session = None

    async def read(self) -> tuple[int, dict[str, Any] | None]:
        """The lock key as Consul's leader holds it now, and the index to wait on."""
        index, entry = await self.consul.kv.get(self.key, consistency="consistent")
        return index, entry

    async def holds(self) -> bool:
        _, entry = await self.read()
        return entry is not None and entry.get("Session") == self.session

    async def wait(self, index: int) -> None:
        """Until the key changes (a lost holder releases it), at most a second."""
        await self.consul.kv.get(self.key, index=index, wait="1s")

    async def take(self, value: str) -> bool:
        return bool(await self.consul.kv.put(self.key, value, acquire=self.session))

    async def announce(self, rank: tuple[int, int]) -> None:
        """Say how far this registry is (its candidate entry, held by its session)."""
        await self.consul.kv.put(self.candidate_key, json.dumps(
            {"registry_id": self.registry_id, "history_term": rank[0], "position": rank[1]}),
            acquire=self.session)

    async def better(self, rank: tuple[int, int]) -> str | None:
        """A live peer (its candidate entry held by a valid session) whose history beats
        ours: newer term, then more changes, then the smaller id. The election goes to the
        registry that holds the most, so an empty or lagging one never wins over it."""
        _, entries = await self.consul.kv.get(self.candidates, recurse=True,
                                              consistency="consistent")
        for entry in entries or []:
            if not entry.get("Session") or entry.get("Key") == self.candidate_key:
                continue
            peer = candidate(entry.get("Value"))
            if peer is None or peer[0] == self.registry_id:  # ours, or a predecessor's
                continue
            registry_id, term, position = peer
            if (term, position, self.registry_id) > (rank[0], rank[1], registry_id):
                return registry_id
        return None

    async def clear_predecessors(self) -> None:
        """End what earlier processes of this registry left in Consul (a restart: the same
        id): their lock checks on this agent (those of a process before per-process check ids
        too), every session in this registry's name (their check may be on another agent), and
        their candidate entries. Called before this process has a session of its own."""
        theirs = re.compile(rf"{re.escape(self.registry_id)}-lock(-[0-9a-f]{{8}})?")
        for service_id, service in (await self.consul.agent.services()).items():
            if service.get("Service") == LOCK_SERVICE and service_id != self.check_id and \
                    theirs.fullmatch(service_id):
                log.info("deregistering the lock check %s of an earlier process of this "
                         "registry: a restart must not keep its session, nor the lock it "
                         "holds", service_id)
                await self.consul.agent.service.deregister(service_id)
        _, sessions = await self.consul.session.list(consistency="consistent")
        for session in sessions or []:
            if session.get("Name") == self.session_name and session.get("ID") != self.session:
                log.info("destroying session %s of an earlier process of this registry",
                         session.get("ID"))
                await self.consul.session.destroy(session["ID"])
        mine = f"{self.candidates}{self.registry_id}"
        await self.consul.kv.delete(f"{mine}/", recurse=True)
        await self.consul.kv.delete(mine)  # where a process before per-process entries put it

    async def release(self, value: str) -> None:
        """Let the lock go (a clean stop: no lock-delay for the next primary)."""
        if self.session is not None:
            await self.consul.kv.put(self.key, value, release=self.session)

    async def end(self) -> None:
        """Take this process's entry, session and check away."""
        if self.session is not None:
            await self.consul.kv.delete(self.candidate_key)
            await self.consul.session.destroy(self.session)
        await self.consul.agent.service.deregister(self.check_id)

    async def close(self) -> None:
        await self.consul.close()


class LocalRole:
    """This registry's side of the election: its role, term and lease in the database, and the
    server's ``promote(term, previous)`` and ``demote(leader)``, which change what is
    registered, served and followed."""

    def __init__(self, registry_id: str, address: str,
                 db_run: Callable[..., Awaitable[Any]],
                 db: Callable[[], sqlite_utils.Database],
                 promote: Callable[[int, str | None], Awaitable[None]],
                 demote: Callable[[str | None], Awaitable[None]], lease_s: float) -> None:
        self.registry_id, self.address = registry_id, address
        self.run_db, self.db = db_run, db
        self.promote, self.demote = promote, demote
        self.lease_s = lease_s
        self.primary = False
        self.leader: str | None = None  # the address of the registry holding the lock
        self.term = 0

    async def rank(self) -> tuple[int, int]:
        """How recent and how long this registry's history is: (the term of its newest
        promotion, its newest change)."""
        def read() -> tuple[int, int]:
            conn = self.db().conn
            return role.state(conn).history_term, changes.position(conn)

        return await self.run_db(read)

    async def stored_term(self) -> int:
        """The newest term this registry's database knows."""
        return await self.run_db(lambda: role.state(self.db().conn).term)

    async def renew(self, asked: float) -> None:
        """Extend the lease to ``lease_s`` past the moment the lock was last seen ours."""
        def renew(until: float) -> None:
            with transaction(self.db()) as conn:
                role.renew(conn, until)

        await self.run_db(renew, asked + self.lease_s)

    async def lead(self, term: int, previous: str | None, asked: float, how: str) -> None:
        """Become the primary for ``term``: in the database (role, term, lease), then in the
        server."""
        def become(until: float) -> None:
            with transaction(self.db()) as conn:
                role.set_role(conn, "primary", term=term, registry_id=self.registry_id,
                              leader=self.address, lease_until=until)

        self.primary, self.term, self.leader = True, term, self.address
        await self.run_db(become, asked + self.lease_s)
        log.info("%s: primary for term %d", how, term)
        await self.promote(term, previous)

    async def lost(self) -> None:
        """The lock is no longer ours: a standby until the next round knows the primary."""
        self.primary = False
        await self.demote(None)

    async def follow(self, leader: str | None) -> None:
        if leader != self.leader:
            self.leader = leader
            log.info("the primary is %s", leader or "unreadable in the lock's value")
            await self.demote(leader)

    async def step_down(self) -> None:
        """Refuse writes now (a clean stop), before the lock is let go."""
        def standby() -> None:
            with transaction(self.db()) as conn:
                role.set_role(conn, "standby", leader=None)

        self.primary = False
        await self.run_db(standby)


class Leadership:
    """The election loop: a round at a time over the lock (``LockSession``) and this
    registry's role (``LocalRole``)."""

    def __init__(self, settings: RegistrySettings, registry_id: str, address: str,
                 db_run: Callable[..., Awaitable[Any]],
                 db: Callable[[], sqlite_utils.Database],
                 promote: Callable[[int, str | None], Awaitable[None]],
                 demote: Callable[[str | None], Awaitable[None]]) -> None:
        assert settings.consul_http_addr
        token = settings.consul_http_token
        client = discovery.client(settings.consul_http_addr,
                                  token.get_secret_value() if token else None)
        self.settings, self.registry_id, self.address = settings, registry_id, address
        self.lock = LockSession(settings, registry_id, client)
        self.local = LocalRole(registry_id, address, db_run, db, promote, demote,
                               lease_s=max(settings.lock_ttl_s - 1.0, 0.5))
        self.started = time.monotonic()
        self.deferred_to: str | None = None
        self.cleared = False  # what predecessors left in Consul is ended (once, at start)

    async def run(self) -> None:
        passing = asyncio.create_task(self.lock.keep_passing())
        try:
            while True:
                try:
                    await self._round()
                except ERRORS as exc:
                    # a Consul error is no reason to drop the session: it may still hold the
                    # lock, and a new session could never take it back (nobody would lead)
                    log.warning("consul: %s", exc)
                    if "invalid session" in str(exc).lower():
                        self.lock.forget()
                    await asyncio.sleep(0.5)
        finally:
            await tasks.stop(passing)

    async def _round(self) -> None:
        asked = time.time()
        if self.local.primary:
            await self._hold(asked)
            return
        await self._clear_once()
        index, entry = await self.lock.read()
        holder = entry.get("Session") if entry else None
        value = leader_value(entry.get("Value")) if entry else None
        session = await self.lock.open()
        rank = await self.local.rank()
        await self.lock.announce(rank)
        if holder is not None and holder == session:
            await self._lead_again(value, asked)
        elif holder is None:
            await self._try_to_take(index, value, rank)
        else:
            await self._follow(index, value)

    async def _hold(self, asked: float) -> None:
        """The primary's round: renew the lease while the key is still this session's, else
        step down."""
        if await self.lock.holds():
            await self.local.renew(asked)
            await asyncio.sleep(min(0.5, self.local.lease_s / 3))
            return
        log.warning("lost the registry lock (%s): stepping down", self.lock.key)
        self.lock.forget()
        await self.local.lost()

    async def _clear_once(self) -> None:
        if self.cleared:
            return
        try:
            await self.lock.clear_predecessors()
        except ERRORS as exc:  # best effort: a predecessor's check, not passed by anyone
            # now, still ends its session within lock_ttl_s
            log.warning("consul: cannot end an earlier process's session: %s", exc)
        self.cleared = True

    async def _lead_again(self, value: tuple[str, str, int] | None, asked: float) -> None:
        """The key is still ours (a lost reply, a restart of the loop): lead again under the
        term the key names."""
        term = value[2] if value else self.local.term
        await self.local.lead(term, None, asked, "the registry lock is still this registry's")

    async def _try_to_take(self, index: int, value: tuple[str, str, int] | None,
                           rank: tuple[int, int]) -> None:
        """The key is free: take it under a new term, unless it is too early or another
        registry should."""
        if time.monotonic() < self.started + self.settings.lock_ttl_s:
            await asyncio.sleep(0.25)  # let the peers say how far they are first
            return
        if await self._defer(index, rank):
            return
        term = max(await self.local.stored_term(), value[2] if value else 0) + 1
        asked = time.time()
        if await self.lock.take(lock_value(self.registry_id, self.address, term)):
            await self.local.lead(term, value[1] if value else None, asked,
                                  "took the registry lock")
            return
        await asyncio.sleep(0.25)  # the lock-delay of a lost holder: try again soon

    async def _defer(self, index: int, rank: tuple[int, int]) -> bool:
        """Whether to leave the free lock alone this round: joining with no history copied
        yet, or a live peer holds a better one."""
        if self.settings.join and rank[0] == 0:
            if self.deferred_to != JOINING:
                log.info("not taking the lock: joining (REGISTRY_JOIN), this registry "
                         "has not copied a primary's database yet")
                self.deferred_to = JOINING
            await self.lock.wait(index)
            return True
        better = await self.lock.better(rank)
        if better is None:
            return False
        if better != self.deferred_to:
            log.info("not taking the lock: %s holds a newer or longer history", better)
            self.deferred_to = better
        await asyncio.sleep(0.25)
        return True

    async def _follow(self, index: int, value: tuple[str, str, int] | None) -> None:
        """Another registry holds the key: follow it until the key changes (at most a second:
        the candidate entry says how far this standby is)."""
        await self.local.follow(value[1] if value else None)
        await self.lock.wait(index)

    async def stop(self) -> None:
        """A clean stop: refuse writes first, then let the lock go (no lock-delay for the next
        primary), and take the check away."""
        with contextlib.suppress(*ERRORS):
            if self.local.primary:
                await self.local.step_down()
                await self.lock.release(lock_value(self.registry_id, self.address,
                                                   self.local.term))
            await self.lock.end()
        await self.lock.close()


def promotion_record(conn: Any, actor: str, registry_id: str, term: int,
                     previous: str | None) -> None:
    """The audit record of a new primary (in the caller's transaction): the chain says who
    accepted writes from which record on."""
    chain.append(conn, actor=actor, action=role.PROMOTE, payload={
        "registry_id": registry_id, "term": term, "previous": previous,
        "position": changes.position(conn)})
    role.promoted_term(conn)
