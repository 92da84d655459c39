"""A node's identity beyond the registry: an edge or center holding its role's Consul token
cannot take over another node's catalog entry (the node puts it back within seconds, and a
center's certificate names the node, so an entry moved to another center's address fails the
handshake), a node starts from its provisioning bundle, and a wiped store does not take an
old directive. Real Consul agents and real tiers on 127.0.0.1."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from harness.processes import BIN, free_port, start_tier
from registry.trust import pki
from tests.conftest import RegistryCli
from tests.faults import http_peer
from tests.integration.test_identity import ESCALATE, ForgedCenter, register, tiers
from tests.integration.test_sync import wait_for
from tests.servers import start
from tiered import bundles
from tiered.stack import Stack

pytestmark = pytest.mark.integration
SECRET = "node-identity-secret-0123456789"


@pytest.fixture
def consul(tmp_path: Path) -> Iterator[Stack]:
    """A real Consul dev agent without ACLs: the attacker holds a token that may write the
    role's service (ACLs cannot restrict by service id), and the controls must hold anyway."""
    stack = Stack(tmp_path / "consul", tmp_path / "home", SECRET, consul_port=free_port(),
                  consul_acl=False)
    try:
        stack.start_consul()
        yield stack
    finally:
        stack.stop()


def agent_entry(consul: Stack, service_id: str) -> dict[str, object] | None:
    response = httpx.get(f"http://{consul.consul}/v1/agent/service/{service_id}", timeout=5)
    return response.json() if response.status_code == 200 else None


def test_a_moved_catalog_entry_is_put_back(tmp_path: Path, consul: Stack) -> None:
    edge = start_tier("edge", tmp_path / "edge", tmp_path, "--grpc-port", "0",
                      "--poll-interval-s", "0.2", until="live",
                      env={"PATH": str(BIN), "CONSUL_HTTP_ADDR": consul.consul})
    try:
        wait_for(lambda: agent_entry(consul, edge.node_id) is not None, 20,
                 "the edge registered")
        real = agent_entry(consul, edge.node_id)
        assert real is not None and real["Port"] == edge.port
        # the attack: the edge role's token re-registers the real edge's id at a listener of
        # its own, same name, same meta (what nginx and the renderer key on)
        mine = free_port()
        httpx.put(f"http://{consul.consul}/v1/agent/service/register", timeout=5, json={
            "Name": "tiered-edge", "ID": edge.node_id, "Address": "127.0.0.1", "Port": mine,
            "Tags": real["Tags"], "Meta": real["Meta"]}).raise_for_status()
        # the agent applied it before answering; the edge puts its own entry back
        took = wait_for(lambda: (agent_entry(consul, edge.node_id) or {}).get("Port")
                        == edge.port, 5, f"{edge.node_id} back from the attacker's port {mine}")
        print(f"entry put back after {took:.2f} s")
        wait_for(lambda: "registering it again" in edge.log.read_text(), 5,
                 "the warning logged")
        line = next(x for x in edge.log.read_text().splitlines() if "registering it again" in x)
        assert f"port: {mine} != {edge.port}" in line
        # and it stays put (no tug of war with itself)
        time.sleep(2.5)
        entry = agent_entry(consul, edge.node_id)
        assert entry is not None and entry["Port"] == edge.port
        assert edge.log.read_text().count("registering it again") == 1
    finally:
        edge.stop()


def test_a_center_entry_moved_to_another_centers_listener_gets_no_rows(
        tmp_path: Path, tiny_release: Path, consul: Stack) -> None:
    """The attacker owns center-b's box: its center Consul token, its bundle (a genuine center
    certificate from the fleet CA). It registers ``center-a``'s id at a listener of its own
    serving center-b's certificate, to read users' inputs and forge answers. Before, edges
    checked only the center role name, which every center certificate carries."""
    cli = RegistryCli(tmp_path / "registry")
    cli("publish", tiny_release, "--name", "tiny")
    for tier in ("center", "edge"):
        cli("pull", "tiny", "--tier", tier, "--store", tmp_path / tier)
    tls = tmp_path / "tls"
    pki.ca(tls)
    stolen = bundles.make(tls, SECRET, "center-b", "center", "local", ("127.0.0.1",))
    (tmp_path / "b.pem").write_text(stolen.cert)
    (tmp_path / "b.key").write_text(stolen.key)
    ForgedCenter.bodies = []
    center_a = bundles.write(tmp_path / "bundles", tls, SECRET, "center-a", "center", "local",
                             ("127.0.0.1",))
    edge = None
    with http_peer(ForgedCenter, (tmp_path / "b.pem", tmp_path / "b.key")) as forged:
        register(consul, "tiered-center", "center-a", forged.server_address[1])
        # the real center-a, started from its bundle (not in Consul yet: no tug of war here)
        center = start_tier("center", tmp_path / "center", tmp_path, "--bundle", str(center_a),
                            "--poll-interval-s", "0.2", env={"PATH": str(BIN)},
                            ca=tls / "ca.pem", node_id="center-a")
        try:
            edge = start("edge", tmp_path / "edge", tmp_path, "--center-ca",
                         str(tls / "ca.pem"), "--cache-size", "0", "--breaker-failures", "100",
                         env={"CONSUL_HTTP_ADDR": consul.consul})
            url = f"{edge.url}/v2/models/tiny/infer"
            wait_for(lambda: "tiered-center passing" in edge.log.read_text(), 20,
                     "the edge following Consul's centers")
            for _ in range(3):
                answer = httpx.post(url, json=ESCALATE, timeout=10).json()
                assert "666" not in json.dumps(answer)
                assert tiers(answer) == ["edge-degraded"]
            assert ForgedCenter.bodies == []  # not one user's input reached the impostor
            # center-a's entry at center-a's address: escalations go there
            register(consul, "tiered-center", "center-a", center.port)
            wait_for(lambda: tiers(httpx.post(url, json=ESCALATE, timeout=10).json())
                     == ["center"], 30, "an escalation answered by the real center-a")
            assert ForgedCenter.bodies == []
        finally:
            if edge is not None:
                edge.stop()
            center.stop()
