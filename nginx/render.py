"""The upstream renderer (consul-template's job, kept small): follows the passing edges, centers
and registry in Consul with blocking queries, writes ``upstreams.conf`` atomically, and reloads
nginx only when that file's content changed. With ``--run-nginx`` it also runs nginx as its
child (``daemon off``) and stops it on SIGTERM/SIGINT.

    python -m nginx.render --prefix var/nginx --listen 127.0.0.1:8080 --consul 127.0.0.1:8500 \\
        --run-nginx
"""

from __future__ import annotations

import asyncio
import grp
import logging
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import click
import uvloop

from serving.config.tokens import read_secret
from serving.fleet import discovery
from serving.fleet.discovery import Instance
from serving.telemetry.logs import configure

log = logging.getLogger("nginx.render")
TEMPLATE = Path(__file__).with_name("nginx.conf.template")
NOWHERE = "server 127.0.0.1:9 down;  # none passing"
skipped = discovery.Throttled(log)


@dataclass
class Fleet:
    edges: list[Instance] = field(default_factory=list)
    centers: list[Instance] = field(default_factory=list)
    registries: list[Instance] = field(default_factory=list)
    region: str | None = None  # the site this nginx is the entry of: its edges by default
    fallback: tuple[str, ...] = ()  # other regions, nearest first (then the rest, by name)


def _nearest_other(edges: list[Instance], region: str,
                   fallback: tuple[str, ...]) -> list[Instance]:
    """The edges a site's entry fails over to when none of its own can answer: every edge
    of the nearest other region that has a passing one (``fallback`` order, then the other
    regions by name); if no other region has a passing edge, all other edges (the failing
    ones are tried last by ``_servers`` anyway)."""
    others = [i for i in edges if i.region != region]
    named = sorted({i.region for i in others})
    order = [r for r in fallback if r in named] + [r for r in named if r not in fallback]
    for candidate in order:
        nearest = [i for i in others if i.region == candidate]
        if any(i.passing for i in nearest):
            return nearest
    return others


def _servers(instances: list[Instance], backup: list[Instance] | None = None,
             grpc: bool = False) -> list[str]:
    """Passing ``instances`` first, then ``backup`` and, as a last resort, the instances Consul
    lists as failing: one that just came back may not be passing yet in this config (a reload
    takes a moment; workers on keep-alive connections still use the old one), and a refused
    connection only costs the next try. nginx's own failure marking is off (``max_fails=0``):
    Consul is the health source. With it on, an edge restarted faster than Consul's check saw
    it dead stayed shut out for ``fail_timeout``, and when the other edge died then, every
    request got a 502 (the chaos replay found both). (Failing instances stay here: they pass
    the same checks as passing ones, and only a token holder of the role registers them.)"""
    def port(i: Instance) -> int | None:
        return i.grpc_port if grpc else i.port

    live = [i for i in instances if i.passing and port(i)]
    spare = [i for i in backup or [] if i.passing and port(i)]
    spare += [i for i in [*instances, *(backup or [])] if not i.passing and port(i)]
    lines = [f"server {_target(i.address, port(i))} max_fails=0;" for i in live] or [NOWHERE]
    lines += [f"server {_target(i.address, port(i))} max_fails=0 backup;" for i in spare]
    return lines


def _target(address: str, port: object) -> str:
    """``host:port`` for a ``server`` line, built from checked parts only (an IP address
    object's text, a host name that passed RFC 1123, an int): even an Instance made without
    ``discovery.instance`` cannot put another character into the file."""
    return discovery.host_port(discovery.checked_address(address), discovery.checked_port(port))


def _renderable(instances: list[Instance]) -> list[Instance]:
    """The instances every value of which the config uses passes the checks (Watch skipped
    the others already; this holds whatever filled the Fleet)."""
    kept = []
    for i in instances:
        try:
            _target(i.address, i.port)
            discovery.checked_region(i.region)
            _ = i.metrics_port, i.grpc_port  # checked when present
        except discovery.InvalidInstance as exc:
            skipped.warning("not rendering %r: %s", str(i.service_id)[:80], exc)
            continue
        kept.append(i)
    return kept


