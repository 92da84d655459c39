"""The fleet console's Litestar app: server-rendered HTML (Jinja2, every value escaped), read
from the registry's database opened read-only at each request and from Alertmanager or
Prometheus. Routes under ``/console/`` (nginx passes that prefix on): the overview, the node
list one page at a time (``/console/nodes``, reached from the overview's counts) and
``/console/healthz``. ``guard.Door`` wraps it: read-only and never anonymous."""

from __future__ import annotations

import math
import sqlite3
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlencode

import anyio
import httpx
import jinja2
from litestar import HttpMethod, Litestar, MediaType, Request, Response, route
from litestar.exceptions import HTTPException
from litestar.params import Parameter

from tiered.console import alerts, reads
from tiered.console.guard import HEALTH, Door

GET = [HttpMethod.GET, HttpMethod.HEAD]


@dataclass(frozen=True)
class Console:
    """What the console shows and where it reads it."""

    database: Path
    prometheus: str | None = None
    alertmanager: str | None = None
    consul_ui: str | None = None


def templates() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("tiered.console", "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True)
    env.filters["figure"] = _figure
    env.filters["share"] = lambda v: "-" if v is None else f"{100 * v:.3g}%"
    env.globals["nodes_url"] = nodes_url
    return env


def _figure(value: object) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def nodes_url(**chosen: Any) -> str:
    """The node list's address for these filters (unset ones left out)."""
    given = {k: v for k, v in chosen.items() if v is not None and v != ""}
    return "/console/nodes" + (f"?{urlencode(given)}" if given else "")


def build(console: Console, secret: str) -> Door:
    """The app, behind its door."""
    env = templates()

    @asynccontextmanager
    async def client(app: Litestar) -> AsyncIterator[None]:
        async with httpx.AsyncClient() as http:
            app.state.http = http
            yield

    def render(name: str, **values: Any) -> Response[str]:
        html = env.get_template(name).render(console=console, **values)
        return Response(html, media_type=MediaType.HTML)

    @route("/console", http_method=GET)
    async def overview(request: Request[Any, Any, Any]) -> Response[str]:
        got: dict[str, Any] = {}

        async def read_alerts() -> None:  # meanwhile, the database in a thread
            got["firing"] = await alerts.firing(request.app.state.http, console.alertmanager,
                                                console.prometheus)

        async with anyio.create_task_group() as group:
            group.start_soon(read_alerts)
            got["fleet"] = await anyio.to_thread.run_sync(_fleet, console.database)
        return render("overview.html", at=_now(), **got)

    @route("/console/nodes", http_method=GET)
    async def nodes(model: str | None = None, site: str | None = None,
                    tier: str | None = None, version: int | None = None,
                    node_state: Annotated[str | None, Parameter(query="state")] = None,
                    page: int = 1) -> Response[str]:
        if node_state is not None and node_state not in reads.STATES:
            raise HTTPException(status_code=400, detail=f"state is one of {reads.STATES}")
        chosen = reads.Filter(model, site, tier, version, node_state)
        listed = await anyio.to_thread.run_sync(_listed, console.database, chosen,
                                                max(1, page))
        return render("nodes.html", chosen=chosen, at=_now(), **listed)

    @route(HEALTH, http_method=GET)
    async def health() -> Response[str]:
        return Response('{"live": true}', media_type=MediaType.JSON)

    app = Litestar([overview, nodes, health], lifespan=[client], openapi_config=None)
    return Door(app, secret)


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S %Z")


def _fleet(database: Path) -> dict[str, Any]:
    try:
        with reads.opened(database) as conn:
            return {"totals": reads.totals(conn), "counts": reads.node_counts(conn),
                    "rollouts": reads.rollouts(conn), "releases": reads.releases(conn),
                    "error": None}
    except (FileNotFoundError, sqlite3.Error) as exc:
        return {"totals": {}, "counts": [], "rollouts": [], "releases": [],
                "error": f"the registry database cannot be read: {exc}"}


def _listed(database: Path, chosen: reads.Filter, number: int) -> dict[str, Any]:
    try:
        with reads.opened(database) as conn:
            rows, total = reads.page(conn, chosen, number)
            pages = max(1, math.ceil(total / reads.PAGE))
            if number > pages:  # past the end: the last page
                number = pages
                rows, total = reads.page(conn, chosen, number)
    except (FileNotFoundError, sqlite3.Error) as exc:
        return {"rows": [], "total": 0, "number": 1, "pages": 1, "links": [],
                "error": f"the registry database cannot be read: {exc}"}
    return {"rows": rows, "total": total, "number": number, "pages": pages,
            "links": _links(number, pages), "error": None}


def _links(number: int, pages: int) -> list[int | None]:
    """The page numbers linked: first, last and two either side of this one (None: a gap)."""
    wanted = sorted({1, pages, *range(max(1, number - 2), min(pages, number + 2) + 1)})
    shown: list[int | None] = []
    for n in wanted:
        if shown and n - (shown[-1] or 0) > 1:
            shown.append(None)
        shown.append(n)
    return shown
