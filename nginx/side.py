"""The side nginx: the second nginx the renderer runs when the entry exposes the center
(``--expose-center``) or the registry's metrics (``--expose-registry-metrics``). It listens on
a unix socket only the workers reach, its upstreams are the centers and the registry's metrics
port, and it is the one reloaded when those change in Consul (a health flap, a restart, a
failover to another address).

Why a second nginx: nginx OSS takes new upstreams only by a reload, and a reload closes the
idle keep-alive connections clients hold, failing a request a client sends on one at that
moment. Clients hold theirs to the entry, whose config now depends on the edges alone; the
only connections a side reload closes are the entry's own to the socket, and the entry sends
a request that failed on one of those again (``entry.SIDE_PASS``)."""

from __future__ import annotations

from pathlib import Path

from serving.fleet import discovery

from .entry import Entry, safe_path
from .fleet import Fleet
from .process import worker_user, workers_folder
from .upstreams import NOWHERE, block, renderable, servers, target

TEMPLATE = Path(__file__).with_name("side.conf.template")
CENTER_LOCATION = """
        # the entry's /center/v2/, rate limited there; as the entry's /v2/, a request cut by a
        # dying center is sent to one other center, never a third
        location /center/v2/ {
            proxy_next_upstream error timeout http_502 http_503 non_idempotent;
            proxy_next_upstream_tries 2;
            proxy_next_upstream_timeout 15s;
            @CENTER_PASS@
        }
"""
METRICS_LOCATION = """
        # the entry's /registry/metrics, rate limited there
        location = /registry/metrics {
            proxy_pass http://tiered_registry_metrics/metrics;
        }
"""


def folder() -> Path:
    """The side's own folder, in the system's temp dir (a unix socket's path must fit in 107
    bytes; a prefix may be longer): its socket and its workers' temp files. 0700 and owned by
    the workers' user, so only they (and root) can reach the socket: it is behind none of the
    entry's rate limits."""
    return workers_folder("side")


def socket_path(side_folder: Path) -> Path:
    return side_folder / "side.sock"


def center_pass(center_ca: Path | None) -> str:
    """How /center/v2/ reaches the centers: plain HTTP, or HTTPS verified against the fleet
    CA with the center role's TLS name (only a center's certificate answers to it)."""
    if center_ca is None:
        return "proxy_pass http://tiered_centers/v2/;"
    ca = safe_path(center_ca, "center CA")
    return (f"proxy_pass https://tiered_centers/v2/;\n"
            f"            proxy_ssl_trusted_certificate {ca};\n"
            f"            proxy_ssl_verify on;\n"
            f"            proxy_ssl_name {discovery.CENTER_TLS_NAME};\n"
            f"            proxy_ssl_server_name on;")


def config(prefix: Path, side_folder: Path, max_body: str, entry: Entry) -> str:
    """The side's nginx.conf under ``prefix``: the routes ``entry`` exposes, on its socket in
    ``side_folder`` (its temp files there too)."""
    center = (CENTER_LOCATION.replace("@CENTER_PASS@", center_pass(entry.center_ca))
              if entry.expose_center else "")
    text = TEMPLATE.read_text()
    for key, value in {"@CENTER_LOCATION@": center,
                       "@METRICS_LOCATION@": METRICS_LOCATION if entry.expose_registry_metrics
                       else "",
                       "@SOCKET@": safe_path(socket_path(side_folder), "side socket"),
                       "@TEMP@": safe_path(side_folder, "side folder"),
                       "@PREFIX@": str(prefix.resolve()), "@USER@": worker_user(),
                       "@MAX_BODY@": max_body}.items():
        text = text.replace(key, value)
    return text


def upstreams(fleet: Fleet) -> str:
    """The side's upstream blocks: the centers (passing first, failing ones as a last-resort
    backup, as the edges in the entry) and the passing registries' metrics ports, from
    checked parts only."""
    centers, registries = renderable(fleet.centers), renderable(fleet.registries)
    metrics = [f"server {target(i.address, i.metrics_port)};" for i in registries
               if i.metrics_port and i.passing]
    return "\n".join([
        "# written by nginx/render.py from Consul (the centers, the registries) for the side "
        "nginx\n",
        block("tiered_centers", servers(centers)),
        block("tiered_registry_metrics", metrics or [NOWHERE], balance="")])