def _upstream(name: str, servers: list[str], balance: str = "least_conn;") -> str:
    body = "\n".join(f"    {line}" for line in [balance, *servers, "keepalive 16;"] if line)
    return f"upstream {name} {{\n{body}\n}}\n"


def upstreams(fleet: Fleet) -> str:
    """The upstream blocks and the region map: a region's pool is its edges, the rest backup.
    A site's entry (``fleet.region`` set) sends requests without a region hint to its own
    region's edges, and fails over only to the nearest other region's (``_nearest_other``).
    Only instances whose values pass discovery's checks are written, each from checked parts."""
    edges, centers = _renderable(fleet.edges), _renderable(fleet.centers)
    registries = _renderable(fleet.registries)
    home = discovery.checked_region(fleet.region) if fleet.region else None
    regions = sorted({discovery.checked_region(i.region) for i in edges}
                     | ({home} if home else set()))
    parts = ["# written by nginx/render.py from Consul; rewritten on every change\n"]
    for suffix, grpc in (("", False), ("_grpc", True)):  # HTTP, and gRPC (meta grpc_port)
        parts.append(_upstream(f"tiered_edges{suffix}", _servers(edges, grpc=grpc)))
        pools = []
        for region in regions:
            local = [i for i in edges if i.region == region]
            others = ([i for i in edges if i not in local] if region != home
                      else _nearest_other(edges, region, fleet.fallback))
            # [a-z0-9_]: no two regions collide
            name = f"tiered_edges{suffix}_{region.replace('-', '_')}"
            parts.append(_upstream(name, _servers(local, others, grpc=grpc)))
            pools.append(f'    "{region}" {name};')
        default = (f"tiered_edges{suffix}_{home.replace('-', '_')}" if home
                   else f"tiered_edges{suffix}")
        parts.append(f"map $http_x_tiered_region $tiered_edge{suffix}_pool {{\n"
                     f"    default {default};\n"
                     + "".join(f"{p}\n" for p in pools) + "}\n")
    parts.append(_upstream("tiered_centers", _servers(centers)))
    metrics = [f"server {_target(i.address, i.metrics_port)};" for i in registries
               if i.metrics_port and i.passing]
    parts.append(_upstream("tiered_registry_metrics", metrics or [NOWHERE], balance=""))
    return "\n".join(parts)


GRPC_SERVER = """
    # gRPC V2 (HTTP/2) to the edges' gRPC ports, same pools and X-Tiered-Region hint as /v2/
    server {
        listen @GRPC_LISTEN@ http2;
        location / {
            limit_req zone=per_client burst=@BURST@ nodelay;
            grpc_next_upstream error timeout non_idempotent;
            grpc_next_upstream_tries 0;  # each server at most once
            grpc_next_upstream_timeout 15s;
            grpc_read_timeout 30s;
            grpc_send_timeout 30s;
            grpc_set_header X-Request-ID $tiered_request_id;
            grpc_pass grpc://$tiered_edge_grpc_pool;
        }
    }
"""


SAFE_PATH = re.compile(r"/[A-Za-z0-9._/-]+")  # what a file path in the config may hold


def center_pass(center_ca: Path | None) -> str:
    """How /center/v2/ reaches the centers: plain HTTP, or HTTPS verified against the fleet
    CA with the center role's TLS name (only a center's certificate answers to it)."""
    if center_ca is None:
        return "proxy_pass http://tiered_centers/v2/;"
    ca = str(center_ca.resolve())
    if not SAFE_PATH.fullmatch(ca):
        raise ValueError(f"center CA path {ca[:80]!r}: only letters, digits and ._/- allowed")
    return (f"proxy_pass https://tiered_centers/v2/;\n"
            f"            proxy_ssl_trusted_certificate {ca};\n"
            f"            proxy_ssl_verify on;\n"
            f"            proxy_ssl_name {discovery.CENTER_TLS_NAME};\n"
            f"            proxy_ssl_server_name on;")


