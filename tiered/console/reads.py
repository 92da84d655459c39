"""What the fleet console reads from the registry's database, opened read-only: node counts by
state and version per region, each model's newest wave rollout, per-release figures from the
nodes' last quality reports, and a page of nodes. Every figure is an aggregate in SQL, so a page
costs the same at 10,000 nodes as at 10; only ``page`` returns nodes, ``PAGE`` at most."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import sqlite_utils

from registry.cli.tables import wave_states
from registry.releases import waves
from registry.releases.reads import CatalogReads

PAGE = 50  # nodes on one page of the node list
STATES = ("connected", "disconnected", "failed", "refused")
# one node-model pair's state as the console counts it: down first (whatever it last said),
# then an install it failed or refused (``registry.fleet.nodes.ack`` stores a refusal as
# FAILED with "version N: refused: why"), else up
BUCKET = """CASE WHEN n.connected = 0 THEN 'disconnected'
    WHEN m.state = 'FAILED' AND m.reason LIKE 'version %: refused:%' THEN 'refused'
    WHEN m.state = 'FAILED' THEN 'failed' ELSE 'connected' END"""
FROM = "FROM nodes n LEFT JOIN node_models m ON m.node_id = n.node_id"
REPORTED = "CAST(COALESCE(json_extract(m.report, '$.version'), m.version) AS INTEGER)"


FIELDS = ("escalation_rate", "shed_rate", "degraded_rate", "budget_rows_s", "capacity_rows_s",
          "estimated_accuracy", "audit_agreement", "drift", "confidence_drift", "input_shift",
          "low_confidence_share")


def _weighted(field: str) -> str:
    """A report field averaged over the reporting nodes, weighted by their window's rows."""
    return (f"SUM({field} * rows) / NULLIF(SUM(CASE WHEN {field} IS NOT NULL THEN rows END), "
            f"0) AS {field}")


# each report's fields are extracted once (json_extract parses the report at each call)
RELEASES = f"""WITH r AS (SELECT m.model, {REPORTED} AS version, n.tier, m.report_at,
    COALESCE(json_extract(m.report, '$.rows'), json_extract(m.report, '$.requests'), 0) AS rows,
    {", ".join(f"json_extract(m.report, '$.{f}') AS {f}" for f in FIELDS)}
    FROM node_models m JOIN nodes n ON n.node_id = m.node_id WHERE m.report IS NOT NULL)
    SELECT model, version, tier, COUNT(*) AS nodes, SUM(rows) AS rows,
    {", ".join(_weighted(f) for f in ("escalation_rate", "shed_rate", "degraded_rate",
                                      "estimated_accuracy", "audit_agreement",
                                      "low_confidence_share"))},
    SUM(budget_rows_s) AS budget_rows_s, SUM(capacity_rows_s) AS capacity_rows_s,
    SUM(COALESCE(drift, 0) = 1 OR COALESCE(confidence_drift, 0) = 1) AS drifting,
    MAX(input_shift) AS input_shift_max, MAX(report_at) AS last_report
    FROM r GROUP BY 1, 2, 3 ORDER BY 1, 2 DESC, 3"""


@dataclass(frozen=True)
class Filter:
    """Which nodes a node-list page shows (each unset: any)."""

    model: str | None = None
    site: str | None = None
    tier: str | None = None
    version: int | None = None
    state: str | None = None

    def where(self) -> tuple[str, list[Any]]:
        clauses, args = [], []
        for column, value in (("COALESCE(m.model, '')", self.model), ("n.region", self.site),
                              ("n.tier", self.tier), ("m.version", self.version),
                              (BUCKET, self.state)):
            if value is not None:
                clauses.append(f"{column} = ?")
                args.append(value)
        return (" WHERE " + " AND ".join(clauses)) if clauses else "", args


@contextmanager
def opened(database: Path) -> Iterator[sqlite3.Connection]:
    """The registry database, read-only (``mode=ro``: this process can write nothing);
    FileNotFoundError when there is none yet."""
    if not database.is_file():
        raise FileNotFoundError(f"no registry database at {database}")
    uri = f"file:{quote(str(database.resolve()))}?mode=ro"
    with closing(sqlite3.connect(uri, uri=True, timeout=5)) as conn:
        conn.row_factory = sqlite3.Row
        conn.execute("BEGIN")  # one snapshot for the whole page
        try:
            yield conn
        finally:
            conn.execute("COMMIT")


def node_counts(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    """(model, region, tier, version) with a count per state: the overview's node table."""
    rows = conn.execute(f"SELECT COALESCE(m.model, '') AS model, n.region AS site, n.tier, "
                        f"m.version, {BUCKET} AS state, COUNT(*) AS count {FROM} "
                        f"GROUP BY 1, 2, 3, 4, 5 ORDER BY 1, 2, 3, 4 DESC").fetchall()
    table: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in rows:
        key = (r["model"], r["site"], r["tier"], r["version"])
        row = table.setdefault(key, {"model": r["model"], "site": r["site"], "tier": r["tier"],
                                     "version": r["version"], "total": 0,
                                     **{s: 0 for s in STATES}})
        row[r["state"]] += r["count"]
        row["total"] += r["count"]
    return list(table.values())


def totals(conn: sqlite3.Connection) -> dict[str, int]:
    """Nodes (not node-model pairs) by connection: how big the fleet is."""
    total, up = conn.execute("SELECT COUNT(*), COALESCE(SUM(connected), 0) FROM nodes").fetchone()
    return {"nodes": total, "connected": up, "disconnected": total - up}


def rollouts(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    """Each model's newest wave rollout (``waves.summary``) with its waves as rows."""
    shown = []
    for model in CatalogReads(sqlite_utils.Database(conn)).models():
        r = waves.summary(conn, model["name"])
        if r is None:
            continue
        rows = []
        for i, (share, state) in enumerate(zip(r["waves"], wave_states(r), strict=True)):
            f = r["figures"].get(f"wave {i + 1}", {})
            nodes = r["nodes"] if i == r["wave"] - 1 else {}
            rows.append({"wave": i + 1, "share": share, "state": state,
                         "nodes": f.get("nodes", nodes.get("wave")),
                         "installed": f.get("installed", nodes.get("installed")),
                         "failed": f.get("failed", nodes.get("failed")),
                         "new": f.get("new", {}), "previous": f.get("previous", {})})
        shown.append(r | {"rows": rows, "production": model["production"]})
    return shown


def releases(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    """Per model, version and tier: the nodes' last reports added up (escalation, budget and
    shed, estimated accuracy, drift)."""
    return [dict(r) for r in conn.execute(RELEASES).fetchall()]


def page(conn: sqlite3.Connection, chosen: Filter, number: int) -> tuple[list[dict[str, Any]],
                                                                         int]:
    """Page ``number`` (from 1) of the chosen nodes, ``PAGE`` a page, and how many there are."""
    where, args = chosen.where()
    total = conn.execute(f"SELECT COUNT(*) {FROM}{where}", args).fetchone()[0]
    rows = conn.execute(
        f"SELECT n.node_id AS node, n.region AS site, n.tier, m.model, m.version, {BUCKET} AS "
        f"state, m.reason, n.last_seen, json_extract(m.report, '$.escalation_rate') AS "
        f"escalation_rate, json_extract(m.report, '$.p99_ms') AS p99_ms {FROM}{where} "
        f"ORDER BY n.node_id, m.model LIMIT ? OFFSET ?",
        [*args, PAGE, (number - 1) * PAGE]).fetchall()
    return [dict(r) for r in rows], total

