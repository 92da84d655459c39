"""The upstream renderer (consul-template's job, kept small): follows the passing edges, centers
and registry in Consul with blocking queries, writes ``upstreams.conf`` atomically, and reloads
nginx only when that file's content changed. With ``--run-nginx`` it also runs nginx as its
child (``daemon off``) and stops it on SIGTERM/SIGINT.

    python -m nginx.render --prefix var/nginx --listen 127.0.0.1:8080 --consul 127.0.0.1:8500 \\
        --run-nginx
"""

from __future__ import annotations

import asyncio
import dataclasses
import grp
import ipaddress
import logging
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import click
import prometheus_client
import uvloop

from serving.config.tokens import read_secret
from serving.fleet import discovery
from serving.fleet.discovery import Instance
from serving.telemetry.logs import configure

log = logging.getLogger("nginx.render")
TEMPLATE = Path(__file__).with_name("nginx.conf.template")
NOWHERE = "server 127.0.0.1:9 down;  # none passing"
skipped = discovery.Throttled(log)
# nginx and `nginx -t` get this environment and nothing else: its workers (``nobody`` under
# root) must not hold the renderer's Consul token in /proc/<pid>/environ or their memory
NGINX_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
RESOLVE_TIMEOUT_S = 1.0  # a host name in the catalog: resolved by the renderer, or dropped
RERESOLVE_S = 5.0  # host names in the catalog are resolved again this often (renders if moved)
KEEP_RESOLVED_S = 30.0  # a name that fails to resolve keeps its last answer this long
MAX_CHECKS = 64  # nginx -t runs spent looking for the entries a failing candidate owes to
UNMAPPED_TLS_NAME = "unmapped.tiered.invalid"  # no certificate names it: the handshake fails

DROPPED = prometheus_client.Gauge(
    "tiered_nginx_render_dropped_entries",
    "Catalog entries the last render left out of upstreams.conf, by role and reason "
    "(unresolvable, fails_nginx_check, duplicate_address, no_tls_name)", ["role", "reason"])
DROPS = prometheus_client.Counter(
    "tiered_nginx_render_dropped", "Catalog entries newly left out of upstreams.conf",
    ["role", "reason"])
CHECK_FAILURES = prometheus_client.Counter(
    "tiered_nginx_render_check_failures",
    "Candidate upstreams.conf files that failed nginx -t (the working one was kept)")
RELOADS = prometheus_client.Counter("tiered_nginx_render_reloads",
                                    "nginx reloads after a changed upstreams.conf")
REASONS = ("unresolvable", "fails_nginx_check", "duplicate_address", "no_tls_name")
ROLES = ("edges", "centers", "registries")


@dataclass
class Fleet:
    edges: list[Instance] = field(default_factory=list)
    centers: list[Instance] = field(default_factory=list)
    registries: list[Instance] = field(default_factory=list)
    region: str | None = None  # the site this nginx is the entry of: its edges by default
    fallback: tuple[str, ...] = ()  # other regions, nearest first (then the rest, by name)
    edge_tls: bool = False  # nginx reaches edges over TLS, checking each node's own name

    def names_hosts(self) -> bool:
        """Some entry's address is a host name (resolved by the renderer), not an IP."""
        return any(not _is_ip(i.address) for role in ROLES for i in getattr(self, role))

    def without(self, gone: set[tuple[str, str]]) -> Fleet:
        """This fleet less the (role, service id) pairs in ``gone``."""
        def kept(role: str) -> list[Instance]:
            return [i for i in getattr(self, role) if (role, i.service_id) not in gone]

        return dataclasses.replace(self, edges=kept("edges"), centers=kept("centers"),
                                   registries=kept("registries"))


