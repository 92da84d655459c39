"""The upstream renderer (consul-template's job, kept small), as a command: follows the passing
edges in Consul (and the centers and the registry, when the entry exposes them) with blocking
queries, writes each nginx's ``upstreams.conf`` atomically, and reloads that nginx only when its
file's content changed. With ``--run-nginx`` it also runs nginx as its child (``daemon off``):
the entry nginx, and the side nginx that reaches the centers and the registry's metrics
(``nginx/side.py``) when ``--expose-center`` or ``--expose-registry-metrics`` is given; it
stops them on SIGTERM/SIGINT, and exits non-zero when either exits.

    python -m nginx.render --prefix var/nginx --listen 127.0.0.1:8080 --consul 127.0.0.1:8500 \\
        --run-nginx
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import shutil
import signal
import ssl
from pathlib import Path

import click
import prometheus_client
import uvloop

from serving.config.tokens import read_secret
from serving.fleet import discovery
from serving.telemetry.logs import configure

from . import side as side_nginx
from .entry import Entry, config
from .fleet import SERVICE
from .guard import EdgeGuard
from .probe import Prober, client_context
from .process import Nginx, NginxExited, temp_dir, write_atomically
from .renderer import Renderer

log = logging.getLogger("nginx.render")
RERESOLVE_S = 5.0  # host names in the catalog are resolved again this often (renders if moved)
REVERIFY_S = 1.0  # over TLS, the guard is asked this often whether the edges need a new look


async def serve(renderer: Renderer, consul_addr: str | None, token: str | None) -> None:
    """Follow the fleet in Consul until a signal: one watch per role some nginx follows (the
    edges; the centers and the registry only for the side nginx, which exists only when the
    entry exposes them). A watch that ends, or an nginx that exits, stops the renderer with an
    error."""
    tasks = []
    client = discovery.client(consul_addr, token) if consul_addr else None
    if client is not None:
        for role in renderer.roles:
            watch = discovery.Watch(client, discovery.SERVICES[SERVICE[role]],
                                    renderer.follow(role), passing_only=False)
            tasks.append(asyncio.create_task(watch.run()))
        tasks.append(asyncio.create_task(reresolve(renderer)))
        if renderer.guard is not None:
            tasks.append(asyncio.create_task(reverify(renderer)))
    tasks += [asyncio.create_task(_exit_with(n)) for n in renderer.nginxes if n.child]
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)

    def check(task: asyncio.Task[None]) -> None:
        # a watch that ends leaves nginx on that role's last list for good: stop instead, and
        # exit non-zero, so that the supervisor (Swarm, systemd, `tiered up`) restarts it
        if not task.cancelled() and task.exception() is not None:
            log.error("%s; stopping", _why(task.exception()))
            stopping.set()

    for task in tasks:
        task.add_done_callback(check)
    await stopping.wait()
    ended = [t.exception() for t in tasks if t.done() and not t.cancelled() and t.exception()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    if client is not None:
        await client.close()
    if ended:
        raise click.ClickException(_why(ended[0]))


def _why(exc: BaseException | None) -> str:
    return str(exc) if isinstance(exc, NginxExited) else f"a watch of the fleet ended: {exc!r}"


async def reresolve(renderer: Renderer, every: float = RERESOLVE_S) -> None:
    """Render again every ``every`` seconds the nginx whose roles name hosts: a name can move
    or appear without the catalog changing (a Swarm task rescheduled to another node keeps its
    service name; a task's name resolves only once Docker finds it healthy, which may be after
    Consul's check passed), and nginx holds only the addresses. Nothing is reloaded when the
    answers are the same."""
    while True:
        await asyncio.sleep(every)
        named = tuple(r for r in renderer.roles if renderer.fleet.names_hosts((r,)))
        if named:
            await renderer.render_or_log("resolving the names again", named)


async def reverify(renderer: Renderer, every: float = REVERIFY_S) -> None:
    """Render the entry again whenever its guard says a look may change something (an entry
    waiting for its handshake, an edge held after leaving the catalog, a verdict grown old):
    a new edge is rendered once it answers as itself, not at the catalog's next change, and a
    held edge is let go on time. Nothing is reloaded when the edges are the same."""
    while True:
        await asyncio.sleep(every)
        if renderer.guard is not None and renderer.guard.due():
            await renderer.render_or_log("checking the edges' certificates again", ("edges",))


async def _exit_with(nginx: Nginx) -> None:
    """Raises NginxExited once ``nginx``'s process has ended."""
    assert nginx.child is not None
    while (status := nginx.child.poll()) is None:
        await asyncio.sleep(0.5)
    raise NginxExited(f"the {nginx.name} nginx exited with status {status}")


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--prefix", type=click.Path(path_type=Path), required=True,
              help="Folder for nginx.conf, upstreams.conf, the pid file, logs and temp files.")
