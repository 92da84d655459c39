"""The local stack as child processes: a Consul dev agent, ``registry serve``, centers, edges
(one per region) and nginx with its Consul-fed renderer. ``tiered up`` and the stack tests use
it. Every child is started on loopback, its output goes to ``<root>/logs/<name>.log`` (and, for
``tiered up``, to the console with a prefix), and it is stopped by PID, newest first.
"""

from __future__ import annotations

import json
import ssl
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx

from registry.trust import pki
from serving.fleet.discovery import SERVICES
from serving.release.store import write_durably
from tiered import bundles
from tiered.commands import (
    BIN,
    nginx_argv,
    registry_argv,
    registry_env,
    tier_argv,
    tier_env,
)
from tiered.consul_acl import ConsulAcl
from tiered.processes import RunningProcess, free_port
from tiered.views import registry_database

Echo = Callable[[str, str], None]  # (child name, output line)
CONSUL_CONFIG = Path(__file__).resolve().parent.parent / "consul" / "dev.hcl"
CHILD_CONSUL_ROLE = {"registry": "registry", "center": "center", "edge": "edge",
                     "nginx": "reader"}  # the token each child gets as CONSUL_HTTP_TOKEN
STATE = "stack.json"


RESTARTED = ("registry", "center", "edge")  # roles the supervisor brings back
JOB = "job"  # a child that runs to its end (the full release trained behind): never restarted,
# its exit never stops the stack
RESTART_DELAY_S = 0.5
# Provisioned edges serve HTTPS with their own certificate, and nginx reaches each over TLS,
# checking that node's name (the renderer's --edge-ca): a catalog entry moved to another
# address reaches nobody. False keeps them on plain HTTP (their bundle still gives them their
# identity, token and CA).
EDGE_TLS = True
LOOPBACK_NAMES = ("127.0.0.1", "localhost")


@dataclass
class Child(RunningProcess):
    role: str = ""  # consul, registry, center, edge, nginx
    argv: list[str] = field(default_factory=list)
    restarts: int = 0