@dataclass(frozen=True)
class Dropped:
    role: str
    service_id: str
    reason: str  # one of REASONS
    detail: str


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
    """``ip:port`` for a ``server`` line, built from checked parts only (an IP address
    object's text, an int): even an Instance made without ``discovery.instance`` cannot put
    another character into the file. Host names are refused: nginx resolves them when it
    loads the config, and one that does not resolve fails ``nginx -t``, so every later
    reload (the renderer resolves them itself first: ``resolved``)."""
    checked = discovery.checked_address(address)
    try:
        ipaddress.ip_address(checked)
    except ValueError:
        raise discovery.InvalidInstance(
            f"address {checked[:80]!r} is a host name, not an IP literal") from None
    return discovery.host_port(checked, discovery.checked_port(port))


def edge_tls_name(service_id: str) -> str:
    """The TLS name only this edge's own certificate answers to (``registry.pki.node_name``
    for tier ``edge``: ``<node id>.edge.tiered.invalid``); in Consul an edge's service id is
    its node id. InvalidInstance for an id that cannot be a DNS label."""
    try:
        return discovery.node_tls_name(service_id, "edge")
    except ValueError as exc:
        raise discovery.InvalidInstance(
            f"service id {service_id[:64]!r} cannot name a node certificate") from exc


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


def edge_tls_problems(edges: list[Instance]) -> dict[str, Dropped]:
    """For nginx -> edge TLS: the edges that cannot be rendered, by service id. An edge
    whose id cannot name a certificate; and every edge of an address (ip:port, HTTP or gRPC)
    that two catalog entries claim: nginx picks the name it checks by the address it dials,
    so an address must stand for one node. Two entries for one address mean one of them
    lies (or is stale), and the renderer cannot tell which: it renders neither (the name
    check would keep the wrong one from being answered by the other node anyway; dropping
    both says so in the log and the metric instead of a stream of failed handshakes)."""
    problems: dict[str, Dropped] = {}
    owners: dict[str, set[str]] = {}
    for i in edges:
        try:
            edge_tls_name(i.service_id)
        except discovery.InvalidInstance as exc:
            problems[i.service_id] = Dropped("edges", i.service_id, "no_tls_name", str(exc))
            continue
        for port in _ports(i):
            owners.setdefault(discovery.host_port(i.address, port), set()).add(i.service_id)
    for address, ids in owners.items():
        if len(ids) > 1:
            for sid in ids:
                problems.setdefault(sid, Dropped(
                    "edges", sid, "duplicate_address",
                    f"{address} is claimed by {len(ids)} entries: {sorted(ids)[:4]}"))
    return problems


def _ports(i: Instance) -> list[int]:
    """An edge's HTTP and gRPC ports (the addresses nginx may dial it at)."""
    return sorted({p for p in (i.port, i.grpc_port) if p})


def _tls_map(edges: list[Instance]) -> str:
    """``$tiered_edge_tls_name``: the name nginx checks the certificate of the edge it is
    connecting to against. ``$upstream_addr`` holds the peers tried so far for this request,
    comma separated, the one being connected to last; one anchored regex per rendered
    ip:port (HTTP and gRPC) gives that node's name. ``volatile``: evaluated again for each
    try, so a retry on the next edge checks that edge's name, not the first one's."""
    lines = ["map $upstream_addr $tiered_edge_tls_name {", "    volatile;",
             f"    default {UNMAPPED_TLS_NAME};"]
    for i in edges:
        name = edge_tls_name(i.service_id)
        for port in _ports(i):
            pattern = re.sub(r"([.\[\]])", r"\\\1", _target(i.address, port))
            lines.append(f'    "~(?:^|, ){pattern}$" {name};')
    return "\n".join([*lines, "}"]) + "\n"


