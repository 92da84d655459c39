"""Rich tables as markdown tables (markup stripped): what a test prints of a run, and the
tables a benchmark writes into its fragment of docs/benchmarks.md."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text


def plain(cell: object) -> str:
    text = cell.plain if isinstance(cell, Text) else Text.from_markup(str(cell)).plain
    return text.replace("|", "\\|").replace("\n", " ").strip()


def table_markdown(table: Table) -> str:
    headers = [plain(c.header) or " " for c in table.columns]
    columns = [list(c.cells) for c in table.columns]
    rows = [[plain(col[i]) if i < len(col) else "" for col in columns]
            for i in range(max((len(c) for c in columns), default=0))]
    title = f"**{plain(table.title)}**\n\n" if table.title else ""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    caption = f"\n\n{plain(table.caption)}" if table.caption else ""
    return title + "\n".join(lines) + caption
