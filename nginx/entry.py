"""The entry nginx's ``nginx.conf`` (the one clients talk to), from ``nginx.conf.template``:
/v2/ and the gRPC entry to the edges; /center/v2/ and /registry/metrics, when exposed, behind
their rate limits to the side nginx (``nginx/side.py``) over a unix socket. Nothing in it
depends on the centers or the registry: their catalog changes never reload this nginx."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .process import worker_user

TEMPLATE = Path(__file__).with_name("nginx.conf.template")
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
            grpc_next_upstream_tries 2;  # as /v2/: one other edge, never a third
            grpc_next_upstream_timeout 15s;
            grpc_read_timeout 30s;
            grpc_send_timeout 30s;
            grpc_set_header X-Request-ID $tiered_request_id;
            @GRPC_PASS@"""

SIDE_UPSTREAM = """
    # /center/v2/ and /registry/metrics go on to the side nginx (nginx/side.py), which follows
    # the centers and the registry and is the one reloaded when they change
    upstream tiered_side {
        server unix:@SOCKET@;
        keepalive 16;
    }
"""
# A side reload closes the keep-alive connections it holds idle: a request sent on one as it
# closes fails, and nginx sends it again on a new connection (a failure on a cached connection
# costs no try; with one server, that is the only retry there is)
SIDE_PASS = """proxy_pass http://tiered_side;
            proxy_next_upstream error non_idempotent;
            proxy_read_timeout 60s;  # the side bounds its own wait on the centers"""
CENTER_LOCATION = """
        # the escalation API, for clients that want full precision (--expose-center): on to
        # the centers through the side nginx (over HTTPS from there, with --center-ca)
        location /center/v2/ {
            limit_req zone=center_per_client burst=@CENTER_BURST@ nodelay;
            @SIDE_PASS@
        }
"""
METRICS_LOCATION = """
        # the registry's metrics (--expose-registry-metrics): a scrape costs the registry
        # most of a second, so one per second per client and two per second in all
        location = /registry/metrics {
            limit_req zone=metrics_per_client burst=2 nodelay;
            limit_req zone=metrics_all burst=4 nodelay;
            @SIDE_PASS@
        }
"""
CONSOLE_LOCATION = """
        # the fleet console (--console): read-only, and it asks for the operator credential
        # itself; nginx only passes /console/ on to it, rate-limited like inference
        location /console/ {
            limit_req zone=per_client burst=@BURST@ nodelay;
            proxy_pass http://@CONSOLE@;
            proxy_next_upstream off;
        }
"""
CONSOLE_ADDRESS = re.compile(r"(?:\d{1,3}(?:\.\d{1,3}){3}|\[[0-9a-fA-F:]+\]|localhost)"
                             r":\d{1,5}")
SAFE_PATH = re.compile(r"/[A-Za-z0-9._/-]+")  # what a file path in the config may hold


def safe_path(path: Path, what: str) -> str:
    resolved = str(path.resolve())
    if not SAFE_PATH.fullmatch(resolved):
        raise ValueError(f"{what} path {resolved[:80]!r}: only letters, digits and ._/- "
                         f"allowed")
    return resolved


@dataclass(frozen=True)
class Entry:
    """What the entry serves besides /v2/ (and the gRPC entry): the center and the registry's
    metrics are off by default; when either is on, ``side_socket`` is where the side nginx
    listens."""
    grpc_listen: str | None = None
    center_ca: Path | None = None
    edge_ca: Path | None = None
    expose_center: bool = False
    expose_registry_metrics: bool = False
    center_rate: int = 20
    center_burst: int = 40
    side_socket: Path | None = None
    console: str | None = None  # host:port of ``tiered console``; None: no /console/

    @property
    def side_roles(self) -> tuple[str, ...]:
        """The roles of the fleet the side nginx follows (none: no side nginx)."""
        return (("centers",) if self.expose_center else ()) + (
            ("registries",) if self.expose_registry_metrics else ())


