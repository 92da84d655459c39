"""Hosts on one machine: a Linux network namespace per host, each with its own address on a
bridge, so processes that think they run on separate machines really talk over a network that
can fail. ``tiered sites`` and the sites test build their topology with it (root only).

Every name and address here is made by this module from its own counters: nothing received
over a network reaches a command line. Links are cut with iptables rules in the hosts' own
namespaces (a ``TIERED`` chain, flushed to heal), slowed with a token bucket (``tc tbf``;
this kernel has no ``netem``, so latency comes from a delay proxy instead), and taken down
with ``ip link``. ``close()`` removes every namespace and the bridge.
"""

from __future__ import annotations

import ipaddress
import os
import re
import secrets
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field

CHAIN = "TIERED"


class NetnsUnavailable(RuntimeError):
    """Not root, or ``ip``/``iptables`` missing: hosts cannot be made here."""


def available() -> str | None:
    """None when hosts can be made here, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    missing = [tool for tool in ("ip", "iptables", "tc") if shutil.which(tool) is None
               and not os.path.exists(f"/usr/sbin/{tool}")]
    return f"missing {', '.join(missing)} (iproute2, iptables)" if missing else None


def run(*argv: str) -> str:
    """Run one ``ip``/``iptables``/``tc`` command; its stderr in the error when it fails."""
    done = subprocess.run(list(argv), capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


@dataclass(frozen=True)
class Host:
    name: str  # e.g. "eu-gw": what the topology calls it
    site: str
    address: str
    netns: str  # the namespace: <network id>-<name>
    link: str  # the root side of its veth pair (on the bridge)

    def argv(self, *command: str) -> list[str]:
        """``command`` run inside this host (``ip netns exec`` execs it: the PID is its own)."""
        return ["ip", "netns", "exec", self.netns, *command]

    def exec(self, *command: str) -> str:
        return run(*self.argv(*command))


@dataclass
class Network:
    """A bridge in the root namespace with address ``<prefix>.0.1/16`` (where the tests and
    clients run) and hosts at ``<prefix>.<site>.<n>``; ``close()`` removes all of it.

    Why one class: it is the one record of what was made on this machine as root (bridge,
    namespaces, veth pairs, ``TIERED`` chains, token buckets), so that ``close()`` can take
    all of it away; the faults (``cut``, ``heal``, ``link``, ``throttle``) are a command or
    two each on the hosts and links it made, and ``heal()`` acts on all of them at once.
    """

    prefix: str = "10.77"  # a /16 nothing on this machine uses
    id: str = field(default_factory=lambda: f"ts{secrets.token_hex(2)}")
    hosts: dict[str, Host] = field(default_factory=dict)
    _sites: dict[str, int] = field(default_factory=dict)
    _counts: dict[str, int] = field(default_factory=dict)
    _up: bool = False

    def __post_init__(self) -> None:
        if not re.fullmatch(r"\d{1,3}\.\d{1,3}", self.prefix):
            raise ValueError(f"prefix {self.prefix[:40]!r}: expected two numbers, e.g. 10.77")
        try:
            net = ipaddress.ip_network(f"{self.prefix}.0.0/16")
        except ValueError as exc:
            raise ValueError(f"prefix {self.prefix!r}: {exc}") from None
        if not net.is_private:
            raise ValueError(f"prefix {self.prefix!r}: {net} is not a private network")

    @property
    def bridge(self) -> str:
        return f"{self.id}br"

    @property
    def gateway(self) -> str:
        """The root namespace's address on the bridge: clients and the delay proxy run here."""
        return f"{self.prefix}.0.1"

    def subnet(self, site: str) -> str:
        return f"{self.prefix}.{self._sites[site]}.0/24"

    def create(self) -> Network:
        why = available()
        if why:
            raise NetnsUnavailable(why)
        net = ipaddress.ip_network(f"{self.prefix}.0.0/16")
        used = run("ip", "-4", "-o", "addr", "show")
        if any(ipaddress.ip_interface(word).network.overlaps(net)
               for line in used.splitlines() for word in line.split()[3:4]):
            raise RuntimeError(f"{net} is already used on this machine; choose another prefix")
        run("ip", "link", "add", self.bridge, "type", "bridge")
        self._up = True
        run("ip", "addr", "add", f"{self.gateway}/16", "dev", self.bridge)
        run("ip", "link", "set", self.bridge, "up")
        return self

    def add(self, site: str, name: str) -> Host:
        """A new host of ``site``: its namespace, a veth pair onto the bridge, an address,
        loopback up, and an empty ``TIERED`` chain hooked into INPUT and OUTPUT."""
        index = self._sites.setdefault(site, len(self._sites) + 1)
        number = self._counts[site] = self._counts.get(site, 9) + 1
        host = Host(name, site, f"{self.prefix}.{index}.{number}", f"{self.id}-{name}",
                    f"{self.id}h{len(self.hosts):02d}")
        run("ip", "netns", "add", host.netns)
        self.hosts[name] = host
        run("ip", "link", "add", host.link, "type", "veth", "peer", "name", "eth0", "netns",
            host.netns)
        run("ip", "link", "set", host.link, "master", self.bridge, "up")
        host.exec("ip", "addr", "add", f"{host.address}/16", "dev", "eth0")
        host.exec("ip", "link", "set", "eth0", "up")
        host.exec("ip", "link", "set", "lo", "up")
        host.exec("iptables", "-w", "-N", CHAIN)
        for hook in ("INPUT", "OUTPUT"):
            host.exec("iptables", "-w", "-I", hook, "-j", CHAIN)
        return host

    def site_hosts(self, site: str) -> list[Host]:
        return [h for h in self.hosts.values() if h.site == site]

    # -- faults ------------------------------------------------------------------------

    def cut(self, hosts: Iterable[Host], peers: Iterable[str]) -> None:
        """Drop every packet between each of ``hosts`` and each of ``peers`` (addresses or
        CIDRs), both ways, as a broken link does: no refusal, no reset, silence."""
        for host in hosts:
            for peer in peers:
                host.exec("iptables", "-w", "-A", CHAIN, "-s", peer, "-j", "DROP")
                host.exec("iptables", "-w", "-A", CHAIN, "-d", peer, "-j", "DROP")

    def heal(self, hosts: Iterable[Host] | None = None) -> None:
        """Remove every cut of ``hosts`` (default: all)."""
        for host in hosts if hosts is not None else self.hosts.values():
            host.exec("iptables", "-w", "-F", CHAIN)

    def link(self, host: Host, up: bool) -> None:
        """The host's cable in or out (a powered-off host: every packet to it is lost)."""
        run("ip", "link", "set", host.link, "up" if up else "down")

    def throttle(self, host: Host, kbit: int | None) -> None:
        """Limit what reaches ``host`` (its downloads) to ``kbit`` kbit/s; None lifts it."""
        if kbit is None:
            subprocess.run(["tc", "qdisc", "del", "dev", host.link, "root"],
                           capture_output=True)
            return
        run("tc", "qdisc", "replace", "dev", host.link, "root", "tbf", "rate", f"{int(kbit)}kbit",
            "burst", "32kbit", "latency", "2s")

    # -- teardown ----------------------------------------------------------------------

    def close(self) -> None:
        """Delete the namespaces (their veth pairs go with them) and the bridge. Stop the
        processes inside first: a namespace with a live process lingers until it exits."""
        for host in self.hosts.values():
            # the pair first: a namespace is freed asynchronously, and its veth with it (the
            # root side could outlive `ip netns del` for a moment); deleting one end of a pair
            # deletes both, now
            subprocess.run(["ip", "link", "del", host.link], capture_output=True)
            subprocess.run(["ip", "netns", "del", host.netns], capture_output=True)
        self.hosts.clear()
        if self._up:
            subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
            self._up = False

    def __enter__(self) -> Network:
        return self.create()

    def __exit__(self, *_: object) -> None:
        self.close()
