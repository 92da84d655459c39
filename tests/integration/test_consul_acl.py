"""Consul as ``tiered up`` runs it: ACLs on (default deny), the management token in a 0600 file
(never in argv), one token per role. A real agent on loopback; no Tiered process is needed to
see who may register what."""

from __future__ import annotations

import stat
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.processes import BIN, free_port
from tiered.consul_acl import CONSUL_ROLES
from tiered.stack import CONSUL_CONFIG, Stack

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("acl")
    consul_only = Stack(root, root / "registry", "unused", http_port=free_port(),
                        consul_port=free_port())
    try:
        consul_only.start_consul()
        yield consul_only
    finally:
        consul_only.stop()


def register(stack: Stack, service: str, token: str | None) -> httpx.Response:
    """What a node's registration sends (a fake node: nothing listens on the port)."""
    headers = {"X-Consul-Token": token} if token else {}
    return httpx.put(f"http://{stack.consul}/v1/agent/service/register", headers=headers,
                     json={"Name": service, "ID": f"fake-{service}", "Address": "127.0.0.1",
                           "Port": 9, "Meta": {"region": "eu"}}, timeout=5)


def read(stack: Stack, path: str, token: str | None) -> Any:
    headers = {"X-Consul-Token": token} if token else {}
    answer = httpx.get(f"http://{stack.consul}{path}", headers=headers, timeout=5)
    return answer.status_code, answer.json() if answer.status_code == 200 else answer.text


@pytest.mark.parametrize("service", ["tiered-center", "tiered-registry", "tiered-edge"])
@pytest.mark.parametrize("holder", [None, "not-a-token", "reader", "other role"])
def test_who_may_not_register_a_service(stack: Stack, service: str, holder: str | None) -> None:
    """No token, a made-up one, the read-only one, another role's: 403."""
    role = service.removeprefix("tiered-")
    token = {"reader": stack.consul_tokens["reader"],
             "other role": stack.consul_tokens["edge" if role != "edge" else "center"]
             }.get(str(holder), holder)
    answer = register(stack, service, token)
    assert answer.status_code == 403, answer.text
    assert f"fake-{service}" not in read(stack, "/v1/agent/services",
                                         stack.consul_tokens["management"])[1]


@pytest.mark.parametrize("role", ["center", "registry", "edge"])
def test_a_role_registers_its_own_service_and_reads_what_it_follows(stack: Stack,
                                                                     role: str) -> None:
    token = stack.consul_tokens[role]
    assert register(stack, f"tiered-{role}", token).status_code == 200
    management = stack.consul_tokens["management"]
    assert f"fake-tiered-{role}" in read(stack, "/v1/agent/services", management)[1]
    seen = read(stack, f"/v1/health/service/tiered-{role}", stack.consul_tokens["reader"])
    assert [e["Service"]["ID"] for e in seen[1]] == [f"fake-tiered-{role}"]
    if role == "edge":  # edges follow the centers
        assert read(stack, "/v1/health/service/tiered-center", token)[0] == 200


def test_anonymous_reads_see_nothing(stack: Stack) -> None:
    assert register(stack, "tiered-edge", stack.consul_tokens["edge"]).status_code == 200
    for path in ("/v1/catalog/services", "/v1/agent/services"):
        status, body = read(stack, path, None)
        assert status == 403 or not body, (path, body)
    assert read(stack, "/v1/health/service/tiered-edge", None) == (200, [])
    assert read(stack, "/v1/acl/tokens", None)[0] == 403


def test_the_management_token_is_in_a_private_file_not_in_argv(stack: Stack) -> None:
    token = stack.consul_tokens["management"]
    file = stack.acl.token_file
    assert file.read_text().strip() == token
    for path in (file, stack.root / "consul" / "acl.json"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert stat.S_IMODE(file.parent.stat().st_mode) == 0o700
    argv = Path(f"/proc/{stack.children['consul'].pid}/cmdline").read_bytes()
    assert not any(t.encode() in argv for t in stack.consul_tokens.values())
    assert read(stack, "/v1/acl/token/self", token)[0] == 200


def test_compose_acl_setup_script_against_a_real_agent(stack: Stack) -> None:
    """consul/acl-setup.sh (docker-compose.yml's consul-acl job) with other secrets: the
    policies exist (updated), the tokens are new (created); a second run changes nothing."""
    secrets = {f"CONSUL_{r.upper()}_TOKEN": str(uuid.uuid4()) for r in CONSUL_ROLES}
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "CONSUL_HTTP_ADDR": stack.consul,
           "CONSUL_HTTP_TOKEN": stack.consul_tokens["management"], **secrets}
    script = str(CONSUL_CONFIG.parent / "acl-setup.sh")
    for made in ("created", "exists"):
        run = subprocess.run(["sh", script], env=env, capture_output=True, text=True,
                             timeout=120)
        assert run.returncode == 0, run.stderr
        assert run.stdout.count(f"token {made}") == len(CONSUL_ROLES), run.stdout
    edge = secrets["CONSUL_EDGE_TOKEN"]
    assert register(stack, "tiered-center", edge).status_code == 403
    assert register(stack, "tiered-edge", edge).status_code == 200
    missing = subprocess.run(["sh", script], env={**env, "CONSUL_EDGE_TOKEN": ""},
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "CONSUL_EDGE_TOKEN is not set" in missing.stderr
