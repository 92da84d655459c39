"""``registry promote``, ``rollback`` and ``rollout show|pause|resume|abort``: which version
the nodes run."""

from __future__ import annotations

import time
from typing import Any

import click

from registry.cli import tables
from registry.cli.context import Context, emit, json_flag, out, pass_ctx
from registry.cli.tables import shown
from registry.errors import RegistryError
from registry.releases import steering, waves
from registry.trust import anchor


@click.command("promote")
@click.argument("name")
@click.option("--version", type=click.IntRange(min=1), default=None,
              help="Version to make production (default: the canary).")
@json_flag
@pass_ctx
def promote_cmd(ctx: Context, name: str, version: int | None, as_json: bool) -> None:
    """Point the production alias at the canary (or VERSION) and roll it out to all nodes."""
    target = ctx.catalog.promote(name, version)
    emit(as_json, {"model": name, "production": target},
         lambda: out.print(f"{name}: production -> version {target}"))


@click.command("rollback")
@click.argument("name")
@click.option("--to", "to", type=click.IntRange(min=1), default=None,
              help="Version to go back to (default: the one before production).")
@json_flag
@pass_ctx
def rollback_cmd(ctx: Context, name: str, to: int | None, as_json: bool) -> None:
    """Point the production alias back to an earlier version."""
    previous, target = ctx.catalog.rollback(name, to)
    emit(as_json, {"model": name, "from": previous, "production": target},
         lambda: out.print(f"{name}: production version {previous} -> {target}"))


def rollout_state(ctx: Context, name: str) -> dict[str, Any] | None:
    """The model's newest wave rollout (``Rollout.to_json``) with its current wave's nodes."""
    return waves.summary(ctx.catalog.db.conn, name)


@click.group("rollout")
def rollout_group() -> None:
    """Wave rollouts (`registry publish --waves`): where one is, pause, resume or abort it.
    A gate that cannot judge (too little evidence, or one node's word would decide) holds the
    rollout until a person resumes it with a reason or aborts it."""


@rollout_group.command("show")
@click.argument("name")
@json_flag
@pass_ctx
def rollout_show_cmd(ctx: Context, name: str, as_json: bool) -> None:
    """The model's newest wave rollout: each wave's state and its gate's figures."""
    ctx.catalog.versions(name)  # the model exists
    rollout = rollout_state(ctx, name)
    if rollout is None:
        raise RegistryError(f"{name} has never been rolled out in waves")
    emit(as_json, rollout, lambda: tables.rollout_view(out, rollout))


def _steer(ctx: Context, name: str, action: str, as_json: bool,
           reason: str | None = None) -> None:
    ctx.catalog.versions(name)  # the model exists
    with anchor.audited(ctx.catalog.db, ctx.catalog.anchor) as conn:
        r = steering.steer(conn, name, action, ctx.settings.actor, time.time(), reason)
    emit(as_json, r.to_json(), lambda: out.print(
        f"{shown(name)}: rollout of version {r.version} {r.state} at wave {r.wave + 1}/"
        f"{len(r.policy.waves)}" + (" (every node goes back to version "
                                    f"{r.previous})" if r.state == "aborted" else "")))


REASON = click.option("--reason", default=None, metavar="TEXT",
                      help="Why, written to the audit log with the change (required to resume "
                           "a held rollout: that passes its gate).")


@rollout_group.command("pause")
@click.argument("name")
@json_flag
@pass_ctx
def rollout_pause_cmd(ctx: Context, name: str, as_json: bool) -> None:
    """Hold the rollout where it is: admitted nodes keep the new version, no gate runs."""
    _steer(ctx, name, "pause", as_json)


@rollout_group.command("resume")
@click.argument("name")
@REASON
@json_flag
@pass_ctx
def rollout_resume_cmd(ctx: Context, name: str, reason: str | None, as_json: bool) -> None:
    """Go on with a rollout: a held one passes its gate (--reason required), a paused or
    halted one has its current wave admitted and judged again."""
    _steer(ctx, name, "resume", as_json, reason)


@rollout_group.command("abort")
@click.argument("name")
@REASON
@json_flag
@pass_ctx
def rollout_abort_cmd(ctx: Context, name: str, reason: str | None, as_json: bool) -> None:
    """End the rollout: every node goes back to production."""
    _steer(ctx, name, "abort", as_json, reason)


# registered on the ``registry`` group by registry.cli.main
COMMANDS = (promote_cmd, rollback_cmd, rollout_group)
