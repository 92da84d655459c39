"""deploy/sites/*.yml, the per-role compose files an operator runs on each site's hosts, checked
by the real Compose binary (``config``) without an engine, as ``test_compose.py`` does for the
single-host file: every address, token and CA comes from settings; nothing runs without one;
across sites there is no plaintext path (TLS sync, HTTPS escalation, encrypted gossip, ACLs)."""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_compose import ROOT, compose_binary

pytestmark = pytest.mark.integration

SITES = ROOT / "deploy" / "sites"
FILES = ("consul-server.yml", "center-site.yml", "edge-site.yml", "edge-host.yml")
SECRETS = {f"CONSUL_{r}_TOKEN": str(uuid.uuid4())
           for r in ("MANAGEMENT", "AGENT", "REGISTRY", "CENTER", "EDGE", "READER")}
SECRETS |= {"CONSUL_ENCRYPT_KEY": base64.b64encode(secrets.token_bytes(32)).decode(),
            "REGISTRY_TOKEN": f"dummy-{secrets.token_hex(8)}",
            "TIERED_CENTER_TOKEN": f"center-{secrets.token_hex(8)}",
            "TIERED_EDGE_TOKEN": f"edge-{secrets.token_hex(8)}"}
SETTINGS = {"TIERED_ADVERTISE": "10.20.2.10", "TIERED_CONSUL_SERVER_1": "10.20.1.10",
            "TIERED_CONSUL_SERVER_2": "10.20.1.11", "TIERED_CONSUL_SERVER_3": "10.20.1.12",
            "TIERED_SITE": "eu", "TIERED_SITE_AGENT": "10.20.2.10", "TIERED_EDGE_NUMBER": "2",
            "TIERED_TLS_DIR": "/etc/tiered/tls", "TIERED_RELEASE_KEY": "/etc/tiered/signing.pub",
            "TIERED_RELEASE_KEY_DIR": "/var/lib/tiered/release-key"}


def required(name: str) -> set[str]:
    """The variables a file refuses to start without (``${VAR:?...}``)."""
    return set(re.findall(r"\$\{([A-Z0-9_]+):\?", (SITES / name).read_text()))


def config(name: str, unset: str | None = None, **extra: str) -> subprocess.CompletedProcess[str]:
    home = Path(os.environ.get("TMPDIR", "/tmp"))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home)}
    env |= {k: v for k, v in (SECRETS | SETTINGS | extra).items() if k != unset}
    return subprocess.run([str(compose_binary()), "-f", str(SITES / name), "--env-file",
                           os.devnull, "config", "--format", "json"], capture_output=True,
                          text=True, env=env, timeout=60)


def services(name: str, **extra: str) -> dict[str, Any]:
    done = config(name, **extra)
    assert done.returncode == 0 and not done.stderr, done.stderr
    found: dict[str, Any] = json.loads(done.stdout)["services"]
    return found


@pytest.mark.parametrize("name", FILES)
def test_each_role_file_is_valid_and_refuses_to_start_without_any_setting(name: str) -> None:
    found = services(name)
    assert found and all(s["network_mode"] == "host" for s in found.values())
    needed = required(name)
    assert "TIERED_ADVERTISE" in needed
    for variable in sorted(needed):
        done = config(name, unset=variable)
        assert done.returncode != 0 and variable in done.stderr, (variable, done.stderr)


def agent_config(service: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(service["environment"]["CONSUL_LOCAL_CONFIG"])
    return found


@pytest.mark.parametrize("name", ["consul-server.yml", "center-site.yml", "edge-site.yml"])
def test_every_consul_agent_joins_the_three_servers_with_gossip_encryption_and_acls(
        name: str) -> None:
    consul = services(name)["consul"]
    command = consul["command"]
    assert [a for a in command if a.startswith("-retry-join=")] == [
        f"-retry-join={SETTINGS[f'TIERED_CONSUL_SERVER_{i}']}" for i in (1, 2, 3)]
    assert f"-advertise={SETTINGS['TIERED_ADVERTISE']}" in command
    agent = agent_config(consul)
    assert agent["encrypt"] == SECRETS["CONSUL_ENCRYPT_KEY"]
    assert agent["acl"]["enabled"] and agent["acl"]["default_policy"] == "deny"
    assert agent["acl"]["down_policy"] == "extend-cache"  # a cut site keeps its tokens
    assert agent["acl"]["tokens"]["agent"] == SECRETS["CONSUL_AGENT_TOKEN"]
    server = name == "consul-server.yml"
    assert ("-server" in command, "-bootstrap-expect=3" in command) == (server, server)
    assert ("initial_management" in agent["acl"]["tokens"]) == server
    assert agent["node_meta"]["tiered_site"] == ("eu" if name == "edge-site.yml" else "core")


def test_an_edge_site_reaches_the_center_site_only_over_tls() -> None:
    site = services("edge-site.yml")
    extra = services("edge-host.yml")["edge"]
    for edge in (site["edge"], extra):
        env = edge["environment"]
        assert env["EDGE_REGISTRY_CA"] == env["EDGE_CENTER_CA"] == "/etc/tiered/tls/ca.pem"
        assert "EDGE_CENTER_URL" not in env and "EDGE_REGISTRY" not in env  # found in Consul
        assert env["EDGE_REGION"] == "eu" and env["REGISTRY_TOKEN"] == SECRETS["TIERED_EDGE_TOKEN"]
        assert env["EDGE_RELEASE_KEY"] == "/etc/tiered/signing.pub"
    assert site["edge"]["environment"]["EDGE_NODE_ID"] == "eu-edge-1"
    assert extra["environment"]["EDGE_NODE_ID"] == "eu-edge-2"
    assert extra["environment"]["CONSUL_HTTP_ADDR"] == "10.20.2.10:8500"
    entry = site["entry"]["command"]
    assert entry[entry.index("--region") + 1] == "eu"
    assert entry[entry.index("--center-ca") + 1] == "/etc/tiered/tls/ca.pem"
    nearest = services("edge-site.yml", TIERED_FALLBACK_SITES="us,ap")["entry"]["command"]
    assert nearest[nearest.index("--fallback-regions") + 1] == "us,ap"


def test_the_center_site_serves_sync_over_tls_and_the_center_over_https() -> None:
    core = services("center-site.yml")
    registry, center = core["registry"]["environment"], core["center"]["environment"]
    assert registry["REGISTRY_TLS_CERT"] and registry["REGISTRY_TLS_KEY"]
    assert registry["REGISTRY_ADVERTISE"] == SETTINGS["TIERED_ADVERTISE"]
    assert center["CENTER_TLS_CERT"] and center["CENTER_TLS_KEY"]
    assert center["CENTER_REGISTRY_CA"] == "/etc/tiered/tls/ca.pem"
    assert center["REGISTRY_TOKEN"] == SECRETS["TIERED_CENTER_TOKEN"]
    assert "depends_on" not in core["center"]  # `up consul center` on a host of its own


def test_the_site_files_use_the_images_docker_compose_yml_builds() -> None:
    built = set()
    for line in (ROOT / "docker-compose.yml").read_text().splitlines():
        if line.strip().startswith("image: tiered/"):
            built.add(line.split("image:")[1].strip())
    used = {s["image"] for name in FILES for s in services(name).values()
            if s["image"].startswith("tiered/")}
    assert used and used <= built, used - built
