"""What a benchmark printed, again as markdown: rich tables become markdown tables, lines become
paragraphs (markup stripped). ``make bench`` gathers the fragments into docs/benchmarks.md."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

Item = Table | str


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


class Shown:
    """Print each item and keep it, to write the same as markdown at the end."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.items: list[Item] = []

    def __call__(self, item: Item) -> None:
        self.console.print(item)
        self.items.append(item)

    def write(self, path: Path, heading: str) -> None:
        parts = [f"## {heading}"]
        parts += [table_markdown(i) if isinstance(i, Table) else plain(i) for i in self.items]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n\n".join(parts) + "\n")
