"""``registry retire NAME``: take a model off every node, its history kept
(``registry.releases.retire``); and the line ``registry show`` adds for a retired model."""

from __future__ import annotations

import click
from rich.console import Console
from rich.markup import escape

from registry.cli.context import Context, emit, json_flag, out, pass_ctx
from registry.releases import retire


@click.command("retire")
@click.argument("name")
@click.option("--reason", default=None, metavar="TEXT",
              help="Why, written to the audit log with the retirement.")
@json_flag
@pass_ctx
def retire_cmd(ctx: Context, name: str, reason: str | None, as_json: bool) -> None:
    """Take NAME off every node: no node is to run any version of it, and each node that
    serves it unloads it (in-flight requests finish) and removes it from its store. Audited;
    its versions and history stay (`registry show NAME`). Publishing NAME again, or
    `registry promote NAME --version N`, brings it back."""
    made, changed = ctx.catalog.retire(name, reason)
    emit(as_json, {**made.to_json(), "changed": changed, "home": str(ctx.settings.home)},
         lambda: _said(made, changed))


def _said(made: retire.Retirement, changed: bool) -> None:
    if not changed:
        out.print(f"{escape(made.model)} is retired already (since {made.retired_at}, audit "
                  f"record {made.seq}): nothing to do")
        return
    was = f"production was version {made.version}" if made.version else "no production version"
    out.print(f"{escape(made.model)}: retired ({was}; audit record {made.seq}). Every node "
              f"unloads it; `registry status` shows each node's RETIRED ack")


def say_retired(console: Console, ctx: Context, name: str) -> None:
    """Under ``registry show NAME``: when it was retired, by whom, why, how to bring it back."""
    made = retire.retirement(ctx.catalog.db.conn, name)
    if made is None:
        return
    why = f" ({escape(made.reason)})" if made.reason else ""
    console.print(f"[yellow]retired[/] at {made.retired_at} by {escape(made.actor)}{why}; "
                  f"production was version {made.version or '-'}. No node runs it; publish it "
                  f"again (or `registry promote {escape(name)} --version N`) to bring it back")


# registered on the ``registry`` group by registry.cli.main
COMMANDS = (retire_cmd,)