def config(prefix: Path, listen: str, rate: int, burst: int, max_body: str,
           temp: Path | None = None, grpc_listen: str | None = None,
           center_ca: Path | None = None) -> str:
    text = TEMPLATE.read_text()
    temp = temp or prefix / "tmp"
    user = ""
    if os.geteuid() == 0:  # workers drop to nobody; say so, temp_dir gives them their folder
        nobody = pwd.getpwnam("nobody")
        user = f"user nobody {grp.getgrgid(nobody.pw_gid).gr_name};\n"
    grpc = GRPC_SERVER.replace("@GRPC_LISTEN@", grpc_listen) if grpc_listen else ""
    for key, value in {"@GRPC_SERVER@": grpc, "@CENTER_PASS@": center_pass(center_ca),
                       "@PREFIX@": str(prefix.resolve()), "@TEMP@": str(temp.resolve()),
                       "@USER@": user,
                       "@LISTEN@": listen,
                       "@RATE@": str(rate), "@BURST@": str(burst), "@MAX_BODY@": max_body}.items():
        text = text.replace(key, value)
    return text


def write_atomically(path: Path, text: str) -> bool:
    """Replace ``path`` with ``text`` unless it already says that; True if it changed."""
    if path.is_file() and path.read_text() == text:
        return False
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)
    return True


class Renderer:
    def __init__(self, prefix: Path, nginx: str, run_nginx: bool, region: str | None = None,
                 fallback: tuple[str, ...] = ()) -> None:
        self.prefix, self.nginx, self.run_nginx = prefix, nginx, run_nginx
        self.fleet = Fleet(region=region, fallback=fallback)
        self.child: subprocess.Popen[bytes] | None = None
        self.reloads = 0

    @property
    def conf(self) -> Path:
        return self.prefix / "nginx.conf"

    def render(self) -> None:
        if not write_atomically(self.prefix / "upstreams.conf", upstreams(self.fleet)):
            return
        log.info("upstreams: edges %s, centers %s", [i.target for i in self.fleet.edges],
                 [i.target for i in self.fleet.centers])
        self.reload()

    def reload(self) -> None:
        """SIGHUP to the nginx master: new workers take the new upstreams, old ones finish."""
        pid = self.child.pid if self.child else _pid(self.prefix / "nginx.pid")
        if pid is None:
            return
        check = subprocess.run([self.nginx, "-t", "-q", "-p", str(self.prefix), "-c",
                                str(self.conf)], capture_output=True, text=True)
        if check.returncode != 0:
            log.error("not reloading nginx, the config does not pass nginx -t: %s",
                      check.stderr.strip())
            return
        os.kill(pid, signal.SIGHUP)
        self.reloads += 1

    def start_nginx(self) -> None:
        self.child = subprocess.Popen([self.nginx, "-p", str(self.prefix), "-c",
                                       str(self.conf)])
        log.info("nginx running (pid %s)", self.child.pid)

    def stop_nginx(self) -> None:
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signal.SIGQUIT)  # graceful: finish requests in flight
            try:
                self.child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.child.kill()
                self.child.wait()

    def follow(self, role: str) -> discovery.OnChange:
        def changed(instances: list[Instance]) -> None:
            setattr(self.fleet, role, instances)
            self.render()

        return changed


def _pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


async def serve(renderer: Renderer, consul_addr: str | None, token: str | None) -> None:
    tasks = []
    client = discovery.client(consul_addr, token) if consul_addr else None
    if client is not None:
        for role, service in (("edges", "edge"), ("centers", "center"),
                              ("registries", "registry")):
            watch = discovery.Watch(client, discovery.SERVICES[service], renderer.follow(role),
                                    passing_only=False)
            tasks.append(asyncio.create_task(watch.run()))
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    if renderer.child is not None:
        tasks.append(asyncio.create_task(_exit_with(renderer.child, stopping)))
    await stopping.wait()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    if client is not None:
        await client.close()


async def _exit_with(child: subprocess.Popen[bytes], stopping: asyncio.Event) -> None:
    while child.poll() is None:
        await asyncio.sleep(0.5)
    log.error("nginx exited with status %s", child.returncode)
    stopping.set()


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--prefix", type=click.Path(path_type=Path), required=True,
              help="Folder for nginx.conf, upstreams.conf, the pid file, logs and temp files.")