def upstreams(fleet: Fleet) -> str:
    """The upstream blocks and the region map: a region's pool is its edges, the rest backup.
    A site's entry (``fleet.region`` set) sends requests without a region hint to its own
    region's edges, and fails over only to the nearest other region's (``_nearest_other``).
    Only instances whose values pass discovery's checks are written, each from checked parts,
    addresses as IP literals only. With ``fleet.edge_tls``, also the map from each edge's
    address to its own TLS name, and only edges that have one unambiguously
    (``edge_tls_problems``)."""
    edges, centers = _renderable(fleet.edges), _renderable(fleet.centers)
    registries = _renderable(fleet.registries)
    if fleet.edge_tls:
        problems = edge_tls_problems(edges)
        edges = [i for i in edges if i.service_id not in problems]
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
    if fleet.edge_tls:
        parts.append(_tls_map(edges))
    parts.append(_upstream("tiered_centers", _servers(centers)))
    metrics = [f"server {_target(i.address, i.metrics_port)};" for i in registries
               if i.metrics_port and i.passing]
    parts.append(_upstream("tiered_registry_metrics", metrics or [NOWHERE], balance=""))
    return "\n".join(parts)


def _upstream(name: str, servers: list[str], balance: str = "least_conn;") -> str:
    body = "\n".join(f"    {line}" for line in [balance, *servers, "keepalive 16;"] if line)
    return f"upstream {name} {{\n{body}\n}}\n"


GRPC_UNIMPLEMENTED = ("only inference.GRPCInferenceService and grpc.health.v1.Health are "
                      "served here")
GRPC_SERVER = """
    # gRPC V2 (HTTP/2) to the edges' gRPC ports, same pools and X-Tiered-Region hint as /v2/.
    # Only the inference service and gRPC health pass; anything else (reflection included) is
    # answered here, in gRPC's own shape: HTTP 200, grpc-status in the headers
    server {
        listen @GRPC_LISTEN@ http2;
        default_type application/grpc;
        error_page 413 = @grpc_too_large;
        error_page 429 = @grpc_rate_limited;
        error_page 502 503 504 = @grpc_unavailable;
        location /inference.GRPCInferenceService/ {
            @GRPC_ROUTE@
        }
        location /grpc.health.v1.Health/ {
            @GRPC_ROUTE@
        }
        location / {
            add_header grpc-status 12 always;  # UNIMPLEMENTED
            add_header grpc-message "@UNIMPLEMENTED@" always;
            return 200 "";
        }
        location @grpc_too_large {
            add_header grpc-status 8 always;  # RESOURCE_EXHAUSTED
            add_header grpc-message "message larger than @MAX_BODY@" always;
            return 200 "";
        }
        location @grpc_rate_limited {
            add_header grpc-status 8 always;
            add_header grpc-message "too many requests from this client; retry after 1 s" always;
            return 200 "";
        }
        location @grpc_unavailable {
            add_header grpc-status 14 always;  # UNAVAILABLE
            add_header grpc-message "no healthy node could answer; retry shortly" always;
            return 200 "";
        }
    }
"""
GRPC_ROUTE = """limit_req zone=per_client burst=@BURST@ nodelay;
            grpc_next_upstream error timeout non_idempotent;
            grpc_next_upstream_tries 0;  # each server at most once
            grpc_next_upstream_timeout 15s;
            grpc_read_timeout 30s;
            grpc_send_timeout 30s;
            grpc_set_header X-Request-ID $tiered_request_id;
            @GRPC_PASS@"""

CENTER_LOCATION = """
        # the escalation API, for clients that want full precision (--expose-center; over
        # HTTPS, the center's certificate checked against the fleet CA, with --center-ca)
        location /center/v2/ {
            limit_req zone=center_per_client burst=@CENTER_BURST@ nodelay;
            proxy_next_upstream error timeout http_502 http_503 non_idempotent;
            proxy_next_upstream_tries 0;  # each server at most once
            proxy_next_upstream_timeout 15s;
            @CENTER_PASS@
        }
"""
METRICS_LOCATION = """
        # the registry's metrics (--expose-registry-metrics): a scrape costs the registry
        # most of a second, so one per second per client and two per second in all
        location = /registry/metrics {
            limit_req zone=metrics_per_client burst=2 nodelay;
            limit_req zone=metrics_all burst=4 nodelay;
            proxy_pass http://tiered_registry_metrics/metrics;
        }
"""


