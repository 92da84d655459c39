"""The ``edge`` command."""

from __future__ import annotations

from edge.pipeline import EdgeService
from edge.settings import EdgeSettings
from serving.cli import tier_command

cli = tier_command("edge", EdgeSettings, EdgeService)


def main() -> None:
    cli(prog_name="edge")
