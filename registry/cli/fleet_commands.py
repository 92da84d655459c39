"""``registry status``, ``cascade`` and ``node provision|token|revoke``: the nodes, their
escalation budgets and their identities."""

from __future__ import annotations

from pathlib import Path

import click
from rich.markup import escape

from registry.cli import tables
from registry.cli.context import Context, emit, err, json_flag, out, pass_ctx
from registry.cli.rollout_commands import rollout_state
from registry.fleet import budgets
from registry.fleet.nodes import NodeBook
from registry.releases import waves
from registry.releases.names import check_name
from serving.config.tokens import NODE_ID, TokenError, node_token, parse, write_secret


@click.command("status")
@json_flag
@pass_ctx
def status_cmd(ctx: Context, as_json: bool) -> None:
    """Per model, every node that subscribed: version, desired version, ack state, last seen,
    escalation rate and p99 from its last quality report; nodes that lag are named."""
    rows = NodeBook(ctx.catalog.db).status(ctx.catalog)

    def human() -> None:
        tables.status_tables(out, rows)
        stale = sorted({r["node"] for r in rows if (r.get("trust") or {}).get("stale")})
        if stale:
            out.print(f"[red]release metadata stale on {len(stale)} node(s)[/] "
                      f"({', '.join(stale[:10])}): no fresh TUF timestamp reached them")
        for model in ctx.catalog.models():
            rollout = rollout_state(ctx, model["name"])
            if rollout is not None and (rollout["state"] in waves.OPEN or
                                        model["production"] != rollout["version"]):
                tables.rollout_view(out, rollout)

    emit(as_json, rows, human)


@click.command("cascade")
@click.argument("name")
@click.option("--mode", type=click.Choice(["auto", "static"]), default=None,
              help="auto: edges hold their escalations to budgets from the centers' capacity; "
                   "static: every edge keeps the release's calibrated threshold.")
