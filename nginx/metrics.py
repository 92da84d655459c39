"""The renderer's own Prometheus metrics (``--metrics-listen``): what its renders left out and
why, candidates nginx -t refused, and reloads, each of the entry or the side nginx."""

from __future__ import annotations

import prometheus_client

DROPPED = prometheus_client.Gauge(
    "tiered_nginx_render_dropped_entries",
    "Catalog entries the last render left out of upstreams.conf, by role and reason "
    "(unresolvable, fails_nginx_check, duplicate_address, no_tls_name; with --edge-ca also "
    "unverified: no TLS handshake has proven the node at its address yet, and "
    "wrong_identity: its address answered as another node)", ["role", "reason"])
DROPS = prometheus_client.Counter(
    "tiered_nginx_render_dropped", "Catalog entries newly left out of upstreams.conf",
    ["role", "reason"])
HELD = prometheus_client.Gauge(
    "tiered_nginx_render_held_edges",
    "With --edge-ca: edges still in upstreams.conf that the catalog no longer lists, because "
    "their address still answers as that node (departed: for a while after they left; last: "
    "beyond that, as the only edges left). Above 0: someone deregistered live edges, or they "
    "are shutting down", ["reason"])
CHECK_FAILURES = prometheus_client.Counter(
    "tiered_nginx_render_check_failures",
    "Candidate upstreams.conf files that failed nginx -t (the working one was kept), by nginx "
    "(entry: the client-facing one, side: the one reaching the centers and the registry)",
    ["nginx"])
RELOADS = prometheus_client.Counter(
    "tiered_nginx_render_reloads",
    "nginx reloads after a changed upstreams.conf, by nginx (entry: the client-facing one, "
    "whose reloads close idle client connections; side: the one reaching the centers and the "
    "registry)", ["nginx"])
