"""The ``registry`` command: the group, its global flags, and the commands of each module
(``init_commands``, ``release_commands``, ``rollout_commands``, ``retire_commands``,
``fleet_commands``, ``key_commands``, ``audit_commands``, ``serve_commands``) registered on it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from pydantic import ValidationError

from registry.cli import (
    audit_commands,
    fleet_commands,
    init_commands,
    key_commands,
    release_commands,
    retire_commands,
    rollout_commands,
    serve_commands,
)
from registry.cli.context import Context, pass_ctx, run
from registry.cli.home import locate
from registry.settings import RegistrySettings
from serving.config.flags import options as settings_options


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@settings_options(RegistrySettings, ("home", "actor", "signing_key"))
@click.pass_context
def cli(ctx: click.Context, home: Path | None, actor: str | None,
        signing_key: Path | None) -> None:
    """Tiered model registry: versioned releases, blob store, hash-chained audit log."""
    flags: dict[str, Any] = {"home": home, "actor": actor, "signing_key": signing_key}
    overrides = {key: value for key, value in flags.items() if value is not None}
    try:
        settings = RegistrySettings(**overrides)
    except ValidationError as exc:
        raise click.UsageError(f"invalid settings: {exc}") from exc
    ctx.obj = Context(settings, locate(settings.home, flag=home is not None,
                                           given="home" in settings.model_fields_set))


@cli.result_callback()
@pass_ctx
def _after(ctx: Context, *_: Any, **__: Any) -> None:
    ctx.say_home()
    ctx.replicated()


for module in (init_commands, release_commands, key_commands, rollout_commands,
               retire_commands, audit_commands, fleet_commands, serve_commands):
    for command in module.COMMANDS:
        cli.add_command(command)


def main(argv: list[str] | None = None) -> None:
    run(cli, argv)


if __name__ == "__main__":
    main()
