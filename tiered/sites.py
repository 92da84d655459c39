"""Several sites on one machine: a center site and edge sites, every host a network namespace
with its own address (``tiered.netns``), talking over a bridge that can be cut.

- **center site** (``core``): three Consul servers (a real Raft cluster, each on its own
  host), two registry hosts (``registry`` and ``registry-2``: a primary and a standby elected
  through a Consul lock, ``registry serve`` with ``REGISTRY_HA``, one signing key provisioned
  beside their homes) and the center's host, each with a Consul client agent;
- **edge sites** (``eu``, ``us``, …): a gateway host with the site's Consul client agent and
  its nginx entry (``--region`` = the site: its own edges first, then the nearest other
  site's), and one host per edge, registered with the gateway's agent.

Across sites everything is authenticated and encrypted: every edge and center starts from its
own provisioning bundle (its token, its certificate from the fleet CA, the CA), sync over TLS
(the registry's certificate) with per-node tokens, escalation over HTTPS to centers whose
certificate names the node Consul lists them as, Consul gossip encrypted (a fresh 32-byte key
per fleet) and ACLs on (default deny, a token per role). Secrets go in 0600 files or the
environment, never on a command line. ``tiered sites`` runs it; the sites test breaks it on purpose.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from registry import pki
from registry.replication import read_state
from serving.config.tokens import write_secret
from serving.fleet.discovery import SERVICES
from tiered.children import Child
from tiered.commands import BIN, nginx_argv, registry_argv, tier_argv
from tiered.netns import Host, Network
from tiered.stack import Stack
from tiered.views import registry_database

CORE = "core"
CONSUL_HTTP = 8500
REGISTRY_PORT, REGISTRY_METRICS = 50051, 9300
CENTER_PORT, CENTER_GRPC = 8100, 8101
EDGE_PORT, EDGE_GRPC = 8200, 8201
ENTRY_PORT, ENTRY_GRPC = 8080, 8081
DATACENTER = "tiered"


@dataclass
class Sites(Stack):
    """The fleet of ``tiered sites``: ``Stack`` (children, ACL tokens, health, stopping) with
    every child placed on a host of ``network``.

    Why one class: it is ``Stack`` with a placement, and most of its methods are the stack's
    hooks answered for hosts (where a child runs, its Consul agent, its address). The rest
    follow from the same placement: the Consul servers and client agents it lays out, and the
    faults the sites test and benchmark inject (``kill_host``, ``kill``, ``revive``), which act
    on the children of one host and must restart them exactly as ``spawn`` placed them. The
    namespaces and links themselves are ``tiered.netns``'s.
    """

    network: Network = field(default_factory=Network)
    edge_sites: tuple[str, ...] = ("eu", "us")
    edges_per_site: int = 2
    servers: int = 3
    registry_extra: dict[str, str] = field(default_factory=dict)  # e.g. REGISTRY_CHUNK_BYTES
    placement: dict[str, Host] = field(default_factory=dict)  # child name -> its host
    edge_flags: tuple[str, ...] = ()  # flags for the edges only (after tier_flags)
    without_consul: set[str] = field(default_factory=set)  # nodes given static addresses
    gossip_key: str = field(default_factory=lambda: base64.b64encode(
        secrets.token_bytes(32)).decode())
    standbys: int = field(default=1, kw_only=True)  # registries beside the primary, each on
    # a host of its own
    # (registry-2, ...): every registry runs --ha, one is elected primary; 0: one standalone

    # -- where things are --------------------------------------------------------------

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

    def entry(self, site: str) -> str:
        return f"http://{self.host(f'{site}-gw').address}:{ENTRY_PORT}"

    @property
    def url(self) -> str:
        return self.entry(self.edge_sites[0])

    def edges(self, site: str) -> list[str]:
        return [f"edge-{site}-{i}" for i in range(1, self.edges_per_site + 1)]

    def node_url(self, name: str) -> str:
        """A center's or edge's own URL (centers serve HTTPS: check with ``verify``)."""
        host = self.placement[name]
        role = "center" if name.startswith("center") else "edge"
        scheme = "https" if self.tls_serving(role) else "http"
        return f"{scheme}://{host.address}:{CENTER_PORT if role == 'center' else EDGE_PORT}"

    def agent_of(self, host: Host) -> str:
        """The Consul agent a host's services register with: its own (center site), or its
        site gateway's (edge sites: one client agent per site)."""
        if host.site == CORE:
            return f"127.0.0.1:{CONSUL_HTTP}"
        return f"{self.host(f'{host.site}-gw').address}:{CONSUL_HTTP}"

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

    # -- building ----------------------------------------------------------------------

    def layout(self) -> None:
        """Every host, in address order: the center site, then each edge site."""
        for i in range(1, self.servers + 1):
            self.network.add(CORE, f"consul-{i}")
        for name in self.registry_homes():
            self.network.add(CORE, name)
        self.network.add(CORE, "center")
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
        files = self.consul_files()
        for host in self.server_hosts:
            self.start_agent(host, files, server=True)
        self.children.wait(lambda: self.leader() is not None, 60,
                   "a Consul leader elected by the three servers")
        self.children.wait(lambda: self.acl.setup(self.consul), 30, "Consul's ACL system")
        for name in (*self.registry_homes(), "center", *(f"{s}-gw" for s in self.edge_sites)):
            self.start_agent(self.host(name), files)
        self.start_registry()
        for i in range(1, self.standbys + 1):
            self.start_standby(i)
        self.start_center("center-1")
        for site in self.edge_sites:
            for name in self.edges(site):
                self.start_edge(name, site)
            self.start_entry(site)
        self.save()
        self.wait_healthy(timeout)
        return time.monotonic() - started

    def leader(self) -> Host | None:
        """The host of the current Raft leader (None during an election)."""
        address = httpx.get(f"http://{self.consul}/v1/status/leader", timeout=2).json()
        ip = str(address).rpartition(":")[0]
        return next((h for h in self.server_hosts if h.address == ip), None)

    def consul_files(self) -> tuple[Path, Path, Path]:
        """The secret agent configs (0600): gossip key, ACLs of a server (management and
        agent tokens), ACLs of a client (the agent token only)."""
        folder = self.root / "consul"
        server = self.acl.agent_config()  # makes the tokens, acl.json and management.token
        gossip = folder / "gossip.json"
        write_secret(gossip, json.dumps({"encrypt": self.gossip_key}).encode())
        client = folder / "acl-client.json"
        write_secret(client, json.dumps({"acl": {
            "enabled": True, "default_policy": "deny", "down_policy": "extend-cache",
            "tokens": {"agent": self.consul_tokens["agent"]}}}).encode())
        return gossip, server, client

    def start_agent(self, host: Host, files: tuple[Path, Path, Path],
                    server: bool = False) -> Child:
        """A Consul agent on ``host`` with the secret ``files`` (``consul_files()``): a server
        of the Raft cluster, or a client agent that joins them. Its data survives a restart
        (a revived host rejoins with its state)."""
        gossip, server_acl, client_acl = files
        data = self.root / "consul" / "data" / host.name
        data.mkdir(parents=True, exist_ok=True)
        config: dict[str, Any] = {
            "node_name": host.name, "datacenter": DATACENTER, "data_dir": str(data),
            "bind_addr": host.address, "advertise_addr": host.address,
            "client_addr": f"127.0.0.1 {host.address}", "ports": {"http": CONSUL_HTTP,
                                                                  "dns": -1},
            "retry_join": [h.address for h in self.server_hosts if h != host],
            "node_meta": {"tiered_site": host.site}, "log_level": "WARN",
            "disable_update_check": True,
            "performance": {"raft_multiplier": 1}}  # production's setting: ~1 s elections
        if server:
            config |= {"server": True, "bootstrap_expect": self.servers, "ui": True}
        path = self.root / "consul" / f"{host.name}.json"
        path.write_text(json.dumps(config, indent=2))
        argv = [str(BIN / "consul"), "agent", "-config-file", str(path), "-config-file",
                str(gossip), "-config-file", str(server_acl if server else client_acl)]
        name = host.name if server else f"consul-{host.name}"
        self.placement[name] = host
        return self.spawn(name, argv, CONSUL_HTTP, "consul")

    def registry_homes(self) -> dict[str, Path]:
        """Each registry's home by child (and host) name: ``registry``, then ``registry-2``
        and on for the standbys."""
        return {"registry": self.registry_home,
                **{f"registry-{i + 1}": self.root / f"registry-{i + 1}"
                   for i in range(1, self.standbys + 1)}}

    @property
    def signing_key(self) -> Path:
        """The group's one signing key (``<root>/keys``): the registry home's own key when it
        has one (its releases are signed with it, and nodes pin its public half), else a new
        one. Every registry and every ``registry publish`` uses it (REGISTRY_SIGNING_KEY)."""
        from registry import keys

        path = self.root / "keys" / "signing.key"
        own = self.registry_home / "keys" / "signing.key"
        if not path.exists() and own.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(keys.public_path(own), keys.public_path(path))
            shutil.copy2(own, path)
            os.chmod(path, 0o600)
        return super().signing_key

    def start_registry(self) -> Child:
        return self._registry("registry")

    def start_standby(self, i: int) -> Child:
        return self._registry(f"registry-{i + 1}")

    def _registry(self, name: str) -> Child:
        host = self.host(name)
        self.placement[name] = host
        argv = registry_argv(self.registry_homes()[name], REGISTRY_PORT, REGISTRY_METRICS,
                             "--host", host.address)
        return self.spawn(name, argv, REGISTRY_PORT, "registry")

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

    def start_center(self, name: str) -> Child:
        host = self.host("center")
        self.placement[name] = host
        if self.provision:  # its certificate and key come from its bundle
            return self._node("center", name, host, CENTER_PORT, CENTER_GRPC)
        tls = ["--tls-cert", str(self.tls / "center.pem"), "--tls-key",
               str(self.tls / "center.key")]
        return self._node("center", name, host, CENTER_PORT, CENTER_GRPC, *tls)

    def start_edge(self, name: str, region: str) -> Child:
        host = self.host(name)
        self.placement[name] = host
        ca = [] if self.provision else ["--center-ca", str(self.tls / "ca.pem")]  # the bundle's
        return self._node("edge", name, host, EDGE_PORT, EDGE_GRPC, *ca, *self.edge_flags)

    def _node(self, tier: str, name: str, host: Host, port: int, grpc: int,
              *flags: str) -> Child:
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

    # -- health ------------------------------------------------------------------------

    def expected(self) -> dict[str, int]:
        standbys = {SERVICES["registry-standby"]: self.standbys} if self.standbys else {}
        return {SERVICES["registry"]: 1, **standbys, SERVICES["center"]: 1,
                SERVICES["edge"]: len(self.edge_sites) * self.edges_per_site}

    def entries(self) -> list[str]:
        return [self.entry(site) for site in self.edge_sites]

    # -- hosts failing -------------------------------------------------------------------

    def on(self, host: Host) -> list[Child]:
        """The children running on ``host``, in the order they were started."""
        return [c for n, c in self.children.items() if self.placement.get(n) == host]

    def kill_host(self, name: str) -> None:
        """Power off a host: SIGKILL for everything on it, its cable out."""
        host = self.host(name)
        for child in self.on(host):
            self.kill(child.name)
        self.network.link(host, False)

    def kill(self, name: str) -> None:
        """SIGKILL one child and what it started (nginx under its renderer: each child leads
        its own process group), its host left running."""
        child = self.children[name]
        if child.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            child.process.wait(timeout=10)

    def revive_host(self, name: str) -> None:
        host = self.host(name)
        self.network.link(host, True)
        for child in self.on(host):
            self.revive(child.name)

    # -- state and stopping ------------------------------------------------------------

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
            "center": self.node_url("center-1") if "center-1" in self.placement else None}
        return state

    def stop(self) -> None:
        """Every child by PID (newest first), then the namespaces and the bridge."""
        try:
            super().stop()
        finally:
            self.network.close()