@click.option("--listen", default="127.0.0.1:8080", show_default=True,
              help="Address nginx listens on (TIERED_HTTP_PORT in `tiered up`).")
@click.option("--grpc-listen", default=None,
              help="Address nginx takes gRPC V2 (HTTP/2) on, routed to the edges' gRPC ports "
                   "(TIERED_GRPC_PORT in `tiered up`); unset = no gRPC listener. Only "
                   "inference.GRPCInferenceService and grpc.health.v1.Health pass; anything "
                   "else (reflection) gets UNIMPLEMENTED, a message over --max-body "
                   "RESOURCE_EXHAUSTED.")
@click.option("--consul", "consul_addr", envvar="CONSUL_HTTP_ADDR", default=None,
              help="Consul agent host:port. [env: CONSUL_HTTP_ADDR]")
@click.option("--consul-token-file", type=click.Path(path_type=Path, dir_okay=False),
              envvar="CONSUL_HTTP_TOKEN_FILE", default=None,
              help="File holding the Consul ACL token; the token itself comes only from the "
                   "environment (CONSUL_HTTP_TOKEN), never a flag. nginx itself is started "
                   "with PATH as its only variable. [env: CONSUL_HTTP_TOKEN_FILE]")
@click.option("--nginx", "nginx_bin", default=None, help="nginx binary (default: from PATH, "
              "else /usr/sbin/nginx).")
@click.option("--run-nginx", is_flag=True, help="Run nginx as a child and stop it on exit "
              "(refused if its config fails nginx -t).")
@click.option("--region", default=None, callback=lambda _c, _p, v: _region(v),
              help="The region (site) this nginx is the entry of: requests without an "
                   "X-Tiered-Region hint go to its edges, then to the nearest other region's.")
@click.option("--fallback-regions", default="", callback=lambda _c, _p, v: _regions(v),
              help="Comma-separated regions to fail over to, nearest first (default: the other "
                   "regions by name).")
@click.option("--edge-ca", type=click.Path(path_type=Path, dir_okay=False, exists=True),
              default=None, help="Fleet CA (PEM): /v2/ and the gRPC entry go to the edges over "
                                 "TLS, each edge's certificate checked against it for the "
                                 "name of the node the catalog entry claims "
                                 "(<node id>.edge.tiered.invalid); an entry is rendered "
                                 "only once its address has proved that name to the "
                                 "renderer in a handshake. Unset: plain HTTP.")
@click.option("--center-ca", type=click.Path(path_type=Path, dir_okay=False, exists=True),
              default=None, help="Fleet CA (PEM): /center/v2/ goes to the centers over HTTPS, "
                                 "their center certificate checked against it.")
@click.option("--expose-center", is_flag=True,
              help="Serve /center/v2/ (the centers' escalation API, full precision; off: 404), "
                   "through a side nginx on a unix socket that follows the centers (their "
                   "changes reload only it). Clients through it bypass the edges' escalation "
                   "budgets: limited per client by --center-rate.")
@click.option("--center-rate", default=20, show_default=True,
              help="With --expose-center: /center/v2/ requests per second per client (burst "
                   "twice that).")
@click.option("--expose-registry-metrics", is_flag=True,
              help="Serve the registry's Prometheus metrics at /registry/metrics (off: 404), "
                   "through the side nginx; 1 request/s per client and 2/s in all.")
@click.option("--console", "console", default=None,
              help="host:port of the fleet console (`tiered console`): /console/ is passed "
                   "to it (it asks for the operator credential itself); unset = no /console/.")
@click.option("--metrics-listen", default=None,
              help="host:port for the renderer's own Prometheus metrics (entries left out of "
                   "upstreams.conf and why, nginx -t failures, reloads of the entry and the side "
                   "nginx); unset = none.")