def edge_pass(edge_ca: Path | None, grpc: bool = False) -> str:
    """How /v2/ (``grpc``: the gRPC entry) reaches the edges: plain, or over TLS verified
    against the fleet CA with the name of the very node whose address nginx dials
    (``$tiered_edge_tls_name``, ``upstreams._tls_map``): an edge's catalog entry moved to
    another address meets a certificate for another node there, and the handshake fails
    before a byte of the request is sent."""
    scheme, directive = ("grpc", "grpc") if grpc else ("http", "proxy")
    pool = "$tiered_edge_grpc_pool" if grpc else "$tiered_edge_pool"
    if edge_ca is None:
        return f"{directive}_pass {scheme}://{pool};"
    ca = safe_path(edge_ca, "edge CA")
    return "\n            ".join([
        f"{directive}_pass {scheme}s://{pool};",
        f"{directive}_ssl_trusted_certificate {ca};",
        f"{directive}_ssl_verify on;",
        f"{directive}_ssl_verify_depth 2;",
        f"{directive}_ssl_name $tiered_edge_tls_name;",
        f"{directive}_ssl_server_name on;",
        f"{directive}_ssl_session_reuse on;"])


def _side_parts(entry: Entry) -> dict[str, str]:
    """The side upstream and the locations passed to it; ValueError without a socket."""
    if not entry.side_roles:
        return {"@SIDE_UPSTREAM@": "", "@CENTER_LOCATION@": "", "@METRICS_LOCATION@": ""}
    if entry.side_socket is None:
        raise ValueError("the center or the registry's metrics are exposed: the side nginx's "
                         "socket is needed")
    return {"@SIDE_UPSTREAM@": SIDE_UPSTREAM.replace(
                "@SOCKET@", safe_path(entry.side_socket, "side socket")),
            "@CENTER_LOCATION@": CENTER_LOCATION if entry.expose_center else "",
            "@METRICS_LOCATION@": METRICS_LOCATION if entry.expose_registry_metrics else ""}


def console_location(address: str | None) -> str:
    """The /console/ location passing to ``address`` (an IP literal or localhost with a
    port), or nothing; ValueError for anything else (it is written into nginx.conf)."""
    if address is None:
        return ""
    if not CONSOLE_ADDRESS.fullmatch(address):
        raise ValueError(f"console address {address[:80]!r}: an IP address (or localhost) "
                         f"and a port")
    return CONSOLE_LOCATION.replace("@CONSOLE@", address)


def config(prefix: Path, listen: str, rate: int, burst: int, max_body: str,
           temp: Path | None = None, entry: Entry | None = None) -> str:
    entry = entry or Entry()
    text = TEMPLATE.read_text()
    temp = temp or prefix / "tmp"
    grpc = ""
    if entry.grpc_listen:
        route = GRPC_ROUTE.replace("@GRPC_PASS@", edge_pass(entry.edge_ca, grpc=True))
        grpc = (GRPC_SERVER.replace("@GRPC_LISTEN@", entry.grpc_listen)
                .replace("@GRPC_ROUTE@", route).replace("@UNIMPLEMENTED@", GRPC_UNIMPLEMENTED))
    served = "inference is under /v2/" + (", the center under /center/v2/"
                                          if entry.expose_center else "")
    for key, value in {"@GRPC_SERVER@": grpc, **_side_parts(entry),
                       "@CONSOLE_LOCATION@": console_location(entry.console),
                       "@SIDE_PASS@": SIDE_PASS,
                       "@EDGE_PASS@": edge_pass(entry.edge_ca),
                       "@SERVED@": served,
                       "@PREFIX@": str(prefix.resolve()), "@TEMP@": str(temp.resolve()),
                       "@USER@": worker_user(),
                       "@LISTEN@": listen,
                       "@CENTER_RATE@": str(entry.center_rate),
                       "@CENTER_BURST@": str(entry.center_burst),
                       "@RATE@": str(rate), "@BURST@": str(burst), "@MAX_BODY@": max_body}.items():
        text = text.replace(key, value)
    return text