@dataclass
class Stack:
    """One local fleet: what it is made of (ports, regions, flags, secrets) and its children,
    from start through supervision and health to stop.

    Why one class: every step reads the same description and the same ``children``, and the
    steps are the seams ``tiered sites`` reuses: ``Sites`` subclasses it and overrides where a
    child runs and is reached (``env``, ``spawn``, ``start_*``, ``expected``, ``entries``,
    ``state``), while supervision, health waits, the state file and stopping stay shared.
    Split into collaborators, each would call back into the stack for ``env`` and ``spawn``.
    What stands apart lives elsewhere: a child process and its stopping in
    ``tiered.processes``, each child's argv and environment in ``tiered.commands``, Consul's
    ACL tokens, their files and their setup in ``tiered.consul_acl``.
    """

    root: Path
    registry_home: Path
    token: str
    http_port: int = 8080
    consul_port: int = 8500
    grpc_port: int = 0  # nginx's gRPC entry (0: none; the tiers' gRPC ports are free ports)
    regions: tuple[str, ...] = ("eu", "us")
    centers: int = 1
    tier_flags: tuple[str, ...] = ()
    release_key: Path | None = None  # public key tiers verify releases with (default: the
    # registry home's own, created when missing)
    nginx_flags: tuple[str, ...] = ()
    consul_flags: tuple[str, ...] = ()
    consul_token: str | None = None  # one token for every child instead of the per-role ones
    consul_acl: bool = True  # Consul with ACLs (default deny) and a token per role
    consul_tokens: dict[str, str] = field(default_factory=dict)  # role (+ "management") ->
    # secret; made once per stack, so a restarted (empty) dev agent gets the very same ones
    tracing: dict[str, str] = field(default_factory=dict)  # OTEL_* variables for the tiers
    provision: bool = True  # each center and edge starts from its own bundle (its token, its
    # certificate, the CA: centers serve HTTPS); False: a token and the CA as before, plain HTTP
    standbys: int = 0  # registries beside the primary (REGISTRY_HA: a Consul lock elects one;
    # they follow it and one takes over when it is gone); 0: one standalone registry
    echo: Echo | None = None
    children: dict[str, Child] = field(default_factory=dict)
    node_regions: dict[str, str] = field(default_factory=dict)  # node -> its token's region
    notes: dict[str, dict[str, str]] = field(default_factory=dict)  # e.g. the full release
    # trained behind the quick one: shown by ``tiered status`` (stack.json)
    cancelled: threading.Event = field(default_factory=threading.Event)  # Ctrl-C while starting
    stopping: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _saving: threading.Lock = field(default_factory=threading.Lock)

    @property
    def consul(self) -> str:
        return f"127.0.0.1:{self.consul_port}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def tls(self) -> Path:
        """The fleet CA and the registry's certificate (made on first use)."""
        return self.root / "tls"

    def bundle(self, name: str) -> Path:
        """Where node ``name``'s bundle is (``provision_node`` writes it)."""
        return self.root / "bundles" / f"{name}.json"

    def provision_node(self, name: str, tier: str, region: str,
                       hosts: tuple[str, ...] = LOOPBACK_NAMES) -> Path:
        """Node ``name``'s bundle, made with the stack's CA and the registry's secret (as
        ``registry node provision`` does on a registry host, with the chain's seq as its
        directive floor): 0600 in ``<root>/bundles``."""
        return bundles.write(self.root / "bundles", self.tls, self.token, name, tier, region,
                             hosts, bundles.floor(registry_database(self.registry_home)))

    def tls_serving(self, role: str) -> bool:
        """Whether a ``role`` child serves HTTPS (and gRPC over TLS)."""
        return self.provision and (role == "center" or (role == "edge" and EDGE_TLS))

    def node_url(self, name: str) -> str:
        """A center's or edge's own URL (check HTTPS ones with ``verify``)."""
        child = self.children[name]
        scheme = "https" if self.tls_serving(child.role) else "http"
        return f"{scheme}://127.0.0.1:{child.port}"

    @property
    def verify(self) -> ssl.SSLContext | bool:
        """What clients of the nodes' own URLs verify with: the fleet CA."""
        ca = self.tls / "ca.pem"
        return ssl.create_default_context(cafile=str(ca)) if ca.is_file() else True

    def env(self, name: str = "", role: str = "") -> dict[str, str]:
        """A child's environment: secrets go here, never on its command line (``ps``). The
        registry gets its secret and TLS files; each node its bundle (its own token, which
        proves its name and no other, its certificate, and the fleet CA its registry and
        centers must prove themselves with, since nodes find them through Consul), or
        without ``provision`` its token and the CA. CONSUL_HTTP_TOKEN: ``consul_token`` when
        set, else the child's role token (none for Consul itself)."""
        env = {"PATH": f"{BIN}:/usr/sbin:/usr/bin:/bin", "CONSUL_HTTP_ADDR": self.consul,
               "REGISTRY_HOME": str(self.registry_home)}
        if role == "registry":
            env = registry_env(env, self.token, self.tls)
            if self.standbys:  # one signing key (nodes pin it), one CA, an elected primary
                env |= {"REGISTRY_HA": "true", "REGISTRY_CA_DIR": str(self.tls),
                        "REGISTRY_SIGNING_KEY": str(self.signing_key)}
        elif role in ("center", "edge") and self.provision:
            env |= {f"{role.upper()}_BUNDLE": str(self.bundle(name)), **self.tracing}
            if not self.tls_serving(role):
                env[f"{role.upper()}_SERVE_TLS"] = "false"
        elif role in ("center", "edge"):
            env = tier_env(env, role, name, self.token, self.tls / "ca.pem",
                           region=self.node_regions.get(name, "local")) | self.tracing
        elif role == JOB:
            env |= {"HOME": str(self.root)}
        consul = self.consul_token or self.consul_tokens.get(CHILD_CONSUL_ROLE.get(role, ""))
        return env | ({"CONSUL_HTTP_TOKEN": consul} if consul else {})

    # -- starting ------------------------------------------------------------------------

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
        self.start_nginx()
        self.save()
        self.wait_healthy(timeout)
        return time.monotonic() - started

    def spawn(self, name: str, argv: list[str], port: int | None = None,
              role: str = "", env: dict[str, str] | None = None) -> Child:
        (self.root / "logs").mkdir(parents=True, exist_ok=True)
        log = self.root / "logs" / f"{name}.log"
        log.touch()
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   env=self.env(name, role) | (env or {}), cwd=self.root,
                                   start_new_session=True)
        child = Child(name, port or 0, process, log, role, argv)
        assert process.stdout is not None
        threading.Thread(target=self._pump, args=(name, process.stdout, log),
                         daemon=True).start()
        self.children[name] = child
        return child

    def _pump(self, name: str, stream: IO[bytes], log: Path) -> None:
        with stream, log.open("ab") as out:
            for raw in stream:
                out.write(raw)
                out.flush()
                if self.echo is not None:
                    self.echo(name, raw.decode("utf-8", "replace").rstrip())

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
        self._wait(lambda: httpx.get(f"http://{self.consul}/v1/status/leader",
                                     timeout=1).json() != "", 30, "a Consul leader", child)
        if self.consul_acl:
            self._wait(lambda: self.acl.setup(self.consul), 30, "Consul's ACL system", child)
        return child

    @property
    def acl(self) -> ConsulAcl:
        """Consul's ACLs for this stack: a token per role, handed to each child as
        CONSUL_HTTP_TOKEN (``consul_tokens`` is the one dict of them)."""
        return ConsulAcl(self.root / "consul", self.consul_tokens)

    def consul_headers(self) -> dict[str, str]:
        """What the stack's own health polling sends: the read-only token."""
        token = self.consul_token or self.consul_tokens.get("reader")
        return {"X-Consul-Token": token} if token else {}

    def start_registry(self) -> Child:
        port = free_port()
        argv = registry_argv(self.registry_home, port, free_port())
        return self.spawn("registry", argv, port, "registry")

    @property
    def signing_key(self) -> Path:
        """The key every registry of an HA stack signs with: provisioned beside the homes
        (``<root>/keys``), so losing any one registry's disk loses no key."""
        from registry.trust import keys

        path = self.root / "keys" / "signing.key"
        if not path.exists():
            keys.generate_key_pair(path, keys.public_path(path))
        return path

    def nodes_release_key(self) -> Path:
        """The public key the centers and edges check releases with (``release_key``; unset:
        the group's shared key with standbys, else the registry home's own, made if missing)."""
        if self.release_key is None and self.standbys:
            from registry.trust import keys

            self.release_key = keys.public_path(self.signing_key)
        if self.release_key is None:
            self.release_key = registry_public_key(self.registry_home)
        return self.release_key

    def registry_homes(self) -> dict[str, Path]:
        """Each registry child's home: the first's, then one per standby."""
        return {"registry": self.registry_home,
                **{f"registry-standby-{i}": self.root / f"registry-standby-{i}"
                   for i in range(1, self.standbys + 1)}}

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

    def start_nginx(self) -> Child:
        grpc = f"127.0.0.1:{self.grpc_port}" if self.grpc_port else None
        # centers serve HTTPS from their bundles: nginx checks them against the fleet CA
        centers = ["--center-ca", str(self.tls / "ca.pem")] if self.provision else []
        if self.tls_serving("edge"):  # each edge's own certificate checked, by node name
            centers += ["--edge-ca", str(self.tls / "ca.pem")]
        argv = nginx_argv(self.root / "nginx", f"127.0.0.1:{self.http_port}", *centers,
                          *self.nginx_flags, grpc_listen=grpc)
        return self.spawn("nginx", argv, self.http_port, "nginx")

    # -- supervision -------------------------------------------------------------------

    def supervise(self, interval: float = 0.2) -> threading.Thread:
        """Bring back a registry, center or edge that exits while the stack runs (same
        name, port, store and flags: compose's ``restart: unless-stopped``). Consul or nginx
        exiting is not repaired: ``dead()`` reports it."""
        def loop() -> None:
            while not self.stopping.wait(interval):
                for child in list(self.children.values()):
                    if child.role in RESTARTED and child.process.poll() is not None:
                        self.restart(child)

        thread = threading.Thread(target=loop, name="stack-supervisor", daemon=True)
        thread.start()
        return thread

    def restart(self, child: Child) -> Child | None:
        with self._lock:
            if self.stopping.is_set() or self.children.get(child.name) is not child:
                return None
            if self.echo is not None:
                self.echo(child.name, f"exited with status {child.process.returncode}; "
                                      f"restarting")
            time.sleep(RESTART_DELAY_S)  # a crash loop costs 2 restarts/s at most
            fresh = self.spawn(child.name, child.argv, child.port, child.role)
            fresh.restarts = child.restarts + 1
            self.save()
            return fresh

    def dead(self) -> list[Child]:
        """Children that exited and are not brought back (Consul, nginx)."""
        return [c for c in self.children.values()
                if c.role not in (*RESTARTED, JOB) and c.process.poll() is not None]

    # -- health ------------------------------------------------------------------------

    def expected(self) -> dict[str, int]:
        standbys = {SERVICES["registry-standby"]: self.standbys} if self.standbys else {}
        return {SERVICES["registry"]: 1, **standbys, SERVICES["center"]: self.centers,
                SERVICES["edge"]: len(self.regions)}

    def passing(self) -> dict[str, list[str]]:
        """Consul's view: the ids of the passing instances of each Tiered service."""
        found = {}
        for service in self.expected():
            rows = httpx.get(f"http://{self.consul}/v1/health/service/{service}",
                             params={"passing": "1"}, headers=self.consul_headers(),
                             timeout=2).json()
            found[service] = sorted(r["Service"]["ID"] for r in rows)
        return found

    def entries(self) -> list[str]:
        """The nginx entries clients use (one here; one per site in ``tiered sites``)."""
        return [self.url]

    def wait_healthy(self, timeout: float) -> None:
        def healthy() -> bool:
            passing = self.passing()
            if any(len(passing[s]) < n for s, n in self.expected().items()):
                return False
            return all(httpx.get(f"{url}/v2/health/ready", timeout=2).status_code == 200
                       for url in self.entries())

        self._wait(healthy, timeout, "every service passing in Consul and every nginx entry "
                                     "routing")

    def _wait(self, condition: Callable[[], bool], timeout: float, what: str,
              child: Child | None = None) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.cancelled.is_set():
                raise RuntimeError(f"interrupted while waiting for {what}")
            dead = [c for c in ([child] if child else self.children.values())
                    if c.role != JOB and c.process.poll() is not None]
            if dead:
                raise RuntimeError(f"{dead[0].name} exited with status "
                                   f"{dead[0].process.returncode}; see {dead[0].log}")
            try:
                if condition():
                    return
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            time.sleep(0.25)
        raise TimeoutError(f"no {what} after {timeout:.0f}s; logs in {self.root / 'logs'}")

    # -- state and stopping -----------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """What ``tiered status`` and ``tiered demo`` read back (``stack.json``)."""
        return {"url": self.url, "consul": self.consul,
                "consul_token_file": str(self.acl.token_file) if self.consul_acl else None,
                "registry_home": str(self.registry_home),
                "children": {n: {"pid": c.pid, "port": c.port, "role": c.role}
                             for n, c in self.children.items()},
                "notes": self.notes}

    def save(self) -> None:
        with self._saving:  # the supervisor and the release trained behind both save
            # whole or not at all: `tiered status` may read it at any moment
            write_durably(self.root / STATE, json.dumps(self.state(), indent=2).encode())

    def stop(self) -> None:
        """Newest first: nginx (its renderer stops nginx), edges, centers, registry, Consul."""
        self.stopping.set()
        with self._lock:
            pass  # a restart in progress finishes (and is stopped below) before we go on
        for child in reversed(list(self.children.values())):
            child.stop()
        (self.root / STATE).unlink(missing_ok=True)


def load_state(root: Path) -> dict[str, Any] | None:
    path = root / STATE
    return json.loads(path.read_text()) if path.is_file() else None


def registry_public_key(home: Path) -> Path:
    """The public half of the key ``registry publish`` signs with in ``home`` (its default
    key, which the stack's children use), created on first use."""
    from registry.settings import RegistrySettings
    from registry.trust import keys

    return keys.public_key(RegistrySettings(home=home, signing_key=None)).public_path
