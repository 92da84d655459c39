"""Where each child of ``tiered sites`` runs and how it is reached: every child on a host of a
``tiered.netns.Network``, at the fixed ports of its role on that host's own address.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from registry.store.role import read_state
from serving.fleet.discovery import SERVICES
from tiered.children import Child
from tiered.consul_cluster import CONSUL_HTTP
from tiered.monitoring.prometheus import Monitor
from tiered.monitoring.watched import Watched
from tiered.netns import Host, Network
from tiered.views import registry_database

CORE = "core"
REGISTRY_PORT, REGISTRY_METRICS = 50051, 9300
CENTER_PORT, CENTER_GRPC = 8100, 8101
EDGE_PORT, EDGE_GRPC = 8200, 8201
ENTRY_PORT, ENTRY_GRPC = 8080, 8081
MONITOR = "monitoring"  # the center site's host of Prometheus, Alertmanager, the renderer
PROMETHEUS_PORT, ALERTMANAGER_PORT = 9090, 9093


@dataclass
class SiteMap(Watched):
    """The sites' topology and each child's place on it: a child runs inside its host's
    namespace and registers with its site's Consul agent. Which registry is primary is read
    from each registry's own database."""

    network: Network = field(default_factory=Network)
    edge_sites: tuple[str, ...] = ("eu", "us")
    edges_per_site: int = 2
    servers: int = 3
    registry_extra: dict[str, str] = field(default_factory=dict)  # e.g. REGISTRY_CHUNK_BYTES
    placement: dict[str, Host] = field(default_factory=dict)  # child name -> its host
    without_consul: set[str] = field(default_factory=set)  # nodes given static addresses
    standbys: int = field(default=1, kw_only=True)  # registries beside the primary, each on
    # a host of its own (registry-2, ...): every registry runs --ha, one is elected primary;
    # 0: one standalone

    def host(self, name: str) -> Host:
        return self.network.hosts[name]

    @property
    def server_hosts(self) -> list[Host]:
        return [self.host(f"consul-{i}") for i in range(1, self.servers + 1)]

    @property
    def consul(self) -> str:
        """A live Consul server's HTTP address (the stack's own health polling uses it)."""
        for host in self.server_hosts:
            child = self.children.get(host.name)
            if child is not None and child.process.poll() is None:
                return f"{host.address}:{CONSUL_HTTP}"
        return f"{self.server_hosts[0].address}:{CONSUL_HTTP}"

    def agent_of(self, host: Host) -> str:
        """The Consul agent a host's services register with: its own (center site), or its
        site gateway's (edge sites: one client agent per site)."""
        if host.site == CORE:
            return f"127.0.0.1:{CONSUL_HTTP}"
        return f"{self.host(f'{host.site}-gw').address}:{CONSUL_HTTP}"

    @property
    def monitor(self) -> Monitor:
        """Prometheus and Alertmanager on the ``monitoring`` host, data under the root."""
        # scraped every 15 s, as in compose and Swarm: less load beside a dozen nodes (the
        # loopback stack's 5 s is for alerts within seconds on one machine)
        return Monitor(self.root, self.host(MONITOR).address, PROMETHEUS_PORT,
                       ALERTMANAGER_PORT, interval_s=15)

    def entry(self, site: str) -> str:
        return f"http://{self.host(f'{site}-gw').address}:{ENTRY_PORT}"

    def entries(self) -> list[str]:
        return [self.entry(site) for site in self.edge_sites]

    def edges(self, site: str) -> list[str]:
        return [f"edge-{site}-{i}" for i in range(1, self.edges_per_site + 1)]

    def node_url(self, name: str) -> str:
        """A center's or edge's own URL (centers serve HTTPS: check with ``verify``)."""
        host = self.placement[name]
        role = "center" if name.startswith("center") else "edge"
        scheme = "https" if self.tls_serving(role) else "http"
        return f"{scheme}://{host.address}:{CENTER_PORT if role == 'center' else EDGE_PORT}"

    def registry_homes(self) -> dict[str, Path]:
        """Each registry's home by child (and host) name: ``registry``, then ``registry-2``
        and on for the standbys."""
        return {"registry": self.registry_home,
                **{f"registry-{i + 1}": self.root / f"registry-{i + 1}"
                   for i in range(1, self.standbys + 1)}}

    def registry_roles(self) -> dict[str, str]:
        """Each registry's role as its own database says (primary, standby, standalone; "-"
        before it has one)."""
        states = {name: read_state(registry_database(home))
                  for name, home in self.registry_homes().items()}
        return {name: state.role if state else "-" for name, state in states.items()}

    def primary(self) -> str | None:
        """The registry that is primary (or standalone) now; None during an election."""
        found = [n for n, r in self.registry_roles().items() if r in ("primary", "standalone")]
        return found[0] if len(found) == 1 else None

    def expected(self) -> dict[str, int]:
        standbys = {SERVICES["registry-standby"]: self.standbys} if self.standbys else {}
        return {SERVICES["registry"]: 1, **standbys, SERVICES["center"]: 1,
                SERVICES["edge"]: len(self.edge_sites) * self.edges_per_site}

    def env(self, name: str = "", role: str = "") -> dict[str, str]:
        env = super().env(name, role)
        host = self.placement.get(name)
        if name in self.without_consul:
            env = {k: v for k, v in env.items() if not k.startswith("CONSUL_")}
        elif host is not None:
            env["CONSUL_HTTP_ADDR"] = self.agent_of(host)
        if role == "registry":
            env |= self.registry_extra
            env["REGISTRY_HOME"] = str(self.registry_homes()[name])
        return env

    def spawn(self, name: str, argv: list[str], port: int | None = None,
              role: str = "", env: dict[str, str] | None = None) -> Child:
        host = self.placement[name]
        if argv[:3] != ["ip", "netns", "exec"]:
            argv = host.argv(*argv)
        return super().spawn(name, argv, port, role, env)
