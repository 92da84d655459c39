"""The Consul of ``tiered sites``: three servers in a real Raft cluster, each on a host of its
own, and client agents that join them, every one with gossip encryption and ACLs on. Here are
their config files; ``Sites`` starts them on their hosts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

import httpx

from serving.config.tokens import write_secret
from tiered.commands import BIN
from tiered.consul_acl import ConsulAcl
from tiered.netns import Host

CONSUL_HTTP = 8500
DATACENTER = "tiered"


class AgentFiles(NamedTuple):
    """The secret agent configs (0600), given to each agent with ``-config-file``."""

    gossip: Path  # the gossip encryption key
    server_acl: Path  # a server's ACLs: management and agent tokens
    client_acl: Path  # a client's ACLs: the agent token only


def agent_files(acl: ConsulAcl, gossip_key: str) -> AgentFiles:
    """Write the secret configs into the ACL's folder; the tokens are made on first use."""
    server = acl.agent_config()  # makes the tokens, acl.json and management.token
    gossip = acl.folder / "gossip.json"
    write_secret(gossip, json.dumps({"encrypt": gossip_key}).encode())
    client = acl.folder / "acl-client.json"
    write_secret(client, json.dumps({"acl": {
        "enabled": True, "default_policy": "deny", "down_policy": "extend-cache",
        "tokens": {"agent": acl.tokens["agent"]}}}).encode())
    return AgentFiles(gossip, server, client)


def agent_argv(host: Host, folder: Path, files: AgentFiles, servers: list[Host],
               server: bool = False) -> list[str]:
    """The command of a Consul agent on ``host``: a server of the Raft cluster (``servers``),
    or a client agent that joins them. Its config goes in ``<folder>/<host>.json``, its data
    in ``<folder>/data/<host>``, which survives a restart (a revived host rejoins with its
    state)."""
    data = folder / "data" / host.name
    data.mkdir(parents=True, exist_ok=True)
    config: dict[str, Any] = {
        "node_name": host.name, "datacenter": DATACENTER, "data_dir": str(data),
        "bind_addr": host.address, "advertise_addr": host.address,
        "client_addr": f"127.0.0.1 {host.address}", "ports": {"http": CONSUL_HTTP, "dns": -1},
        "retry_join": [h.address for h in servers if h != host],
        "node_meta": {"tiered_site": host.site}, "log_level": "WARN",
        "disable_update_check": True,
        "performance": {"raft_multiplier": 1}}  # production's setting: ~1 s elections
    if server:
        config |= {"server": True, "bootstrap_expect": len(servers), "ui": True}
    path = folder / f"{host.name}.json"
    path.write_text(json.dumps(config, indent=2))
    return [str(BIN / "consul"), "agent", "-config-file", str(path), "-config-file",
            str(files.gossip), "-config-file",
            str(files.server_acl if server else files.client_acl)]


def leader(consul: str, servers: list[Host]) -> Host | None:
    """The host of the current Raft leader, asked of the Consul at ``consul`` (None during an
    election)."""
    address = httpx.get(f"http://{consul}/v1/status/leader", timeout=2).json()
    ip = str(address).rpartition(":")[0]
    return next((h for h in servers if h.address == ip), None)
