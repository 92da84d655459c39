"""The ``center`` command."""

from __future__ import annotations

from center.service import CenterService
from center.settings import CenterSettings
from serving.cli import tier_command

cli = tier_command("center", CenterSettings, CenterService)


def main() -> None:
    cli(prog_name="center")
