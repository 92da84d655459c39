"""The report as markdown: the headline figures, a table per tier and per release, the edge's
rows, the least available nodes and the plot."""

from __future__ import annotations

from datetime import UTC, datetime

from tiered.report.figures import Report, Requests, Rows, Tier

NONE = "—"


def percent(share: float | None, digits: int = 3) -> str:
    return NONE if share is None else f"{share * 100:.{digits}f}%"


def millis(value: float | None) -> str:
    """187 ms, 42.5 ms, 3.25 ms: three significant figures, never an exponent."""
    if value is None:
        return NONE
    if round(value, 1) >= 100:
        return f"{value:.0f} ms"
    return f"{value:.1f} ms" if round(value, 2) >= 10 else f"{value:.2f} ms"


def count(value: float | None) -> str:
    return NONE if value is None else f"{round(value):,}"


def when(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M UTC")


def span(seconds: float) -> str:
    if seconds >= 86400:
        return f"{seconds / 86400:.1f} days"
    return f"{seconds / 3600:.1f} hours" if seconds >= 3600 else f"{seconds / 60:.0f} minutes"


def table(head: list[str], rows: list[list[str]]) -> list[str]:
    right = ["---:" if i else "---" for i in range(len(head))]
    return ["| " + " | ".join(r) + " |" for r in [head, right, *rows]]


def headline(r: Report) -> list[str]:
    edge = next(t for t in r.tiers if t.name == "edge")
    asked = edge.requests or Requests(0, 0, None, None, None, None)
    up = ", ".join(f"{t.name} {percent(t.availability)}" for t in r.tiers if t.nodes)
    return [f"- **Availability {percent(asked.availability)}**: requests the edges answered, "
            f"of {count(asked.requests)}",
            f"- **Latency at the edges**: p50 {millis(asked.p50_ms)}, "
            f"p99 {millis(asked.p99_ms)}, mean {millis(asked.mean_ms)}",
            f"- **Edge share {percent(r.rows.edge_share, 1)}**: {count(r.rows.edge)} of "
            f"{count(r.rows.total)} rows answered at the edge",
            f"- **Scrapes up**: {up or NONE}"]


def tier_row(t: Tier) -> list[str]:
    q = t.requests
    return [t.name, str(t.nodes), percent(t.availability),
            count(q.requests) if q else NONE, percent(q.availability) if q else NONE,
            millis(q.p50_ms) if q else NONE, millis(q.p99_ms) if q else NONE,
            millis(q.mean_ms) if q else NONE, count(t.rows)]


def rows_cells(rows: Rows) -> list[str]:
    return [count(rows.total), percent(rows.edge_share, 1), count(rows.escalated),
            count(rows.degraded), count(rows.shed)]


def render(r: Report, plot: str | None) -> str:
    """The markdown; ``plot``: the PNG's path relative to the markdown file, if one was drawn."""
    w = r.window
    clipped = w.first_sample - w.start > w.covered * 0.001
    lines = [f"# Tiered report: the last {w.since} to {when(w.end)}", "",
             f"From Prometheus at {r.prometheus}: {when(w.start)} to {when(w.end)}; "
             + (f"its data starts at {when(w.first_sample)}, so the report covers "
                f"{span(w.covered)} of the {w.since}." if clipped else
                f"data over the whole window (first scrape {when(w.first_sample)})."),
             "", *headline(r), "", "## Tiers", "",
             *table(["tier", "nodes", "scrapes up", "requests", "answered", "p50", "p99",
                     "mean", "rows"], [tier_row(t) for t in r.tiers]),
             "", "Center requests include the edges' escalations; a center's rows are rows "
                 "it inferred, an edge's the rows it answered (any tier).",
             "", "## Releases (at the edges)", "",
             *table(["model", "version", "requests", "answered", "p50", "p99", "rows",
                     "edge share", "escalated", "degraded", "shed"],
                    [[x.model, x.version, count(x.requests.requests),
                      percent(x.requests.availability), millis(x.requests.p50_ms),
                      millis(x.requests.p99_ms), *rows_cells(x.rows)] for x in r.releases]),
             "", "## Center rows avoided", "",
             f"Had every row gone to the center, it would have computed {count(r.rows.total)}. "
             f"The edges answered {count(r.rows.edge)} ({percent(r.rows.edge_share, 1)}) "
             f"themselves, {count(r.rows.audited)} of which the live audit also sent to the "
             f"center: **{count(r.rows.center_avoided)} center rows avoided**. The center "
             f"answered {count(r.rows.escalated)} escalated rows; the edges answered "
             f"{count(r.rows.degraded)} degraded (no center reachable) and {count(r.rows.shed)} "
             f"shed (over the escalation budget)."]
    if r.nodes:
        lines += ["", "## Least available nodes", "",
                  *table(["node", "tier", "scrapes up", "down (estimated)"],
                         [[n.node, n.tier, percent(n.availability), span(n.down_seconds)]
                          for n in r.nodes])]
    if plot:
        lines += ["", f"![requests/s, p99 and edge share over the window]({plot})"]
    return "\n".join(lines) + "\n"
