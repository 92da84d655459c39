"""The local stack as child processes on loopback: a Consul dev agent, ``registry serve``,
centers, edges (one per region) and nginx with its Consul-fed renderer. ``tiered up`` and the
stack tests use it. What each child is handed is ``tiered.fleet_config``'s; keeping the children
going, the health waits, ``stack.json`` and stopping are ``tiered.running``'s.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from registry.trust import pki
from serving.fleet.discovery import SERVICES
from tiered.children import Child
from tiered.commands import BIN, nginx_argv, registry_argv, tier_argv
from tiered.monitoring import prometheus
from tiered.monitoring.watched import Watched
from tiered.processes import free_port

CONSUL_CONFIG = Path(__file__).resolve().parent.parent / "consul" / "dev.hcl"


@dataclass
class Stack(Watched):
    """One local fleet on 127.0.0.1: every child on a free port, each started the way
    ``tiered up`` starts it (the start steps are the seams the stack tests use one by one)."""

    http_port: int = 8080
    consul_port: int = 8500
    grpc_port: int = 0  # nginx's gRPC entry (0: none; the tiers' gRPC ports are free ports)
    regions: tuple[str, ...] = ("eu", "us")
    centers: int = 1
    consul_flags: tuple[str, ...] = ()
    monitoring: bool = False  # Prometheus (targets from Consul) and Alertmanager beside the
    # fleet: `tiered up` runs them; the stack tests that do not look at them start without
    prometheus_port: int = 0  # 0: a free port
    alertmanager_port: int = 0
    _monitor: prometheus.Monitor | None = field(default=None, init=False, repr=False)

    @property
    def consul(self) -> str:
        return f"127.0.0.1:{self.consul_port}"

    def entries(self) -> list[str]:
        """The nginx entries clients use (one here; one per site in ``tiered sites``)."""
        return [f"http://127.0.0.1:{self.http_port}"]

    def expected(self) -> dict[str, int]:
        standbys = {SERVICES["registry-standby"]: self.standbys} if self.standbys else {}
        return {SERVICES["registry"]: 1, **standbys, SERVICES["center"]: self.centers,
                SERVICES["edge"]: len(self.regions)}

    def node_url(self, name: str) -> str:
        """A center's or edge's own URL (check HTTPS ones with ``verify``)."""
        child = self.children[name]
        scheme = "https" if self.tls_serving(child.role) else "http"
        return f"{scheme}://127.0.0.1:{child.port}"

    def registry_homes(self) -> dict[str, Path]:
        """Each registry child's home: the first's, then one per standby."""
        return {"registry": self.registry_home,
                **{f"registry-standby-{i}": self.root / f"registry-standby-{i}"
                   for i in range(1, self.standbys + 1)}}

    def up(self, timeout: float = 300) -> float:
        """Start everything, wait until every health check passes; return the seconds taken."""
        started = time.monotonic()
        if not (self.tls / "registry.pem").is_file():
            pki.fleet(self.tls, ["127.0.0.1", "localhost"])
        self.start_consul()
        self.start_registry()
        for i in range(1, self.standbys + 1):
            self.start_standby(i)
        for i in range(1, self.centers + 1):
            self.start_center(f"center-{i}")
        for region in self.regions:
            self.start_edge(f"edge-{region}-1", region)
        if self.monitoring:  # before nginx: the entry passes /console/ to the console
            self.start_monitoring()
            self.start_console()
        self.start_nginx()
        self.save()
        self.wait_healthy(timeout)
        return time.monotonic() - started

    def start_consul(self) -> Child:
        ports = {flag: free_port() for flag in ("-grpc-port", "-dns-port", "-serf-lan-port",
                                                "-serf-wan-port", "-server-port")}
        config = ["-config-file", str(CONSUL_CONFIG)] if CONSUL_CONFIG.is_file() else []
        acl = ["-config-file", str(self.acl.agent_config())] if self.consul_acl else []
        argv = [str(BIN / "consul"), "agent", "-dev", "-ui", "-node", "tiered", "-bind",
                "127.0.0.1", "-client", "127.0.0.1", *config, *acl,
                *self.consul_flags, "-http-port", str(self.consul_port),
                *[str(x) for pair in ports.items() for x in pair]]
        child = self.spawn("consul", argv, self.consul_port, "consul")
        self.children.wait(lambda: httpx.get(f"http://{self.consul}/v1/status/leader",
                                             timeout=1).json() != "", 30, "a Consul leader",
                           child)
        if self.consul_acl:
            self.children.wait(lambda: self.acl.setup(self.consul), 30, "Consul's ACL system",
                               child)
        return child

    def start_registry(self) -> Child:
        port = free_port()
        argv = registry_argv(self.registry_home, port, free_port())
        return self.spawn("registry", argv, port, "registry")

    def start_standby(self, i: int) -> Child:
        name = f"registry-standby-{i}"
        home = self.registry_homes()[name]
        port = free_port()
        argv = registry_argv(home, port, free_port())
        return self.spawn(name, argv, port, "registry", env={"REGISTRY_HOME": str(home)})

    def start_center(self, name: str) -> Child:
        return self._tier("center", name, "local")

    def start_edge(self, name: str, region: str) -> Child:
        return self._tier("edge", name, region)

    def _tier(self, tier: str, name: str, region: str) -> Child:
        port = free_port()
        self.node_regions[name] = region
        if self.provision:
            self.provision_node(name, tier, region)
        argv = tier_argv(tier, port, self.root / "stores" / name, name, "--sync-backoff-max-s",
                         "2", *self.tier_flags, release_key=self.nodes_release_key(), region=region,
                         grpc_port=free_port())
        return self.spawn(name, argv, port, tier)

    @property
    def monitor(self) -> prometheus.Monitor:
        """Prometheus and Alertmanager on loopback, data under the root; a port of 0 is a free
        one, chosen once."""
        if self._monitor is None:
            self._monitor = prometheus.Monitor(self.root, "127.0.0.1",
                                               self.prometheus_port or free_port(),
                                               self.alertmanager_port or free_port())
        return self._monitor

    def start_nginx(self) -> Child:
        grpc = f"127.0.0.1:{self.grpc_port}" if self.grpc_port else None
        # centers serve HTTPS from their bundles: nginx checks them against the fleet CA
        centers = ["--center-ca", str(self.tls / "ca.pem")] if self.provision else []
        if self.tls_serving("edge"):  # each edge's own certificate checked, by node name
            centers += ["--edge-ca", str(self.tls / "ca.pem")]
        if "console" in self.children:
            centers += ["--console", f"127.0.0.1:{self.children['console'].port}"]
        argv = nginx_argv(self.root / "nginx", f"127.0.0.1:{self.http_port}", *centers,
                          *self.nginx_flags, grpc_listen=grpc)
        return self.spawn("nginx", argv, self.http_port, "nginx")

