"""Several sites on one machine: a center site and edge sites, every host a network namespace
with its own address (``tiered.netns``), talking over a bridge that can be cut.

- **center site** (``core``): three Consul servers (a real Raft cluster, each on its own
  host), two registry hosts (``registry`` and ``registry-2``: a primary and a standby elected
  through a Consul lock, ``registry serve`` with ``REGISTRY_HA``, one signing key provisioned
  beside their homes) and the center's host, each with a Consul client agent;
  a ``monitoring`` host (Prometheus fed by the target renderer through its own Consul agent,
  Alertmanager: they watch every site from outside the hosts the faults hit);
- **edge sites** (``eu``, ``us``, …): a gateway host with the site's Consul client agent and
  its nginx entry (``--region`` = the site: its own edges first, then the nearest other
  site's), and one host per edge, registered with the gateway's agent.

Across sites everything is authenticated and encrypted: every edge and center starts from its
own provisioning bundle (its token, its certificate from the fleet CA, the CA), sync over TLS
(the registry's certificate) with per-node tokens, escalation over HTTPS to centers whose
certificate names the node Consul lists them as, Consul gossip encrypted (a fresh 32-byte key
per fleet) and ACLs on (default deny, a token per role). Secrets go in 0600 files or the
environment, never on a command line. ``tiered sites`` runs it; the sites test breaks it on purpose.
Where each child runs and how it is reached is ``tiered.site_map``'s; the Consul agents'
configs are ``tiered.consul_cluster``'s.
"""

from __future__ import annotations

import base64
import os
import secrets
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from registry.trust import pki
from tiered import consul_cluster
from tiered.children import Child
from tiered.commands import nginx_argv, registry_argv, tier_argv
from tiered.consul_cluster import CONSUL_HTTP, AgentFiles, agent_argv, agent_files
from tiered.netns import Host
from tiered.site_map import (
    CENTER_GRPC,
    CENTER_PORT,
    CORE,
    EDGE_GRPC,
    EDGE_PORT,
    ENTRY_GRPC,
    ENTRY_PORT,
    MONITOR,
    REGISTRY_METRICS,
    REGISTRY_PORT,
    SiteMap,
)