SAFE_PATH = re.compile(r"/[A-Za-z0-9._/-]+")  # what a file path in the config may hold


def _safe_path(path: Path, what: str) -> str:
    resolved = str(path.resolve())
    if not SAFE_PATH.fullmatch(resolved):
        raise ValueError(f"{what} path {resolved[:80]!r}: only letters, digits and ._/- "
                         f"allowed")
    return resolved


def center_pass(center_ca: Path | None) -> str:
    """How /center/v2/ reaches the centers: plain HTTP, or HTTPS verified against the fleet
    CA with the center role's TLS name (only a center's certificate answers to it)."""
    if center_ca is None:
        return "proxy_pass http://tiered_centers/v2/;"
    ca = _safe_path(center_ca, "center CA")
    return (f"proxy_pass https://tiered_centers/v2/;\n"
            f"            proxy_ssl_trusted_certificate {ca};\n"
            f"            proxy_ssl_verify on;\n"
            f"            proxy_ssl_name {discovery.CENTER_TLS_NAME};\n"
            f"            proxy_ssl_server_name on;")


def edge_pass(edge_ca: Path | None, grpc: bool = False) -> str:
    """How /v2/ (``grpc``: the gRPC entry) reaches the edges: plain, or over TLS verified
    against the fleet CA with the name of the very node whose address nginx dials
    (``$tiered_edge_tls_name``, ``_tls_map``): an edge's catalog entry moved to another
    address meets a certificate for another node there, and the handshake fails before a
    byte of the request is sent."""
    scheme, directive = ("grpc", "grpc") if grpc else ("http", "proxy")
    pool = "$tiered_edge_grpc_pool" if grpc else "$tiered_edge_pool"
    if edge_ca is None:
        return f"{directive}_pass {scheme}://{pool};"
    ca = _safe_path(edge_ca, "edge CA")
    return "\n            ".join([
        f"{directive}_pass {scheme}s://{pool};",
        f"{directive}_ssl_trusted_certificate {ca};",
        f"{directive}_ssl_verify on;",
        f"{directive}_ssl_verify_depth 2;",
        f"{directive}_ssl_name $tiered_edge_tls_name;",
        f"{directive}_ssl_server_name on;",
        f"{directive}_ssl_session_reuse on;"])


@dataclass(frozen=True)
class Entry:
    """What nginx's entry serves besides /v2/ (and the gRPC entry): both off by default."""
    grpc_listen: str | None = None
    center_ca: Path | None = None
    edge_ca: Path | None = None
    expose_center: bool = False
    expose_registry_metrics: bool = False
    center_rate: int = 20
    center_burst: int = 40