@click.option("--capacity", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Rows per second all centers take, instead of what they report.")
@click.option("--measured", is_flag=True, help="Use the centers' reported capacity again.")
@click.option("--split", type=click.Choice(["traffic", "equal"]), default=None,
              help="How the capacity is split over the edges (default traffic).")
@click.option("--max-capacity", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Ceiling (rows/s) on the capacity the centers report: budgets never add "
                   "up to more, whatever a node says.")
@click.option("--no-max-capacity", is_flag=True, help="Remove the ceiling.")
@json_flag
@pass_ctx
def cascade_cmd(ctx: Context, name: str, mode: str | None, capacity: float | None,
                measured: bool, split: str | None, max_capacity: float | None,
                no_max_capacity: bool, as_json: bool) -> None:
    """Show or change NAME's cascade policy (audited when it changes): how ``registry serve``
    turns the centers' capacity into each edge's escalation budget (docs/cascade.md)."""
    if capacity is not None and measured:
        raise click.UsageError("--capacity and --measured contradict each other")
    if max_capacity is not None and no_max_capacity:
        raise click.UsageError("--max-capacity and --no-max-capacity contradict each other")
    catalog = ctx.catalog
    check_name(name)
    policy = budgets.policies(catalog.db).get(name, budgets.CascadePolicy(
        split=ctx.settings.budget_split))
    if mode or capacity is not None or measured or split or max_capacity or no_max_capacity:
        policy = budgets.set_policy(catalog.db, catalog.anchor, ctx.settings.actor, name,
                                    budgets.CascadePolicy(
                                        mode or policy.mode,  # type: ignore[arg-type]
                                        None if measured else (capacity or
                                                               policy.capacity_rows_s),
                                        split or policy.split,  # type: ignore[arg-type]
                                        None if no_max_capacity else (
                                            max_capacity or policy.max_capacity_rows_s)))
    data = {"model": name, "mode": policy.mode, "capacity_rows_s": policy.capacity_rows_s,
            "split": policy.split, "max_capacity_rows_s": policy.max_capacity_rows_s}
    given = ("reported by the centers" if policy.capacity_rows_s is None
             else f"{policy.capacity_rows_s:g} rows/s")
    ceiling = ("" if policy.max_capacity_rows_s is None
               else f" (at most {policy.max_capacity_rows_s:g} rows/s)")
    emit(as_json, data, lambda: out.print(f"{name}: cascade {policy.mode}, capacity {given}"
                                          f"{ceiling}, split by {policy.split}"))


@click.group("node")
def node_group() -> None:
    """Node identities: each edge and center has its own token (and, provisioned, its own
    certificate); the registry believes a node's tier and region only as issued here."""


tier_option = click.option("--tier", type=click.Choice(["edge", "center"]), required=True,
                           help="The node's tier: the registry takes it from the token, never "
                                "from the node's hello.")
region_option = click.option("--region", required=True,
                             help="The node's region tag (as its --region): lower-case "
                                  "letters, digits and '-'. A hello naming another is refused.")


@node_group.command("provision")
@click.argument("node_id")
@tier_option
@region_option
@click.option("--out", "path", type=click.Path(path_type=Path), default=None,
              help="The bundle file to write (mode 0600; it holds the node's private key). "
                   "Required: a private key is never printed.")
@click.option("--ca", "ca_dir", type=click.Path(path_type=Path), default=None,
              help="Fleet CA folder (default REGISTRY_CA_DIR, else <home>/tls; made on first "
                   "use).")
@click.option("--host", "hosts", multiple=True,
              help="Another name or address the node is reached at, put in its certificate "
                   "(repeat).")
@json_flag
@pass_ctx
def node_provision_cmd(ctx: Context, node_id: str, tier: str, region: str, path: Path | None,
                       ca_dir: Path | None, hosts: tuple[str, ...], as_json: bool) -> None:
    """Make NODE_ID's bundle (audited): its token at the current generation (naming its tier
    and region), a fresh key and certificate from the fleet CA, the CA, and the audit chain's
    head as its directive floor. Copy the file to the node and start it with it."""
    from registry.trust.provision import ProvisionError, check, provision

    if path is None:
        raise click.UsageError("the bundle holds the node's private key, which is never "
                               "printed: give --out FILE (written mode 0600). `registry node "
                               "token` prints a token alone")
    try:
        check(ctx.settings, node_id, tier, region)
    except ProvisionError as exc:
        raise click.UsageError(str(exc)) from exc
    ctx.catalog  # noqa: B018 - creates and migrates the database (and sweeps) first
    made = provision(ctx.settings, node_id, tier, region, hosts, ca_dir, path)
    data = {"node": node_id, "tier": tier, "region": region, "bundle": str(path),
            "generation": parse(made.token).generation,
            "directive_floor": made.directive_floor}
    emit(as_json, data, lambda: out.print(
        f"wrote {escape(node_id)}'s bundle ({tier}, region {escape(region)}, token generation "
        f"{data['generation']}, directive floor {made.directive_floor}) to {escape(str(path))}: "
        f"copy it to the node (it holds the node's private key)"))


@node_group.command("token")
@click.argument("node_id")
@tier_option
@region_option
@click.option("--out", "path", type=click.Path(path_type=Path), default=None,
              help="Write the token to this file (mode 0600) instead of printing it.")
@pass_ctx
def node_token_cmd(ctx: Context, node_id: str, tier: str, region: str,
                   path: Path | None) -> None:
    """The registry token of NODE_ID alone (for a node without its own certificate; `node
    provision` makes the whole bundle): derived from REGISTRY_TOKEN, the node's current
    generation, tier and region, so the registry stores no per-node secret. It proves NODE_ID,
    as that tier in that region, and no other node."""
    settings = ctx.settings
    if settings.token is None:
        raise click.UsageError("node tokens are derived from the registry's secret: set "
                               "REGISTRY_TOKEN (or REGISTRY_TOKEN_FILE)")
    generation = NodeBook(ctx.catalog.db).generations().get(node_id, 1)
    try:
        token = node_token(settings.token.get_secret_value(), node_id, tier, region,
                           generation)
    except TokenError as exc:
        raise click.UsageError(str(exc)) from exc
    if path is None:
        click.echo(token)
        return
    write_secret(path, f"{token}\n".encode())
    err.print(f"wrote {escape(node_id)}'s token to {path}")


@node_group.command("revoke")
@click.argument("node_id")
@pass_ctx
def node_revoke_cmd(ctx: Context, node_id: str) -> None:
    """Void NODE_ID's token (audited): ``registry serve`` closes its stream and refuses the old
    token; ``registry node provision NODE_ID`` then issues the new generation."""
    if not NODE_ID.fullmatch(node_id):
        raise click.UsageError(f"invalid node id {node_id[:64]!r}")
    catalog = ctx.catalog
    generation = NodeBook(catalog.db, catalog.anchor).revoke(node_id, ctx.settings.actor)
    out.print(f"revoked {escape(node_id)}'s token; its new one is generation {generation} "
              f"(`registry node provision {escape(node_id)} --tier T --region R --out FILE`)")


# registered on the ``registry`` group by registry.cli.main
COMMANDS = (status_cmd, cascade_cmd, node_group)