@dataclass
class Sites(SiteMap):
    """The fleet of ``tiered sites``: its hosts laid out and its children started on them in
    order (Consul servers, client agents, registries, the center, edges, each site's entry),
    and the faults the sites test and benchmark inject on whole hosts."""

    edge_flags: tuple[str, ...] = ()  # flags for the edges only (after tier_flags)
    gossip_key: str = field(default_factory=lambda: base64.b64encode(
        secrets.token_bytes(32)).decode())

    def layout(self) -> None:
        """Every host, in address order: the center site, then each edge site."""
        for i in range(1, self.servers + 1):
            self.network.add(CORE, f"consul-{i}")
        for name in self.registry_homes():
            self.network.add(CORE, name)
        self.network.add(CORE, "center")
        self.network.add(CORE, MONITOR)
        for site in self.edge_sites:
            self.network.add(site, f"{site}-gw")
            for name in self.edges(site):
                self.network.add(site, name)

    def up(self, timeout: float = 300) -> float:
        started = time.monotonic()
        if not self.network.hosts:
            self.layout()
        # the CA is kept (made once); the servers' certificates name this run's addresses
        # one registry certificate for the group: a standby checks the primary's against the
        # address it advertises, so it names every registry host
        pki.fleet(self.tls, ["127.0.0.1", "localhost",
                             *(self.host(n).address for n in self.registry_homes()),
                             self.host("center").address])
        # a new cluster each run: Consul's state is what the processes register again, and a
        # data dir from an earlier run would bring its old gossip keyring and ACL objects
        shutil.rmtree(self.root / "consul" / "data", ignore_errors=True)
        files = agent_files(self.acl, self.gossip_key)
        for host in self.server_hosts:
            self.start_agent(host, files, server=True)
        self.children.wait(lambda: self.leader() is not None, 60,
                           "a Consul leader elected by the three servers")
        self.children.wait(lambda: self.acl.setup(self.consul), 30, "Consul's ACL system")
        for name in (*self.registry_homes(), "center", MONITOR,
                     *(f"{s}-gw" for s in self.edge_sites)):
            self.start_agent(self.host(name), files)
        for name in self.registry_homes():
            self.start_registry(name)
        self.start_node("center", "center-1")
        for site in self.edge_sites:
            for name in self.edges(site):
                self.start_node("edge", name)
            self.start_entry(site)
        self.start_monitoring()
        self.save()
        self.wait_healthy(timeout)
        return time.monotonic() - started

    def leader(self) -> Host | None:
        """The host of the current Raft leader (None during an election)."""
        return consul_cluster.leader(self.consul, self.server_hosts)

    def start_agent(self, host: Host, files: AgentFiles, server: bool = False) -> Child:
        """A Consul agent on ``host`` with the secret ``files``: a server of the Raft
        cluster, or a client agent that joins them."""
        argv = agent_argv(host, self.root / "consul", files, self.server_hosts, server)
        name = host.name if server else f"consul-{host.name}"
        self.placement[name] = host
        return self.spawn(name, argv, CONSUL_HTTP, "consul")

    @property
    def signing_key(self) -> Path:
        """The group's one signing key (``<root>/keys``): the registry home's own key when it
        has one (its releases are signed with it, and nodes pin its public half), else a new
        one. Every registry and every ``registry publish`` uses it (REGISTRY_SIGNING_KEY)."""
        from registry.trust import keys

        path = self.root / "keys" / "signing.key"
        own = self.registry_home / "keys" / "signing.key"
        if not path.exists() and own.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(keys.public_path(own), keys.public_path(path))
            shutil.copy2(own, path)
            os.chmod(path, 0o600)
        return super().signing_key

    def start_registry(self, name: str) -> Child:
        """Registry ``name`` (``registry``, then the standbys) on the host of that name."""
        host = self.host(name)
        self.placement[name] = host
        argv = registry_argv(self.registry_homes()[name], REGISTRY_PORT, REGISTRY_METRICS,
                             "--host", host.address)
        return self.spawn(name, argv, REGISTRY_PORT, "registry")

    def start_node(self, tier: str, name: str) -> Child:
        """A center (on the center host) or an edge (on its own host) of its host's site."""
        host = self.host("center" if tier == "center" else name)
        self.placement[name] = host
        if tier == "center":  # provisioned: its certificate and key come from its bundle
            port, grpc = CENTER_PORT, CENTER_GRPC
            flags = [] if self.provision else ["--tls-cert", str(self.tls / "center.pem"),
                                               "--tls-key", str(self.tls / "center.key")]
        else:  # provisioned: the CA comes from its bundle
            port, grpc = EDGE_PORT, EDGE_GRPC
            flags = [*([] if self.provision else ["--center-ca", str(self.tls / "ca.pem")]),
                     *self.edge_flags]
        release_key = self.nodes_release_key()
        self.node_regions[name] = host.site
        if self.provision:
            self.provision_node(name, tier, host.site, (host.address, "127.0.0.1"))
        argv = tier_argv(tier, port, self.root / "stores" / name, name, "--host", host.address,
                         "--sync-backoff-max-s", "2", *self.tier_flags, *flags,
                         release_key=release_key, region=host.site, grpc_port=grpc)
        return self.spawn(name, argv, port, tier)

    def start_entry(self, site: str) -> Child:
        """The site's nginx: its own edges first, then the nearest other site's (the other
        edge sites in the order given), centers over HTTPS checked against the fleet CA."""
        host = self.host(f"{site}-gw")
        name = f"nginx-{site}"
        self.placement[name] = host
        others = ",".join(s for s in self.edge_sites if s != site)
        argv = nginx_argv(self.root / name, f"{host.address}:{ENTRY_PORT}", "--region", site,
                          *(["--fallback-regions", others] if others else []), "--center-ca",
                          str(self.tls / "ca.pem"),
                          *(["--edge-ca", str(self.tls / "ca.pem")]
                            if self.tls_serving("edge") else []),
                          *self.nginx_flags, grpc_listen=f"{host.address}:{ENTRY_GRPC}")
        return self.spawn(name, argv, ENTRY_PORT, "nginx")

    def monitor_consul(self) -> str:
        """The renderer follows the monitoring host's own Consul agent."""
        return self.agent_of(self.host(MONITOR))

    def placed(self, name: str) -> None:
        self.placement[name] = self.host(MONITOR)

    def on(self, host: Host) -> list[Child]:
        """The children running on ``host``, in the order they were started."""
        return [c for n, c in self.children.items() if self.placement.get(n) == host]

    def kill_host(self, name: str) -> None:
        """Power off a host: SIGKILL for everything on it, its cable out."""
        host = self.host(name)
        for child in self.on(host):
            child.kill_group()
        self.network.link(host, False)

    def revive_host(self, name: str) -> None:
        """Its cable back in, and everything that ran on it started again as it was."""
        host = self.host(name)
        self.network.link(host, True)
        for child in self.on(host):
            self.revive(child.name)

    def state(self) -> dict[str, Any]:
        state = super().state()
        roles = self.registry_roles()
        primary = self.primary()
        if primary is not None:  # `tiered status --sites` reads the primary's rollout
            state["registry_home"] = str(self.registry_homes()[primary])
        state["sites"] = {site: {"entry": self.entry(site),
                                 "grpc_entry": f"{self.host(f'{site}-gw').address}:{ENTRY_GRPC}",
                                 "edges": {n: self.node_url(n) for n in self.edges(site)
                                           if n in self.placement}}
                          for site in self.edge_sites}
        state["sites"][CORE] = {
            "consul_servers": [f"http://{h.address}:{CONSUL_HTTP}" for h in self.server_hosts],
            "registry": f"{self.host(self.primary() or 'registry').address}:{REGISTRY_PORT}",
            "registries": {n: {"address": f"{self.host(n).address}:{REGISTRY_PORT}",
                               "home": str(home), "role": roles[n]}
                           for n, home in self.registry_homes().items()},
            "center": self.node_url("center-1") if "center-1" in self.placement else None,
            "prometheus": self.prometheus_url, "alertmanager": self.alertmanager_url}
        return state

    def stop(self) -> None:
        """Every child by PID (newest first), then the namespaces and the bridge."""
        try:
            super().stop()
        finally:
            self.network.close()