def config(prefix: Path, listen: str, rate: int, burst: int, max_body: str,
           temp: Path | None = None, entry: Entry | None = None) -> str:
    entry = entry or Entry()
    text = TEMPLATE.read_text()
    temp = temp or prefix / "tmp"
    user = ""
    if os.geteuid() == 0:  # workers drop to nobody; say so, temp_dir gives them their folder
        nobody = pwd.getpwnam("nobody")
        user = f"user nobody {grp.getgrgid(nobody.pw_gid).gr_name};\n"
    grpc = ""
    if entry.grpc_listen:
        route = GRPC_ROUTE.replace("@GRPC_PASS@", edge_pass(entry.edge_ca, grpc=True))
        grpc = (GRPC_SERVER.replace("@GRPC_LISTEN@", entry.grpc_listen)
                .replace("@GRPC_ROUTE@", route).replace("@UNIMPLEMENTED@", GRPC_UNIMPLEMENTED))
    center = (CENTER_LOCATION.replace("@CENTER_PASS@", center_pass(entry.center_ca))
              if entry.expose_center else "")
    served = "inference is under /v2/" + (", the center under /center/v2/"
                                          if entry.expose_center else "")
    for key, value in {"@GRPC_SERVER@": grpc, "@CENTER_LOCATION@": center,
                       "@METRICS_LOCATION@": METRICS_LOCATION if entry.expose_registry_metrics
                       else "",
                       "@EDGE_PASS@": edge_pass(entry.edge_ca),
                       "@SERVED@": served,
                       "@PREFIX@": str(prefix.resolve()), "@TEMP@": str(temp.resolve()),
                       "@USER@": user,
                       "@LISTEN@": listen,
                       "@CENTER_RATE@": str(entry.center_rate),
                       "@CENTER_BURST@": str(entry.center_burst),
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
    """The one nginx this renderer owns: its config checked and swapped in, its process
    started, reloaded and stopped, the entries it left out counted.

    Why one class: every method acts on the same nginx (its prefix, binary, child process and
    the upstreams file it runs with); the check before a swap, the reload after it and the
    metric of what was dropped must agree on which file nginx is running, so they share it
    here rather than pass it between functions."""

    def __init__(self, prefix: Path, nginx: str, run_nginx: bool, region: str | None = None,
                 fallback: tuple[str, ...] = (), edge_tls: bool = False) -> None:
        self.prefix, self.nginx, self.run_nginx = prefix, nginx, run_nginx
        self.fleet = Fleet(region=region, fallback=fallback, edge_tls=edge_tls)
        self.child: subprocess.Popen[bytes] | None = None
        self.reloads = 0
        self.dropped: dict[tuple[str, str], Dropped] = {}
        self.known: dict[str, tuple[str, float]] = {}  # host name -> last address, when
        self._rendering = asyncio.Lock()

    @property
    def conf(self) -> Path:
        return self.prefix / "nginx.conf"

    @property
    def upstreams_conf(self) -> Path:
        return self.prefix / "upstreams.conf"

    async def render(self) -> None:
        """Resolve the fleet's host names, render, check with ``nginx -t``, swap, reload: one
        render at a time (three watches call this)."""
        async with self._rendering:
            fleet, unresolved = await resolved(self.fleet, self.known)
            text, failing = await asyncio.to_thread(self.checked, fleet)
            self._note_dropped([*unresolved, *failing, *self._tls_dropped(fleet)])
            if text is None or not write_atomically(self.upstreams_conf, text):
                return
            log.info("upstreams: edges %s, centers %s", [i.target for i in fleet.edges],
                     [i.target for i in fleet.centers])
            await asyncio.to_thread(self.reload)

    def _tls_dropped(self, fleet: Fleet) -> list[Dropped]:
        if not fleet.edge_tls:
            return []
        return list(edge_tls_problems(_renderable(fleet.edges)).values())

    def checked(self, fleet: Fleet, render: Callable[[Fleet], str] = upstreams,
                ) -> tuple[str | None, list[Dropped]]:
        """The upstreams text for ``fleet`` that passes ``nginx -t`` with this nginx.conf, and
        the entries left out to get there: none when the whole fleet passes; else, starting
        from no entries at all, each entry is put back only if nginx -t still passes with it
        (at most MAX_CHECKS runs). None when not even the empty fleet passes: the working
        file stays, nginx keeps its upstreams."""
        text = render(fleet)
        if self.upstreams_conf.is_file() and self.upstreams_conf.read_text() == text:
            return text, []  # what nginx already runs with
        problem = self.nginx_check(text)
        if problem is None:
            return text, []
        CHECK_FAILURES.inc()
        log.error("the rendered upstreams fail nginx -t (%s); looking for the entries to "
                  "leave out", problem[-300:])
        every = [(role, i.service_id) for role in ROLES for i in getattr(fleet, role)]
        left_out = set(every)  # an entry goes back in only if nginx -t still passes with it
        if self.nginx_check(render(fleet.without(left_out))) is None:
            for key in every[:MAX_CHECKS - 2]:
                trial = render(fleet.without(left_out - {key}))
                if self.nginx_check(trial) is None:
                    left_out.discard(key)
            return render(fleet.without(left_out)), [
                Dropped(role, sid, "fails_nginx_check", "nginx -t fails with it (or it was "
                        f"past the {MAX_CHECKS} checks a render may run)")
                for role, sid in every if (role, sid) in left_out]
        log.error("no upstreams.conf that passes nginx -t was found; keeping the working one")
        return None, []

    def nginx_check(self, upstreams_text: str) -> str | None:
        """``nginx -t`` of nginx.conf with ``upstreams_text`` in place of upstreams.conf
        (copies in a temporary folder under the prefix; nothing nginx runs with is touched):
        None if it passes, else nginx's complaint."""
        conf = self.conf.read_text()
        include = f"include {self.upstreams_conf.resolve()};"
        with tempfile.TemporaryDirectory(dir=self.prefix, prefix=".check-") as folder:
            candidate = Path(folder) / "upstreams.conf"
            candidate.write_text(upstreams_text)
            checked = Path(folder) / "nginx.conf"
            checked.write_text(conf.replace(include, f"include {candidate.resolve()};"))
            return self.test_config(checked)

    def test_config(self, conf: Path | None = None) -> str | None:
        run = subprocess.run([self.nginx, "-t", "-q", "-p", str(self.prefix), "-c",
                              str(conf or self.conf)], capture_output=True, text=True,
                             env=NGINX_ENV, timeout=30)
        return None if run.returncode == 0 else (run.stderr.strip() or f"exit {run.returncode}")

    def _note_dropped(self, dropped: list[Dropped]) -> None:
        now = {(d.role, d.service_id): d for d in dropped}
        for key, d in now.items():
            if key not in self.dropped:
                DROPS.labels(d.role, d.reason).inc()
                log.warning("not rendering %s %r (%s): %s", d.role, d.service_id[:80],
                            d.reason, d.detail)
        for key in self.dropped.keys() - now.keys():
            log.info("rendering %s %r again", *key)
        self.dropped = now
        for role in ROLES:
            for reason in REASONS:
                DROPPED.labels(role, reason).set(
                    sum(1 for d in dropped if d.role == role and d.reason == reason))

    def reload(self) -> None:
        """SIGHUP to the nginx master: new workers take the new upstreams, old ones finish."""
        pid = self.child.pid if self.child else _pid(self.prefix / "nginx.pid")
        if pid is None:
            return
        problem = self.test_config()
        if problem is not None:
            log.error("not reloading nginx, the config does not pass nginx -t: %s", problem)
            return
        os.kill(pid, signal.SIGHUP)
        self.reloads += 1
        RELOADS.inc()

    def start_nginx(self) -> None:
        """Run nginx, with ``NGINX_ENV`` as its whole environment, once its config passes
        ``nginx -t`` (RuntimeError otherwise: it would not serve)."""
        problem = self.test_config()
        if problem is not None:
            raise RuntimeError(f"not starting nginx, its config fails nginx -t: {problem}")
        self.child = subprocess.Popen([self.nginx, "-p", str(self.prefix), "-c",
                                       str(self.conf)], env=NGINX_ENV)
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
        async def changed(instances: list[Instance]) -> None:
            setattr(self.fleet, role, instances)
            # the watch goes on after a failed render (an exception here would end it, and the
            # entry would keep this role's list for good)
            await self.render_or_log(f"a change of {role}")

        return changed

    async def render_or_log(self, after: str) -> None:
        """``render``, a failure logged: the next change or re-resolve renders again."""
        try:
            await self.render()
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            log.warning("rendering after %s failed: %s", after, exc)


async def resolved(fleet: Fleet, known: dict[str, tuple[str, float]] | None = None,
                   ) -> tuple[Fleet, list[Dropped]]:
    """``fleet`` with every host name replaced by the first address it resolves to (off the
    event loop, each within RESOLVE_TIMEOUT_S), and the entries whose name did not resolve
    (left out). nginx is only ever given IP literals: a name it cannot resolve would fail
    ``nginx -t`` and freeze every later reload. ``known``: each name's last answer and when
    (updated here); a name that fails to resolve within KEEP_RESOLVED_S of its last answer
    keeps that address (a resolver too slow for a moment on a busy host must not take a
    passing edge out of every pool; a stale address only costs nginx's next try). The lists
    are read once, before the first await: a watch may put new ones in while names resolve."""
    fleet = dataclasses.replace(fleet)  # the lists as they are now (a watch replaces, never edits)
    names = {i.address for role in ROLES for i in getattr(fleet, role) if not _is_ip(i.address)}
    answers = await asyncio.gather(*(_resolve(n) for n in names))
    found = dict(zip(names, answers, strict=True))
    now, known = time.monotonic(), {} if known is None else known  # {}: no memory kept
    for name, answer in found.items():
        if isinstance(answer, str):
            known[name] = (answer, now)
        elif name in known and now - known[name][1] < KEEP_RESOLVED_S:
            found[name] = known[name][0]
    dropped: list[Dropped] = []
    fields: dict[str, list[Instance]] = {}
    for role in ROLES:
        kept = []
        for i in getattr(fleet, role):
            if _is_ip(i.address):
                kept.append(i)
            elif isinstance(found[i.address], str):
                kept.append(dataclasses.replace(i, address=str(found[i.address])))
            else:
                dropped.append(Dropped(role, i.service_id, "unresolvable",
                                       f"{i.address[:80]!r}: {found[i.address]}"))
        fields[role] = kept
    return dataclasses.replace(fleet, edges=fields["edges"], centers=fields["centers"],
                               registries=fields["registries"]), dropped


def _is_ip(address: str) -> bool:
    try:
        ipaddress.ip_address(address)
    except ValueError:
        return False
    return True


async def _resolve(name: str) -> str | Exception:
    """The first address ``name`` resolves to, or why not (an exception, returned)."""
    try:
        discovery.checked_address(name)
        answers = await asyncio.wait_for(asyncio.get_running_loop().getaddrinfo(
            name, None, type=socket.SOCK_STREAM), RESOLVE_TIMEOUT_S)
        return str(ipaddress.ip_address(answers[0][4][0]))
    except TimeoutError:
        return TimeoutError(f"no answer within {RESOLVE_TIMEOUT_S} s")
    except (OSError, ValueError, IndexError, discovery.InvalidInstance) as exc:
        return exc


def _pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


async def serve(renderer: Renderer, consul_addr: str | None, token: str | None,
                registries: bool = True) -> None:
    """Follow the fleet in Consul until a signal. ``registries``: also the registry (only
    for /registry/metrics: otherwise a registry failover would reload nginx, and a reload
    resets the keep-alive connections clients are about to reuse)."""
    tasks = []
    client = discovery.client(consul_addr, token) if consul_addr else None
    if client is not None:
        followed = [("edges", "edge"), ("centers", "center")]
        for role, service in followed + ([("registries", "registry")] if registries else []):
            watch = discovery.Watch(client, discovery.SERVICES[service], renderer.follow(role),
                                    passing_only=False)
            tasks.append(asyncio.create_task(watch.run()))
        tasks.append(asyncio.create_task(reresolve(renderer)))
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    if renderer.child is not None:
        tasks.append(asyncio.create_task(_exit_with(renderer.child, stopping)))

    def check(task: asyncio.Task[None]) -> None:
        # a watch that ends leaves nginx on that role's last list for good: stop instead, and
        # exit non-zero, so that the supervisor (Swarm, systemd, `tiered up`) restarts it
        if not task.cancelled() and task.exception() is not None:
            log.error("a watch of the fleet ended: %r; stopping", task.exception())
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
        raise click.ClickException(f"a watch of the fleet ended: {ended[0]!r}")


async def reresolve(renderer: Renderer, every: float = RERESOLVE_S) -> None:
    """Render again every ``every`` seconds while the catalog names hosts: a name can move or
    appear without the catalog changing (a Swarm task rescheduled to another node keeps its
    service name; a task's name resolves only once Docker finds it healthy, which may be after
    Consul's check passed), and nginx holds only the addresses. Nothing is reloaded when the
    answers are the same."""
    while True:
        await asyncio.sleep(every)
        if renderer.fleet.names_hosts():
            await renderer.render_or_log("resolving the names again")


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
                                 "(<node id>.edge.tiered.invalid). Unset: plain HTTP.")
