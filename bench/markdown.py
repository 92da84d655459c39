"""What a benchmark printed, again as markdown: rich tables become markdown tables, lines become
paragraphs (markup stripped). ``make bench`` gathers the fragments into docs/benchmarks.md."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from harness.markdown import plain, table_markdown

Item = Table | str


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
