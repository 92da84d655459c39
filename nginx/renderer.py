"""The renderer: keeps each nginx it runs in step with the roles of the fleet that nginx
routes to. The entry nginx follows the edges; the side nginx (when there is one) the centers
and the registries. A change of a role renders only the nginx that follows it: resolve the
names, over TLS keep the edges whose address proves their node (``guard``), render, check
with ``nginx -t``, swap ``upstreams.conf`` and reload, only when that file's text changed."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field

from serving.fleet import discovery
from serving.fleet.discovery import Instance

from . import side as side_nginx
from .fleet import REASONS, ROLES, Dropped, Fleet, resolved
from .guard import EdgeGuard
from .metrics import CHECK_FAILURES, DROPPED, DROPS
from .process import Nginx, write_atomically
from .upstreams import edge_tls_problems, renderable, upstreams

log = logging.getLogger("nginx.render")
MAX_CHECKS = 64  # nginx -t runs spent looking for the entries a failing candidate owes to


@dataclass
class Part:
    """One nginx, the roles of the fleet it follows and how its upstreams.conf is written."""
    nginx: Nginx
    roles: tuple[str, ...]
    render: Callable[[Fleet], str]
    rendering: asyncio.Lock = field(default_factory=asyncio.Lock)  # one render at a time


class Renderer:
    """The fleet as the watches last reported it, the nginx processes rendered from it, and
    the entries the renders left out (in the log and the metrics)."""

    def __init__(self, entry: Nginx, side: Nginx | None = None,
                 side_roles: tuple[str, ...] = ("centers", "registries"),
                 region: str | None = None, fallback: tuple[str, ...] = (),
                 edge_tls: bool = False, guard: EdgeGuard | None = None) -> None:
        self.entry, self.side = entry, side
        self.parts = [Part(entry, ("edges",), upstreams)]
        if side is not None:
            self.parts.append(Part(side, side_roles, side_nginx.upstreams))
        self.nginxes = [p.nginx for p in self.parts]  # the entry first
        self.fleet = Fleet(region=region, fallback=fallback, edge_tls=edge_tls)
        self.guard = guard  # over TLS: only edges whose address proved their node
        self.dropped: dict[tuple[str, str], Dropped] = {}
        self.known: dict[str, tuple[str, float]] = {}  # host name -> last address, when

    @property
    def roles(self) -> tuple[str, ...]:
        """The roles some nginx follows: the watches to run."""
        return tuple(r for r in ROLES if any(r in p.roles for p in self.parts))

    def write_empty(self) -> None:
        """Each nginx's upstreams for an empty fleet (before the first watch answers)."""
        for part in self.parts:
            write_atomically(part.nginx.upstreams_conf, part.render(self.fleet))

    def start(self) -> None:
        """Start every nginx, the side first (the entry passes to it), once every config
        passes nginx -t; RuntimeError otherwise, and none left running."""
        for nginx in self.nginxes:
            problem = nginx.test_config()
            if problem is not None:
                raise RuntimeError(f"not starting nginx, the {nginx.name}'s config fails "
                                   f"nginx -t: {problem}")
        try:
            for nginx in reversed(self.nginxes):
                nginx.start()
        except (OSError, RuntimeError):
            self.stop()
            raise

    def stop(self) -> None:
        """The entry first: requests it still finishes may need the side."""
        for nginx in self.nginxes:
            nginx.stop()

    def follow(self, role: str) -> discovery.OnChange:
        async def changed(instances: list[Instance]) -> None:
            setattr(self.fleet, role, instances)
            # the watch goes on after a failed render (an exception here would end it, and
            # nginx would keep this role's list for good)
            await self.render_or_log(f"a change of {role}", (role,))

        return changed

    async def render_or_log(self, after: str, roles: tuple[str, ...] = ROLES) -> None:
        """``render``, a failure logged: the next change or re-resolve renders again."""
        try:
            await self.render(roles)
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            log.warning("rendering after %s failed: %s", after, exc)

    async def render(self, roles: tuple[str, ...] = ROLES) -> None:
        """Render every nginx that follows one of ``roles``, and only those."""
        for part in self.parts:
            if set(part.roles) & set(roles):
                await self._render(part)

    async def _render(self, part: Part) -> None:
        async with part.rendering:
            fleet, unresolved = await resolved(self.fleet, self.known, part.roles)
            fleet, tls = await screened(fleet, part.roles, self.guard)
            text, failing = await asyncio.to_thread(checked, part.nginx, fleet, part.render,
                                                    part.roles)
            self._note_dropped([*unresolved, *tls, *failing], part.roles)
            if text is None or not write_atomically(part.nginx.upstreams_conf, text):
                return
            log.info("%s upstreams: %s", part.nginx.name, ", ".join(
                f"{role} {[i.target for i in getattr(fleet, role)]}" for role in part.roles))
            await asyncio.to_thread(part.nginx.reload)

    def _note_dropped(self, dropped: list[Dropped], roles: tuple[str, ...]) -> None:
        """What a render of ``roles`` left out, in the log (as it changes) and the metrics."""
        now = {(d.role, d.service_id): d for d in dropped}
        before = {key: d for key, d in self.dropped.items() if key[0] in roles}
        for key, d in now.items():
            if key not in before:
                DROPS.labels(d.role, d.reason).inc()
                log.warning("not rendering %s %r (%s): %s", d.role, d.service_id[:80],
                            d.reason, d.detail)
        for key in before.keys() - now.keys():
            log.info("rendering %s %r again", *key)
        self.dropped = {k: d for k, d in self.dropped.items() if k[0] not in roles} | now
        for role in roles:
            for reason in REASONS:
                DROPPED.labels(role, reason).set(
                    sum(1 for d in dropped if d.role == role and d.reason == reason))