@click.option("--center-ca", type=click.Path(path_type=Path, dir_okay=False, exists=True),
              default=None, help="Fleet CA (PEM): /center/v2/ goes to the centers over HTTPS, "
                                 "their center certificate checked against it.")
@click.option("--expose-center", is_flag=True,
              help="Serve /center/v2/ (the centers' escalation API, full precision; off: 404). "
                   "Clients through it bypass the edges' escalation budgets: limited per "
                   "client by --center-rate.")
@click.option("--center-rate", default=20, show_default=True,
              help="With --expose-center: /center/v2/ requests per second per client (burst "
                   "twice that).")
@click.option("--expose-registry-metrics", is_flag=True,
              help="Serve the registry's Prometheus metrics at /registry/metrics (off: 404); "
                   "1 request/s per client and 2/s in all.")
@click.option("--metrics-listen", default=None,
              help="host:port for the renderer's own Prometheus metrics (entries left out of "
                   "upstreams.conf and why, nginx -t failures, reloads); unset = none.")
@click.option("--rate", default=500, show_default=True, help="Requests per second per client.")
@click.option("--burst", default=1000, show_default=True, help="Burst above --rate per client.")
@click.option("--max-body", default="1m", show_default=True, help="client_max_body_size.")
def main(prefix: Path, listen: str, grpc_listen: str | None, consul_addr: str | None,
         consul_token_file: Path | None, nginx_bin: str | None, run_nginx: bool,
         region: str | None, fallback_regions: tuple[str, ...], edge_ca: Path | None,
         center_ca: Path | None, expose_center: bool, center_rate: int,
         expose_registry_metrics: bool, metrics_listen: str | None, rate: int, burst: int,
         max_body: str) -> None:
    """Render nginx's config from the template and keep its upstreams in step with Consul.

    nginx is only given IP literals (host names in the catalog are resolved here, or left
    out), and an upstreams.conf that fails nginx -t never replaces a working one."""
    configure("nginx-render", "INFO", None, 10 * 1024 * 1024, 3)
    nginx = nginx_bin or shutil.which("nginx") or "/usr/sbin/nginx"
    for sub in ("tmp", "logs"):
        (prefix / sub).mkdir(parents=True, exist_ok=True)
    temp = temp_dir(prefix)
    renderer = Renderer(prefix, nginx, run_nginx, region, fallback_regions,
                        edge_tls=edge_ca is not None)
    entry = Entry(grpc_listen, center_ca, edge_ca, expose_center, expose_registry_metrics,
                  center_rate, 2 * center_rate)
    try:
        conf = config(prefix, listen, rate, burst, max_body, temp, entry)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--center-ca/--edge-ca") from exc
    if metrics_listen:
        host, _, port = metrics_listen.rpartition(":")
        prometheus_client.start_http_server(int(port), host.strip("[]") or "127.0.0.1")
    write_atomically(renderer.conf, conf)
    write_atomically(renderer.upstreams_conf, upstreams(renderer.fleet))
    try:
        if run_nginx:
            try:
                renderer.start_nginx()
            except RuntimeError as exc:
                raise click.ClickException(str(exc)) from exc
        uvloop.run(serve(renderer, consul_addr, consul_token(consul_token_file),
                         registries=expose_registry_metrics))
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