@click.option("--listen", default="127.0.0.1:8080", show_default=True,
              help="Address nginx listens on (TIERED_HTTP_PORT in `tiered up`).")
@click.option("--grpc-listen", default=None,
              help="Address nginx takes gRPC V2 (HTTP/2) on, routed to the edges' gRPC ports "
                   "(TIERED_GRPC_PORT in `tiered up`); unset = no gRPC listener.")
@click.option("--consul", "consul_addr", envvar="CONSUL_HTTP_ADDR", default=None,
              help="Consul agent host:port. [env: CONSUL_HTTP_ADDR]")
@click.option("--consul-token-file", type=click.Path(path_type=Path, dir_okay=False),
              envvar="CONSUL_HTTP_TOKEN_FILE", default=None,
              help="File holding the Consul ACL token; the token itself comes only from the "
                   "environment (CONSUL_HTTP_TOKEN), never a flag. [env: CONSUL_HTTP_TOKEN_FILE]")
@click.option("--nginx", "nginx_bin", default=None, help="nginx binary (default: from PATH, "
              "else /usr/sbin/nginx).")
@click.option("--run-nginx", is_flag=True, help="Run nginx as a child and stop it on exit.")
@click.option("--region", default=None, callback=lambda _c, _p, v: _region(v),
              help="The region (site) this nginx is the entry of: requests without an "
                   "X-Tiered-Region hint go to its edges, then to the nearest other region's.")
@click.option("--fallback-regions", default="", callback=lambda _c, _p, v: _regions(v),
              help="Comma-separated regions to fail over to, nearest first (default: the other "
                   "regions by name).")
@click.option("--center-ca", type=click.Path(path_type=Path, dir_okay=False, exists=True),
              default=None, help="Fleet CA (PEM): /center/v2/ goes to the centers over HTTPS, "
                                 "their center certificate checked against it.")
@click.option("--rate", default=500, show_default=True, help="Requests per second per client.")
@click.option("--burst", default=1000, show_default=True, help="Burst above --rate per client.")
@click.option("--max-body", default="1m", show_default=True, help="client_max_body_size.")
def main(prefix: Path, listen: str, grpc_listen: str | None, consul_addr: str | None,
         consul_token_file: Path | None, nginx_bin: str | None, run_nginx: bool,
         region: str | None, fallback_regions: tuple[str, ...], center_ca: Path | None,
         rate: int, burst: int, max_body: str) -> None:
    """Render nginx's config from the template and keep its upstreams in step with Consul."""
    configure("nginx-render", "INFO", None, 10 * 1024 * 1024, 3)
    nginx = nginx_bin or shutil.which("nginx") or "/usr/sbin/nginx"
    for sub in ("tmp", "logs"):
        (prefix / sub).mkdir(parents=True, exist_ok=True)
    temp = temp_dir(prefix)
    renderer = Renderer(prefix, nginx, run_nginx, region, fallback_regions)
    try:
        conf = config(prefix, listen, rate, burst, max_body, temp, grpc_listen, center_ca)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--center-ca") from exc
    write_atomically(renderer.conf, conf)
    write_atomically(prefix / "upstreams.conf", upstreams(renderer.fleet))
    if run_nginx:
        renderer.start_nginx()
    try:
        uvloop.run(serve(renderer, consul_addr, consul_token(consul_token_file)))
    finally:
        renderer.stop_nginx()
        if temp != prefix / "tmp":
            shutil.rmtree(temp, ignore_errors=True)


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


def temp_dir(prefix: Path) -> Path:
    """Where nginx buffers request bodies (and responses) too big for memory: under the prefix,
    unless nginx runs as root. Its workers then run as ``nobody``, who may not reach the prefix
    (a 0700 parent folder): a body over 16 KiB would get a 500. They get a folder of their own
    in the system's temp dir instead."""
    if os.geteuid() != 0:
        return prefix / "tmp"
    temp = Path(tempfile.mkdtemp(prefix="tiered-nginx-"))
    nobody = pwd.getpwnam("nobody")
    os.chown(temp, nobody.pw_uid, nobody.pw_gid)
    return temp


if __name__ == "__main__":
    main()
