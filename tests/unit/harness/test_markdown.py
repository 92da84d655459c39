from __future__ import annotations

from rich.table import Table

from harness.markdown import table_markdown


def test_a_rich_table_becomes_a_markdown_table_without_markup() -> None:
    table = Table(title="[bold]Edge[/] runs")
    for column in ("server", "p99 ms"):
        table.add_column(column)
    table.add_row("[green]tiered[/]", "14.7")
    table.add_row("a|b", "[red]31.9[/]")
    assert table_markdown(table) == ("**Edge runs**\n\n| server | p99 ms |\n|---|---|\n"
                                     "| tiered | 14.7 |\n| a\\|b | 31.9 |")
