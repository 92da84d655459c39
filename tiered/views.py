"""What ``tiered`` prints, as pure functions of data (and the terminal's width): no Consul,
registry or console here, so every view is unit-tested. A value is never cut short with
``…``: long cells fold onto the next line, and ``tiered status`` switches to one block per
node when its table does not fit the width."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from registry.cli.tables import table_or_blocks
from registry.settings import RegistrySettings
from serving.config.settings import REGION
from serving.fleet.discovery import SERVICES
from serving.protocol.visible import visible

STATUS_COLUMNS = ("service", "node", "address", "site", "region", "health", "model", "version",
                  "desired", "sync", "escalation", "p99")
SHOWN = 256  # characters of a catalog value shown at most (a node id is at most 63)
MISSING = "missing"  # the state of a model a node should run (or was asked about) but does
# not report: never published to it, still on its way, or taken off it


def registry_database(home: Path) -> Path:
    """The registry database of ``home``, named where the registry names it (its settings);
    built without reading REGISTRY_* variables, which are the registry's, not ours."""
    return RegistrySettings.model_construct(home=home).database


def status_rows(health: Mapping[str, Sequence[Mapping[str, Any]]],
                rollout: Mapping[tuple[str, str], Mapping[str, Any]],
                desired: Callable[[str, str, str], Mapping[str, int]] | None = None,
                only: Sequence[str] = ()) -> list[dict[str, Any]]:
    """One row per service instance and model (one row for an instance with none): Consul's
    ``/v1/health/service/<name>`` answers (by service name) joined with ``registry status``
    rows (by node id and model). An edge's or a center's models are those it reports and
    those the registry wants it to run (``desired(node id, tier, region)``: model ->
    version); one it should run but does not report is ``missing``. ``only``: these models,
    each on every edge and center (``missing`` where the node does not report it)."""
    rows = []
    for service, entries in health.items():
        for entry in entries:
            sid = entry["Service"]["ID"]
            reported = {m for n, m in rollout if n == sid}
            serving = service in (SERVICES["edge"], SERVICES["center"])
            wanted = dict(_wanted(desired, entry)) if serving else {}
            models: Sequence[str | None] = sorted(reported | set(wanted))
            if only:
                models = list(only) if serving else [m for m in only if m in reported]
            for model in models or [None]:
                sync = dict(rollout.get((sid, model), {})) if model is not None else {}
                if model is not None and not sync:
                    sync = {"version": None, "desired": wanted.get(model), "state": MISSING}
                rows.append(_status_row(service, entry, sync, model))
    return rows


def _wanted(desired: Callable[[str, str, str], Mapping[str, int]] | None,
            entry: Mapping[str, Any]) -> Mapping[str, int]:
    if desired is None:
        return {}
    meta = entry["Service"].get("Meta") or {}
    return desired(str(entry["Service"]["ID"]), str(meta.get("tier", "")),
                   str(meta.get("region", "")))


def _status_row(service: str, entry: Mapping[str, Any], sync: Mapping[str, Any],
                model: str | None) -> dict[str, Any]:
    checks = [shown(c["Status"]) for c in entry["Checks"] if c.get("ServiceID")]
    meta = entry["Service"].get("Meta") or {}
    return {"service": service, "node": shown(entry["Service"]["ID"]),
            "address": shown(f"{entry['Service']['Address']}:{entry['Service']['Port']}"),
            "site": site_of(entry), "region": shown(meta.get("region", "-")),
            "health": "passing" if checks and all(c == "passing" for c in checks)
            else ",".join(checks) or "-",
            "model": model, "version": sync.get("version"), "desired": sync.get("desired"),
            "state": sync.get("state"), "escalation_rate": sync.get("escalation_rate"),
            "p99_ms": sync.get("p99_ms")}


def shown(value: object) -> str:
    """A value from the Consul catalog as it may reach a terminal: anyone holding a role's
    token writes these, so control characters (a terminal's escape sequences) are shown
    escaped and the text is cut to ``SHOWN`` characters."""
    return visible(str(value), SHOWN)


