"""The fleet as the renderer sees it: the edges, centers and registries Consul lists, the
entries a render left out and why, and their host names resolved by the renderer itself
(nginx is only ever given IP literals)."""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import socket
import time
from dataclasses import dataclass, field

from serving.fleet import discovery
from serving.fleet.discovery import Instance

RESOLVE_TIMEOUT_S = 1.0  # a host name in the catalog: resolved by the renderer, or dropped
KEEP_RESOLVED_S = 30.0  # a name that fails to resolve keeps its last answer this long
REASONS = ("unresolvable", "fails_nginx_check", "duplicate_address", "no_tls_name",
           "unverified", "wrong_identity")
ROLES = ("edges", "centers", "registries")
SERVICE = {"edges": "edge", "centers": "center", "registries": "registry"}  # discovery's names


@dataclass
class Fleet:
    edges: list[Instance] = field(default_factory=list)
    centers: list[Instance] = field(default_factory=list)
    registries: list[Instance] = field(default_factory=list)
    region: str | None = None  # the site this nginx is the entry of: its edges by default
    fallback: tuple[str, ...] = ()  # other regions, nearest first (then the rest, by name)
    edge_tls: bool = False  # nginx reaches edges over TLS, checking each node's own name

    def names_hosts(self, roles: tuple[str, ...] = ROLES) -> bool:
        """Some entry of ``roles`` has a host name (resolved by the renderer), not an IP."""
        return any(not is_ip(i.address) for role in roles for i in getattr(self, role))

    def without(self, gone: set[tuple[str, str]]) -> Fleet:
        """This fleet less the (role, service id) pairs in ``gone``."""
        def kept(role: str) -> list[Instance]:
            return [i for i in getattr(self, role) if (role, i.service_id) not in gone]

        return dataclasses.replace(self, edges=kept("edges"), centers=kept("centers"),
                                   registries=kept("registries"))


@dataclass(frozen=True)
class Dropped:
    role: str
    service_id: str
    reason: str  # one of REASONS
    detail: str


async def resolved(fleet: Fleet, known: dict[str, tuple[str, float]] | None = None,
                   roles: tuple[str, ...] = ROLES) -> tuple[Fleet, list[Dropped]]:
    """``fleet`` with every host name of ``roles`` replaced by the first address it resolves
    to (off the event loop, each within RESOLVE_TIMEOUT_S), and the entries whose name did not
    resolve (left out; the other roles are left as they are). nginx is only ever given IP
    literals: a name it cannot resolve would fail ``nginx -t`` and freeze every later reload.
    ``known``: each name's last answer and when (updated here); a name that fails to resolve
    within KEEP_RESOLVED_S of its last answer keeps that address (a resolver too slow for a
    moment on a busy host must not take a passing edge out of every pool; a stale address
    only costs nginx's next try). The lists are read once, before the first await: a watch
    may put new ones in while names resolve."""
    fleet = dataclasses.replace(fleet)  # the lists as they are now (a watch replaces, never edits)
    names = {i.address for role in roles for i in getattr(fleet, role) if not is_ip(i.address)}
    answers = await asyncio.gather(*(_resolve(n) for n in names))
    found = _remembered(dict(zip(names, answers, strict=True)), known)
    dropped: list[Dropped] = []
    fields = {role: getattr(fleet, role) for role in ROLES}
    for role in roles:
        kept = []
        for i in getattr(fleet, role):
            if is_ip(i.address):
                kept.append(i)
            elif isinstance(found[i.address], str):
                kept.append(dataclasses.replace(i, address=str(found[i.address])))
            else:
                dropped.append(Dropped(role, i.service_id, "unresolvable",
                                       f"{i.address[:80]!r}: {found[i.address]}"))
        fields[role] = kept
    return dataclasses.replace(fleet, edges=fields["edges"], centers=fields["centers"],
                               registries=fields["registries"]), dropped


def _remembered(found: dict[str, str | Exception], known: dict[str, tuple[str, float]] | None,
                ) -> dict[str, str | Exception]:
    """``found`` with a failed name's recent answer put back from ``known`` (updated here)."""
    now, known = time.monotonic(), {} if known is None else known  # {}: no memory kept
    for name, answer in found.items():
        if isinstance(answer, str):
            known[name] = (answer, now)
        elif name in known and now - known[name][1] < KEEP_RESOLVED_S:
            found[name] = known[name][0]
    return found


def is_ip(address: str) -> bool:
    try:
        ipaddress.ip_address(address)
    except ValueError:
        return False
    return True


async def _resolve(name: str) -> str | Exception:
    """The first address ``name`` resolves to, or why not (an exception, returned)."""
    try:
        discovery.checked_address(name)
        answers = await asyncio.wait_for(asyncio.get_running_loop().getaddrinfo(
            name, None, type=socket.SOCK_STREAM), RESOLVE_TIMEOUT_S)
        return str(ipaddress.ip_address(answers[0][4][0]))
    except TimeoutError:
        return TimeoutError(f"no answer within {RESOLVE_TIMEOUT_S} s")
    except (OSError, ValueError, IndexError, discovery.InvalidInstance) as exc:
        return exc
