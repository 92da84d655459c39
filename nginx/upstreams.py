"""The entry nginx's ``upstreams.conf``: the edges' pools (HTTP and gRPC), the region maps and,
over TLS, the map from each edge's address to its node's name. Its lines are built from
checked parts only (IP address objects, ints, checked regions and node ids), so nothing
registered in Consul can add a directive; ``server``, ``target`` and ``block`` build the side
nginx's lines too (``nginx/side.py``)."""

from __future__ import annotations

import ipaddress
import logging
import re

from serving.fleet import discovery
from serving.fleet.discovery import Instance

from .fleet import Dropped, Fleet

log = logging.getLogger("nginx.render")
skipped = discovery.Throttled(log)
NOWHERE = "server 127.0.0.1:9 down;  # none passing"
UNMAPPED_TLS_NAME = "unmapped.tiered.invalid"  # no certificate names it: the handshake fails


def servers(instances: list[Instance], backup: list[Instance] | None = None,
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
    lines = [f"server {target(i.address, port(i))} max_fails=0;" for i in live] or [NOWHERE]
    lines += [f"server {target(i.address, port(i))} max_fails=0 backup;" for i in spare]
    return lines


def target(address: str, port: object) -> str:
    """``ip:port`` for a ``server`` line, built from checked parts only (an IP address
    object's text, an int): even an Instance made without ``discovery.instance`` cannot put
    another character into the file. Host names are refused: nginx resolves them when it
    loads the config, and one that does not resolve fails ``nginx -t``, so every later
    reload (the renderer resolves them itself first: ``fleet.resolved``)."""
    checked = discovery.checked_address(address)
    try:
        ipaddress.ip_address(checked)
    except ValueError:
        raise discovery.InvalidInstance(
            f"address {checked[:80]!r} is a host name, not an IP literal") from None
    return discovery.host_port(checked, discovery.checked_port(port))


def block(name: str, lines: list[str], balance: str = "least_conn;") -> str:
    body = "\n".join(f"    {line}" for line in [balance, *lines, "keepalive 16;"] if line)
    return f"upstream {name} {{\n{body}\n}}\n"


def renderable(instances: list[Instance]) -> list[Instance]:
    """The instances every value of which the config uses passes the checks (Watch skipped
    the others already; this holds whatever filled the Fleet)."""
    kept = []
    for i in instances:
        try:
            target(i.address, i.port)
            discovery.checked_region(i.region)
            _ = i.metrics_port, i.grpc_port  # checked when present
        except discovery.InvalidInstance as exc:
            skipped.warning("not rendering %r: %s", str(i.service_id)[:80], exc)
            continue
        kept.append(i)
    return kept


def edge_tls_name(service_id: str) -> str:
    """The TLS name only this edge's own certificate answers to (``registry.trust.pki.node_name``
    for tier ``edge``: ``<node id>.edge.tiered.invalid``); in Consul an edge's service id is
    its node id. InvalidInstance for an id that cannot be a DNS label."""
    try:
        return discovery.node_tls_name(service_id, "edge")
    except ValueError as exc:
        raise discovery.InvalidInstance(
            f"service id {service_id[:64]!r} cannot name a node certificate") from exc


def edge_tls_problems(edges: list[Instance]) -> dict[str, Dropped]:
    """For nginx -> edge TLS: the edges that cannot be rendered, by service id. An edge
    whose id cannot name a certificate; and every edge of an address (ip:port, HTTP or gRPC)
    that two catalog entries claim: nginx picks the name it checks by the address it dials,
    so an address must stand for one node. Two entries for one address mean one of them
    lies (or is stale), and this cannot tell which: it renders neither (the name check would
    keep the wrong one from being answered by the other node anyway). The running renderer
    asks first (``nginx/guard.py``): only the entry whose address proved its node reaches
    this, so a decoy at an edge's address never takes the edge out with it."""
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
            pattern = re.sub(r"([.\[\]])", r"\\\1", target(i.address, port))
            lines.append(f'    "~(?:^|, ){pattern}$" {name};')
    return "\n".join([*lines, "}"]) + "\n"


def _nearest_other(edges: list[Instance], region: str,
                   fallback: tuple[str, ...]) -> list[Instance]:
    """The edges a site's entry fails over to when none of its own can answer: every edge
    of the nearest other region that has a passing one (``fallback`` order, then the other
    regions by name); if no other region has a passing edge, all other edges (the failing
    ones are tried last by ``servers`` anyway)."""
    others = [i for i in edges if i.region != region]
    named = sorted({i.region for i in others})
    order = [r for r in fallback if r in named] + [r for r in named if r not in fallback]
    for candidate in order:
        nearest = [i for i in others if i.region == candidate]
        if any(i.passing for i in nearest):
            return nearest
    return others


def upstreams(fleet: Fleet) -> str:
    """The entry's upstream blocks and region maps, from ``fleet.edges`` alone (the centers and
    the registry are the side nginx's): a region's pool is its edges, the rest backup. A
    site's entry (``fleet.region`` set) sends requests without a region hint to its own
    region's edges, and fails over only to the nearest other region's (``_nearest_other``).
    Only instances whose values pass discovery's checks are written, addresses as IP literals
    only. With ``fleet.edge_tls``, also the map from each edge's address to its own TLS name,
    and only edges that have one unambiguously (``edge_tls_problems``)."""
    edges = renderable(fleet.edges)
    if fleet.edge_tls:
        problems = edge_tls_problems(edges)
        edges = [i for i in edges if i.service_id not in problems]
    home = discovery.checked_region(fleet.region) if fleet.region else None
    regions = sorted({discovery.checked_region(i.region) for i in edges}
                     | ({home} if home else set()))
    parts = ["# written by nginx/render.py from Consul (the edges); rewritten on every change\n"]
    for suffix, grpc in (("", False), ("_grpc", True)):  # HTTP, and gRPC (meta grpc_port)
        parts.append(block(f"tiered_edges{suffix}", servers(edges, grpc=grpc)))
        pools = []
        for region in regions:
            local = [i for i in edges if i.region == region]
            others = ([i for i in edges if i not in local] if region != home
                      else _nearest_other(edges, region, fleet.fallback))
            # [a-z0-9_]: no two regions collide
            name = f"tiered_edges{suffix}_{region.replace('-', '_')}"
            parts.append(block(name, servers(local, others, grpc=grpc)))
            pools.append(f'    "{region}" {name};')
        default = (f"tiered_edges{suffix}_{home.replace('-', '_')}" if home
                   else f"tiered_edges{suffix}")
        parts.append(f"map $http_x_tiered_region $tiered_edge{suffix}_pool {{\n"
                     f"    default {default};\n"
                     + "".join(f"{p}\n" for p in pools) + "}\n")
    if fleet.edge_tls:
        parts.append(_tls_map(edges))
    return "\n".join(parts)
