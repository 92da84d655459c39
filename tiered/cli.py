"""The ``tiered`` command (a placeholder until its issue lands)."""

from __future__ import annotations

import click


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Not yet implemented: see the README's roadmap."""
    click.echo("tiered: not yet implemented (see the README's roadmap)", err=True)
    raise SystemExit(2)


def main() -> None:
    cli(prog_name="tiered")
