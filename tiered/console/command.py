"""``tiered console``: the fleet console on one port, for the entry nginx to pass /console/
to (``python -m nginx.render … --console HOST:PORT``)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import click
import uvicorn

from tiered.console.app import Console, build
from tiered.console.guard import credential
from tiered.views import registry_database


def _url(_ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """An http(s) URL or nothing: the page links to it, and nothing else may be a link."""
    if value is None:
        return None
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise click.BadParameter(f"{value[:80]!r} is not an http(s) URL", param=param)
    return value.rstrip("/")


def _listen(_ctx: click.Context, param: click.Parameter, value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise click.BadParameter(f"{value!r} is not HOST:PORT", param=param)
    return host.strip("[]"), int(port)


@click.command("console")
@click.option("--registry-home", type=click.Path(path_type=Path, file_okay=False),
              envvar="REGISTRY_HOME", default="var/registry", show_default=True,
              help="The registry's home: its database is opened read-only. [env: REGISTRY_HOME]")
@click.option("--listen", default="127.0.0.1:8090", show_default=True, callback=_listen,
              help="host:port the console listens on (keep it on loopback behind nginx).")
@click.option("--credential-file", type=click.Path(path_type=Path, dir_okay=False),
              required=True,
              help="File holding the operator secret (the Basic auth password of user "
                   "`operator`); made with a random one, mode 0600, when missing.")
@click.option("--prometheus", default=None, callback=_url,
              help="Prometheus' URL: linked, and its alerts read when no --alertmanager.")
@click.option("--alertmanager", default=None, callback=_url,
              help="Alertmanager's URL: the alerts firing are read from it (and linked).")
@click.option("--consul-ui", default=None, callback=_url, help="Consul's UI URL, linked.")
def console_cmd(registry_home: Path, listen: tuple[str, int], credential_file: Path,
                prometheus: str | None, alertmanager: str | None,
                consul_ui: str | None) -> None:
    """The fleet console: a read-only page under /console/ with the nodes by state and
    version per site, each rollout's waves and gate figures, escalation budget and shed,
    live accuracy and drift per release, the alerts firing and links to Consul and
    Prometheus. HTTP Basic: user `operator`, password the secret in --credential-file."""
    secret, made = credential(credential_file)
    if made:
        click.echo(f"wrote a new operator secret to {credential_file} (mode 0600)", err=True)
    console = Console(registry_database(registry_home.resolve()), prometheus, alertmanager,
                      consul_ui)
    host, port = listen
    uvicorn.run(build(console, secret), host=host, port=port, log_level="warning",
                server_header=False, proxy_headers=False)
