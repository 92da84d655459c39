"""Center URLs: the one place that reads what a center's URL says (transport, TLS, address),
for the ``center_url`` setting, the escalation client and the centers Consul lists."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from serving.fleet.discovery import Instance, host_port, node_tls_name

Transport = Literal["http", "grpc"]
# scheme -> (transport, TLS)
SCHEMES: dict[str, tuple[Transport, bool]] = {
    "http": ("http", False), "https": ("http", True),
    "grpc": ("grpc", False), "grpcs": ("grpc", True)}


@dataclass(frozen=True)
class CenterURL:
    """``http(s)://host:port`` (V2 REST) or ``grpc(s)://host:port`` (gRPC V2)."""

    url: str  # as configured, without a trailing slash: the key of the center's circuit
    transport: Transport
    tls: bool
    address: str  # what follows the scheme: host:port (a gRPC channel's target)
    tls_name: str | None = None  # the name its certificate must carry (a center found in
    # Consul: its node's own); None: the center role's (a configured URL)

    @classmethod
    def parse(cls, url: str) -> CenterURL:
        """Raises ValueError for a scheme other than http, https, grpc or grpcs."""
        url = url.strip().rstrip("/")
        scheme, sep, address = url.partition("://")
        if not sep or scheme not in SCHEMES:
            raise ValueError(f"center_url {url!r}: expected http://, https://, grpc:// "
                             f"or grpcs:// and host:port")
        transport, tls = SCHEMES[scheme]
        return cls(url, transport, tls, address)

    @classmethod
    def discovered(cls, instance: Instance, transport: Transport, tls: bool,
                   by_node: bool = True) -> CenterURL:
        """A center Consul lists: over gRPC where ``transport`` is grpc and it registered a
        gRPC port, else over REST on its HTTP port; over TLS when the edge pins a CA, to a
        certificate naming the node the entry claims (``node_tls_name(service id, "center")``;
        ValueError for an id no certificate can name); ``by_node`` False: any center's
        certificate (the role name), for centers holding ``registry tls`` certificates."""
        name = node_tls_name(instance.service_id, "center") if tls and by_node else None
        grpc_port = instance.grpc_port if transport == "grpc" else None
        if grpc_port:
            address = host_port(instance.address, grpc_port)
            return cls(f"{'grpcs' if tls else 'grpc'}://{address}", "grpc", tls, address, name)
        return cls(f"{'https' if tls else 'http'}://{instance.target}", "http", tls,
                   instance.target, name)


def parse_list(value: str | None) -> list[CenterURL]:
    """The comma-separated ``center_url`` setting (empty items skipped)."""
    return [CenterURL.parse(u) for u in (value or "").split(",") if u.strip()]