def site_of(entry: Mapping[str, Any]) -> str:
    """The site of the Consul agent an instance is registered with (its node meta
    ``tiered_site``, set by ``tiered sites``); "-" when there is none, "?" when what the
    catalog holds is not a region-like name (anyone who reaches Consul writes node meta)."""
    node = entry.get("Node")
    meta = node.get("Meta") if isinstance(node, Mapping) else None
    site = meta.get("tiered_site") if isinstance(meta, Mapping) else None
    if site is None:
        return "-"
    return site if isinstance(site, str) and re.fullmatch(REGION, site) else "?"


def _cells(r: Mapping[str, Any]) -> list[Text]:
    colour = "green" if r["health"] == "passing" else "red"
    values = [r["service"], r["node"], r["address"], r["site"], r["region"], r["health"],
              r.get("model") or "-", str(r["version"] or "-"), str(r["desired"] or "-"),
              r["state"] or "-",
              "-" if r["escalation_rate"] is None else f"{r['escalation_rate']:.1%}",
              "-" if r["p99_ms"] is None else f"{r['p99_ms']:.1f} ms"]
    health = STATUS_COLUMNS.index("health")
    return [Text(str(v), style=colour if i == health else "") for i, v in enumerate(values)]


def status_view(rows: Sequence[Mapping[str, Any]], consul: str,
                width: int) -> RenderableType:
    """``tiered status``: a table when it fits ``width``, else one block per node, node first
    (every value in full either way)."""
    return table_or_blocks(f"Tiered services in Consul ({consul}) and their rollout",
                           STATUS_COLUMNS, [_cells(r) for r in rows], width,
                           lead=STATUS_COLUMNS.index("node"),
                           empty="no Tiered service is registered")


def pairs_view(title: str, pairs: Sequence[tuple[str, str]]) -> Table:
    """A two-column key/value table; long values (URLs, paths) fold, never cut."""
    table = Table(title=title, show_header=False)
    table.add_column(style="bold", overflow="fold")
    table.add_column(overflow="fold")
    for key, value in pairs:
        table.add_row(Text(key), Text(value))
    return table


def summary_view(seconds: float, pairs: Sequence[tuple[str, str]]) -> Table:
    """``tiered up``'s summary once every health check passes."""
    return pairs_view(f"tiered is up ({seconds:.0f} s): every health check passes", pairs)


def demo_view(d: Mapping[str, Any]) -> Table:
    """``tiered demo``'s result (the same data ``--json`` prints): rows answered, accuracy
    (overall and per release), the tier split, latency per request, which edge answered."""
    answered = d["sent"] - d["failed"]
    requests = d.get("requests", d["sent"])
    pairs = [("answered", f"{answered} ({d['failed']} failed {d['errors'] or ''})"),
             ("accuracy", f"{d['accuracy'] * 100:.2f}%")]
    pairs += [(f"release v{v}" + (f" ({r['release']})" if r.get("release") else ""),
               f"{r['rows']} answered, accuracy {r['accuracy'] * 100:.2f}%")
              for v, r in d.get("by_version", {}).items()]
    split = d.get("tier_split") or dict(sorted(d["rows_by_tier"].items()))
    pairs += [(f"answered by {tier}", f"{n} ({n / max(answered, 1) * 100:.1f}%)")
              for tier, n in split.items()]
    per = f", {d['batch']} rows each" if d.get("batch", 1) > 1 else ""
    pairs.append(("latency", f"p50 {d['p50_ms']:.1f} ms, p99 {d['p99_ms']:.1f} ms per request "
                             f"({requests} requests{per}, "
                             f"{requests / max(d['seconds'], 1e-9):.0f} req/s)"))
    pairs += [(f"edge {node}", str(n)) for node, n in sorted(d["by_node"].items())]
    what = d.get("what", "reviews")
    return pairs_view(f"{d['sent']} {what} of {d.get('model', 'the demo')} through {d['url']} "
                      f"in {d['seconds']:.1f} s", pairs)
