"""What a local fleet (``tiered up``'s stack, ``tiered sites``) is made of and what each of its
children is handed: its environment, the fleet CA and TLS files, a node's bundle, the keys
releases are signed and checked with, its Consul ACL token. Secrets go in the environment or
0600 files, never on a command line (``ps`` shows argv to anyone).
"""

from __future__ import annotations

import ssl
from abc import ABC, abstractmethod
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path

from tiered import bundles
from tiered.children import JOB, Echo
from tiered.commands import BIN, registry_env, tier_env
from tiered.consul_acl import ConsulAcl
from tiered.views import registry_database

# the token each child gets as CONSUL_HTTP_TOKEN
CHILD_CONSUL_ROLE = {"registry": "registry", "center": "center", "edge": "edge",
                     "nginx": "reader", "targets": "prometheus"}
# Provisioned edges serve HTTPS with their own certificate, and nginx reaches each over TLS,
# checking that node's name (the renderer's --edge-ca): a catalog entry moved to another
# address reaches nobody. False keeps them on plain HTTP (their bundle still gives them their
# identity, token and CA).
EDGE_TLS = True
LOOPBACK_NAMES = ("127.0.0.1", "localhost")


@dataclass
class FleetConfig(ABC):
    """A fleet's description (secrets, flags, tokens) and each child's share of it. Where a
    child runs and how it is started is the subclass's: ``Stack`` on loopback, ``Sites`` on
    the hosts of a network."""

    root: Path
    registry_home: Path
    token: str
    _: KW_ONLY
    tier_flags: tuple[str, ...] = ()
    release_key: Path | None = None  # public key tiers verify releases with (default: the
    # registry home's own, created when missing)
    nginx_flags: tuple[str, ...] = ()
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
    node_regions: dict[str, str] = field(default_factory=dict)  # node -> its token's region

    @property
    @abstractmethod
    def consul(self) -> str:
        """The HTTP address (host:port) of the Consul the children and the stack talk to."""

    @property
    def tls(self) -> Path:
        """The fleet CA and the registry's certificate (made on first use)."""
        return self.root / "tls"

    @property
    def acl(self) -> ConsulAcl:
        """Consul's ACLs for this stack: a token per role, handed to each child as
        CONSUL_HTTP_TOKEN (``consul_tokens`` is the one dict of them)."""
        return ConsulAcl(self.root / "consul", self.consul_tokens)

    def consul_headers(self) -> dict[str, str]:
        """What the stack's own health polling sends: the read-only token."""
        token = self.consul_token or self.consul_tokens.get("reader")
        return {"X-Consul-Token": token} if token else {}

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

    @property
    def verify(self) -> ssl.SSLContext | bool:
        """What clients of the nodes' own URLs verify with: the fleet CA."""
        ca = self.tls / "ca.pem"
        return ssl.create_default_context(cafile=str(ca)) if ca.is_file() else True

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


def registry_public_key(home: Path) -> Path:
    """The public half of the key ``registry publish`` signs with in ``home`` (its default
    key, which the stack's children use), created on first use."""
    from registry.settings import RegistrySettings
    from registry.trust import keys

    return keys.public_key(RegistrySettings(home=home, signing_key=None)).public_path
