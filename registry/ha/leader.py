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


class Leadership:
    """The election loop. ``promote(term, previous)`` and ``demote(leader)`` are the server's:
    they change the role in the database (and what is registered, served, followed).

    Why one class: the lock, the lease and the candidacy are one state machine over one Consul
    session (the check that keeps it alive, the key it holds, the entry that says how far this
    registry is); split up, each part would need the others' session, term and timing."""

    def __init__(self, settings: RegistrySettings, registry_id: str, address: str,
                 db_run: Callable[..., Awaitable[Any]],
                 db: Callable[[], sqlite_utils.Database],
                 promote: Callable[[int, str | None], Awaitable[None]],
                 demote: Callable[[str | None], Awaitable[None]]) -> None:
        assert settings.consul_http_addr
        token = settings.consul_http_token
        self.consul = discovery.client(settings.consul_http_addr,
                                       token.get_secret_value() if token else None)
        self.settings, self.registry_id, self.address = settings, registry_id, address
        self.run_db, self.db = db_run, db
        self.promote, self.demote = promote, demote
        self.key = settings.lock_key
        self.candidates = f"{settings.lock_key.rsplit('/', 1)[0]}/candidates/"
        # this process's own: a predecessor's check or entry is never this one's (see above)
        incarnation = secrets.token_hex(4)
        self.candidate_key = f"{self.candidates}{registry_id}/{incarnation}"
        self.started = time.monotonic()
        self.deferred_to: str | None = None
        self.check_id = f"{registry_id}-lock-{incarnation}"
        self.session_name = f"tiered registry {registry_id}"
        self.cleared = False  # what predecessors left in Consul is ended (once, at start)
        self.session: str | None = None
        self.primary = False
        self.leader: str | None = None  # the address of the registry holding the lock
        self.term = 0
        self.lease_s = max(settings.lock_ttl_s - 1.0, 0.5)
        self.lock_delay = math.ceil(settings.lock_ttl_s)

    async def run(self) -> None:
        passing = asyncio.create_task(self._pass())
        try:
            while True:
                try:
                    await self._round()
                except ERRORS as exc:
                    # a Consul error is no reason to drop the session: it may still hold the
                    # lock, and a new session could never take it back (nobody would lead)
                    log.warning("consul: %s", exc)
                    if "invalid session" in str(exc).lower():
                        self.session = None
                    await asyncio.sleep(0.5)
        finally:
            passing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await passing

    async def _pass(self) -> None:
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

    async def _session(self) -> str:
        if self.session is None:
            self.session = await self.consul.session.create(
                name=self.session_name,
                checks=["serfHealth", self.check_id], lock_delay=self.lock_delay,
                behavior="release")
        return self.session

    async def _round(self) -> None:
        asked = time.time()
        if self.primary:
            _, entry = await self.consul.kv.get(self.key, consistency="consistent")
            if entry is not None and entry.get("Session") == self.session:
                await self.run_db(self._renew, asked + self.lease_s)
                await asyncio.sleep(min(0.5, self.lease_s / 3))
                return
            log.warning("lost the registry lock (%s): stepping down", self.key)
            self.primary, self.session = False, None
            await self.demote(None)
            return
        if not self.cleared:
            try:
                await self.clear_predecessors()
            except ERRORS as exc:  # best effort: a predecessor's check, not passed by anyone
                # now, still ends its session within lock_ttl_s
                log.warning("consul: cannot end an earlier process's session: %s", exc)
            self.cleared = True
        index, entry = await self.consul.kv.get(self.key, consistency="consistent")
        holder = entry.get("Session") if entry else None
        value = leader_value(entry.get("Value")) if entry else None
        session = await self._session()
        rank = await self.run_db(self._rank)
        await self.consul.kv.put(self.candidate_key, json.dumps(
            {"registry_id": self.registry_id, "history_term": rank[0], "position": rank[1]}),
            acquire=session)
        if holder is not None and holder == session:  # still ours (a lost reply, a restart
            # of the loop): lead again under the term the key names
            term = value[2] if value else self.term
            self.primary, self.term, self.leader = True, term, self.address
            await self.run_db(self._renew_as, term, asked + self.lease_s)
            log.info("the registry lock is still this registry's: primary for term %d", term)
            await self.promote(term, None)
            return
        if holder is None:
            if time.monotonic() < self.started + self.settings.lock_ttl_s:
                await asyncio.sleep(0.25)  # let the peers say how far they are first
                return
            if self.settings.join and rank[0] == 0:
                if self.deferred_to != JOINING:
                    log.info("not taking the lock: joining (REGISTRY_JOIN), this registry "
                             "has not copied a primary's database yet")
                    self.deferred_to = JOINING
                await self.consul.kv.get(self.key, index=index, wait="1s")
                return
            better = await self._better(rank)
            if better is not None:
                if better != self.deferred_to:
                    log.info("not taking the lock: %s holds a newer or longer history", better)
                    self.deferred_to = better
                await asyncio.sleep(0.25)
                return
            ours_term = await self.run_db(lambda: role.state(self.db().conn).term)
            term = max(ours_term, value[2] if value else 0) + 1
            asked = time.time()
            body = json.dumps({"registry_id": self.registry_id, "address": self.address,
                               "term": term})
            if await self.consul.kv.put(self.key, body, acquire=session):
                previous = value[1] if value else None
                self.primary, self.term, self.leader = True, term, self.address
                await self.run_db(self._renew_as, term, asked + self.lease_s)
                log.info("took the registry lock: primary for term %d", term)
                await self.promote(term, previous)
                return
            await asyncio.sleep(0.25)  # the lock-delay of a lost holder: try again soon
            return
        leader = value[1] if value else None
        if leader != self.leader:
            self.leader = leader
            log.info("the primary is %s", leader or "unreadable in the lock's value")
            await self.demote(leader)
        # until the key changes (a lost holder releases it), at most a second: the candidate
        # entry above says how far this standby is
        await self.consul.kv.get(self.key, index=index, wait="1s")

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

    def _rank(self) -> tuple[int, int]:
        """How recent and how long this registry's history is: (the term of its newest
        promotion, its newest change)."""
        conn = self.db().conn
        return role.state(conn).history_term, changes.position(conn)

    async def _better(self, rank: tuple[int, int]) -> str | None:
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

    def _renew(self, until: float) -> None:
        with transaction(self.db()) as conn:
            role.renew(conn, until)

    def _renew_as(self, term: int, until: float) -> None:
        """Become the primary in the database: role, term, lease."""
        with transaction(self.db()) as conn:
            role.set_role(conn, "primary", term=term, registry_id=self.registry_id,
                                 leader=self.address, lease_until=until)

    async def stop(self) -> None:
        """A clean stop: refuse writes first, then let the lock go (no lock-delay for the next
        primary), and take the check away."""
        with contextlib.suppress(*ERRORS):
            if self.primary:
                self.primary = False
                await self.run_db(self._step_down)
                if self.session is not None:
                    await self.consul.kv.put(self.key, json.dumps(
                        {"registry_id": self.registry_id, "address": self.address,
                         "term": self.term}), release=self.session)
            if self.session is not None:
                await self.consul.kv.delete(self.candidate_key)
                await self.consul.session.destroy(self.session)
            await self.consul.agent.service.deregister(self.check_id)
        await self.consul.close()

    def _step_down(self) -> None:
        with transaction(self.db()) as conn:
            role.set_role(conn, "standby", leader=None)


def promotion_record(conn: Any, actor: str, registry_id: str, term: int,
                     previous: str | None) -> None:
    """The audit record of a new primary (in the caller's transaction): the chain says who
    accepted writes from which record on."""
    chain.append(conn, actor=actor, action=role.PROMOTE, payload={
        "registry_id": registry_id, "term": term, "previous": previous,
        "position": changes.position(conn)})
    role.promoted_term(conn)