async def screened(fleet: Fleet, roles: tuple[str, ...], guard: EdgeGuard | None,
                   ) -> tuple[Fleet, list[Dropped]]:
    """Over TLS, the edges an nginx following ``roles`` may be given (with a ``guard``: the
    edges whose address proved their node, ``nginx/guard.py``), and the entries left out."""
    if not fleet.edge_tls or "edges" not in roles:
        return fleet, []
    if guard is None:
        return fleet, list(edge_tls_problems(renderable(fleet.edges)).values())
    edges, dropped = await guard.screen(renderable(fleet.edges))
    return dataclasses.replace(fleet, edges=edges), dropped


def checked(nginx: Nginx, fleet: Fleet, render: Callable[[Fleet], str],
            roles: tuple[str, ...] = ROLES) -> tuple[str | None, list[Dropped]]:
    """The upstreams text for ``fleet`` that passes ``nginx -t`` with ``nginx``'s nginx.conf,
    and the entries (of ``roles``) left out to get there: none when the whole fleet passes;
    else, starting from no entries at all, each entry is put back only if nginx -t still
    passes with it (at most MAX_CHECKS runs). None when not even the empty fleet passes: the
    working file stays, nginx keeps its upstreams."""
    text = render(fleet)
    if nginx.upstreams_conf.is_file() and nginx.upstreams_conf.read_text() == text:
        return text, []  # what nginx already runs with
    problem = nginx.nginx_check(text)
    if problem is None:
        return text, []
    CHECK_FAILURES.labels(nginx.name).inc()
    log.error("the rendered %s upstreams fail nginx -t (%s); looking for the entries to "
              "leave out", nginx.name, problem[-300:])
    every = [(role, i.service_id) for role in roles for i in getattr(fleet, role)]
    left_out = set(every)  # an entry goes back in only if nginx -t still passes with it
    if nginx.nginx_check(render(fleet.without(left_out))) is None:
        for key in every[:MAX_CHECKS - 2]:
            trial = render(fleet.without(left_out - {key}))
            if nginx.nginx_check(trial) is None:
                left_out.discard(key)
        return render(fleet.without(left_out)), [
            Dropped(role, sid, "fails_nginx_check", "nginx -t fails with it (or it was "
                    f"past the {MAX_CHECKS} checks a render may run)")
            for role, sid in every if (role, sid) in left_out]
    log.error("no %s upstreams.conf that passes nginx -t was found; keeping the working one",
              nginx.name)
    return None, []