@click.option("--rate", default=500, show_default=True, help="Requests per second per client.")
@click.option("--burst", default=1000, show_default=True, help="Burst above --rate per client.")
@click.option("--max-body", default="1m", show_default=True, help="client_max_body_size.")
def main(prefix: Path, listen: str, grpc_listen: str | None, consul_addr: str | None,
         consul_token_file: Path | None, nginx_bin: str | None, run_nginx: bool,
         region: str | None, fallback_regions: tuple[str, ...], edge_ca: Path | None,
         center_ca: Path | None, expose_center: bool, center_rate: int,
         expose_registry_metrics: bool, console: str | None, metrics_listen: str | None,
         rate: int, burst: int, max_body: str) -> None:
    """Render nginx's config from the template and keep its upstreams in step with Consul.

    nginx is only given IP literals (host names in the catalog are resolved here, or left
    out), and an upstreams.conf that fails nginx -t never replaces a working one. The centers
    and the registry (when exposed) are reached through a side nginx, reloaded on their
    changes: the entry clients hold connections to is reloaded only when the edges change."""
    configure("nginx-render", "INFO", None, 10 * 1024 * 1024, 3)
    binary = nginx_bin or shutil.which("nginx") or "/usr/sbin/nginx"
    exposed = Entry(grpc_listen, center_ca, edge_ca, expose_center, expose_registry_metrics,
                    center_rate, 2 * center_rate, console=console)
    folders: list[Path] = []  # made for this run's workers: removed on exit
    try:
        renderer = wire(prefix, binary, exposed, folders, listen=listen, rate=rate,
                        burst=burst, max_body=max_body, region=region,
                        fallback=fallback_regions)
        if metrics_listen:
            host, _, port = metrics_listen.rpartition(":")
            prometheus_client.start_http_server(int(port), host.strip("[]") or "127.0.0.1")
        try:
            if run_nginx:
                try:
                    renderer.start()
                except RuntimeError as exc:
                    raise click.ClickException(str(exc)) from exc
            uvloop.run(serve(renderer, consul_addr, consul_token(consul_token_file)))
        finally:
            renderer.stop()
    finally:
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)


def wire(prefix: Path, binary: str, exposed: Entry, folders: list[Path], *, listen: str,
         rate: int, burst: int, max_body: str, region: str | None,
         fallback: tuple[str, ...]) -> Renderer:
    """Both nginx.conf files written (the side's only when the entry exposes the center or
    the registry's metrics), each upstreams.conf for an empty fleet, and the renderer that
    keeps them in step; the folders made for the workers are added to ``folders``."""
    for sub in ("tmp", "logs", *(("side/logs",) if exposed.side_roles else ())):
        (prefix / sub).mkdir(parents=True, exist_ok=True)
    temp = temp_dir(prefix)
    if temp != prefix / "tmp":
        folders.append(temp)
    side, side_conf = None, ""
    try:
        if exposed.side_roles:
            folders.append(run := side_nginx.folder())
            side = Nginx("side", prefix / "side", binary)
            exposed = dataclasses.replace(exposed, side_socket=side_nginx.socket_path(run))
            side_conf = side_nginx.config(side.prefix, run, max_body, exposed)
        conf = config(prefix, listen, rate, burst, max_body, temp, exposed)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--center-ca/--edge-ca/--console") from exc
    entry = Nginx("entry", prefix, binary)
    write_atomically(entry.conf, conf)
    if side is not None:
        write_atomically(side.conf, side_conf)
    renderer = Renderer(entry, side, exposed.side_roles, region, fallback,
                        edge_tls=exposed.edge_ca is not None, guard=guard(exposed.edge_ca))
    renderer.write_empty()
    return renderer


def guard(edge_ca: Path | None) -> EdgeGuard | None:
    """With ``--edge-ca``: the guard that renders only the edges whose address proves, in a
    TLS handshake checked against that CA, the node their catalog entry names."""
    if edge_ca is None:
        return None
    try:
        return EdgeGuard(Prober(client_context(edge_ca)))
    except ssl.SSLError as exc:
        raise click.BadParameter(f"{edge_ca}: not a CA certificate ({exc})",
                                 param_hint="--edge-ca") from exc


def _region(value: str | None) -> str | None:
    if value is None:
        return None
    try:
        return discovery.checked_region(value)
    except discovery.InvalidInstance as exc:
        raise click.BadParameter(str(exc)) from exc


def _regions(value: str) -> tuple[str, ...]:
    return tuple(str(_region(v.strip())) for v in value.split(",") if v.strip())


def consul_token(path: Path | None) -> str | None:
    """CONSUL_HTTP_TOKEN from the environment, else from ``path`` (a secret never on argv)."""
    if os.environ.get("CONSUL_HTTP_TOKEN"):
        return os.environ["CONSUL_HTTP_TOKEN"]
    if path is None:
        return None
    try:
        return read_secret(path, "CONSUL_HTTP_TOKEN_FILE")
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc


if __name__ == "__main__":
    main()
