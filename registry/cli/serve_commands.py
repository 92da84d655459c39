"""``registry serve`` and ``replication``: the sync server, and this registry's part in a
replicated group."""

from __future__ import annotations

import time
from pathlib import Path

import click
from pydantic import ValidationError
from rich.markup import escape

from registry.cli.context import Context, emit, json_flag, out, pass_ctx
from registry.ha import changes
from registry.settings import RegistrySettings
from registry.store import role
from serving.config.flags import options as settings_options


@click.command("replication")
@json_flag
@pass_ctx
def replication_cmd(ctx: Context, as_json: bool) -> None:
    """This registry's part in a replicated group: its role (standalone, primary, standby),
    term, primary, lease, how far its data goes and, on a primary, each standby's position
    and lag (read from the database: works on a stopped registry too)."""
    conn = ctx.catalog.db.conn
    state = role.state(conn)
    at = changes.position(conn)
    now = time.time()
    standbys = [{"registry_id": r[0], "position": int(r[1]), "behind": max(at - int(r[1]), 0),
                 "acked_s_ago": round(now - float(r[2]), 1)}
                for r in conn.execute("SELECT replica, position, acked_at FROM replicas "
                                      "ORDER BY replica")]
    data = {"role": state.role, "registry_id": state.registry_id, "term": state.term,
            "primary": state.leader, "writable": state.writable,
            "lease_s_left": round(max(state.lease_until - now, 0), 1)
            if state.role == "primary" else None,
            "position": at, "history_term": state.history_term,
            "async_commits": state.async_commits, "standbys": standbys}

    def human() -> None:
        out.print(f"{state.role} {escape(state.registry_id or '')} (term {state.term}), "
                  f"{'accepting writes' if state.writable else 'refusing writes'}; data up to "
                  f"change {at}")
        if state.role == "standby":
            out.print(f"  primary: {escape(state.leader or 'not known yet')}")
        for row in standbys:
            out.print(f"  standby {escape(row['registry_id'])}: change {row['position']} "
                      f"({row['behind']} behind), last ack {row['acked_s_ago']}s ago")
        if state.async_commits:
            out.print(f"  {state.async_commits} change(s) committed without a standby "
                      f"(REGISTRY_SYNC_TIMEOUT_S)")

    emit(as_json, data, human)


@click.command("serve")
@settings_options(RegistrySettings, ("host", "grpc_port", "metrics_port", "tls_cert", "tls_key",
                                   "ha", "follow"),
                  flags={"grpc_port": "port"},
                  overrides={**{name: {"type": click.Path(path_type=Path, exists=True)}
                                for name in ("tls_cert", "tls_key")},
                             "ha": {"is_flag": True, "type": bool}})
@pass_ctx
def serve_cmd(ctx: Context, host: str | None, grpc_port: int | None,
              metrics_port: int | None, tls_cert: Path | None, tls_key: Path | None,
              ha: bool | None, follow: str | None) -> None:
    """Serve model sync over gRPC: push releases to every subscribed edge and center, send
    artifacts (resumable), record acks and quality reports. Needs REGISTRY_TOKEN."""
    from registry.server.app import run  # grpc loads here only

    flags = {"host": host, "grpc_port": grpc_port, "metrics_port": metrics_port,
             "tls_cert": tls_cert, "tls_key": tls_key, "ha": ha or None,
             "follow": follow}
    s = ctx.settings
    current = {name: getattr(s, name) for name in s.model_fields_set}
    try:
        settings = RegistrySettings(**{**current, **{k: v for k, v in flags.items()
                                                     if v is not None}})
    except ValidationError as exc:
        raise click.UsageError(f"invalid settings: {exc}") from exc
    if settings.token is None:
        raise click.UsageError("registry serve needs its secret: set REGISTRY_TOKEN (at least "
                               "16 characters) or REGISTRY_TOKEN_FILE")
    if settings.ha and not settings.consul_http_addr:
        raise click.UsageError("--ha elects the primary through Consul: set CONSUL_HTTP_ADDR")
    if settings.ha and settings.follow:
        raise click.UsageError("--ha finds the primary in Consul; --follow names one: not both")
    if (settings.tls_cert is None) != (settings.tls_key is None):
        raise click.UsageError("TLS needs both --tls-cert and --tls-key")
    ctx.create = True  # a server's home is made on purpose: a new volume starts empty
    ctx.catalog  # noqa: B018 - creates and migrates the database before serving
    ctx.say_home()
    run(settings)


# registered on the ``registry`` group by registry.cli.main
COMMANDS = (replication_cmd, serve_cmd)
