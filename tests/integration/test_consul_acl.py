"""Consul as ``tiered up`` runs it: ACLs on (default deny), the management token in a 0600 file
(never in argv), one token per role. A real agent on loopback; no Tiered process is needed to
see who may register what."""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import consul.aio
import httpx
import pytest

from harness.processes import BIN, free_port
from serving.errors import InvalidInstance
from serving.fleet import discovery
from tiered.consul_acl import CONSUL_ROLES, ConsulAcl
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


def test_an_edge_registers_ids_consul_can_delete_and_refuses_others(stack: Stack) -> None:
    """An id with a control character would stay for good (Consul answers its deregistration
    400, even with the management token): the node never sends one. One with ``:`` and ``@``
    (what node ids allow) registers and deregisters."""
    management = stack.consul_tokens["management"]

    def registration(client: consul.aio.Consul, service_id: str) -> discovery.Registration:
        return discovery.Registration(client, "tiered-edge", service_id, "127.0.0.1", 9,
                                      discovery.http_check("http://127.0.0.1:9/"), ["edge"],
                                      dict)

    async def scenario() -> None:
        client = discovery.client(stack.consul, stack.consul_tokens["edge"])
        try:
            with pytest.raises(InvalidInstance, match="service id"):
                registration(client, "edge-eu-1\x01")
            ours = registration(client, "edge-eu-1:a@b")
            await ours.ensure()
            assert "edge-eu-1:a@b" in read(stack, "/v1/agent/services", management)[1]
            await ours.deregister()
        finally:
            await client.close()

    asyncio.run(scenario())
    services = read(stack, "/v1/agent/services", management)[1]
    assert not [sid for sid in services if sid.startswith("edge-eu-1")], services


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
    policies exist (updated), the tokens are new (created); a second run changes nothing.
    Refused: a missing secret, one that is no UUID (it would go into a header and JSON)."""
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
    for bad in ("a b", "x\nX-Evil: 1", 'q"uote'):
        refused = subprocess.run(["sh", script], env={**env, "CONSUL_READER_TOKEN": bad},
                                 capture_output=True, text=True, timeout=120)
        assert refused.returncode == 2 and "CONSUL_READER_TOKEN must be a UUID" in refused.stderr


class ArgvWatch(threading.Thread):
    """Reads every process's argv (``/proc/*/cmdline``, what ``ps`` shows anyone) over and over
    until stopped: the argvs that hold any of ``secrets``, and how many argvs naming ``seen``
    it met (the script's calls to its agent: a watch that saw none of them cannot pass)."""

    def __init__(self, secrets: list[str], seen: str) -> None:
        super().__init__(daemon=True)
        self.secrets, self.seen = [s.encode() for s in secrets], seen.encode()
        self.leaks: list[bytes] = []
        self.calls = self.sweeps = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            for pid in os.listdir("/proc"):
                if not pid.isdigit():
                    continue
                try:
                    argv = Path(f"/proc/{pid}/cmdline").read_bytes()
                except OSError:
                    continue  # gone already
                if any(secret in argv for secret in self.secrets):
                    self.leaks.append(argv)
                self.calls += self.seen in argv
            self.sweeps += 1


def test_acl_setup_puts_no_secret_in_any_process_argv(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh agent with ACLs on and nothing made yet: acl-setup.sh creates every policy and
    token, then (second run) updates the policies and keeps the tokens, the management token
    read from CONSUL_HTTP_TOKEN_FILE. Every process's argv is sampled all along: none holds
    any of the six secrets (the script's curl calls read them from a 0600 file or stdin)."""

    def acl_up_only(acl: ConsulAcl, consul: str) -> bool:  # the ACL system, no policy made
        answer = httpx.get(f"http://{consul}/v1/acl/token/self", timeout=5,
                           headers={"X-Consul-Token": acl.tokens["management"]})
        return answer.status_code == 200

    monkeypatch.setattr(ConsulAcl, "setup", acl_up_only)
    fresh = Stack(tmp_path, tmp_path / "registry", "unused", http_port=free_port(),
                  consul_port=free_port())
    try:
        fresh.start_consul()
        management = fresh.consul_tokens["management"]
        assert read(fresh, "/v1/acl/policy/name/tiered-edge", management)[0] != 200
        secrets = {f"CONSUL_{r.upper()}_TOKEN": str(uuid.uuid4()) for r in CONSUL_ROLES}
        env = {"PATH": f"{BIN}:/usr/bin:/bin", "CONSUL_HTTP_ADDR": fresh.consul,
               "CONSUL_HTTP_TOKEN_FILE": str(fresh.acl.token_file), **secrets}
        watch = ArgvWatch([management, *secrets.values()], f"{fresh.consul}/v1/acl/")
        watch.start()
        try:
            runs = [subprocess.run(["sh", str(CONSUL_CONFIG.parent / "acl-setup.sh")], env=env,
                                   capture_output=True, text=True, timeout=120)
                    for _ in range(2)]
        finally:
            watch.done.set()
            watch.join(timeout=30)
        for run, made in zip(runs, ("created", "exists"), strict=True):
            assert run.returncode == 0, run.stderr
            assert run.stdout.count(f"token {made}") == len(CONSUL_ROLES), run.stdout
        assert watch.leaks == [], "a secret in a process's argv"
        assert watch.calls > 0 and watch.sweeps > 2, "the watch never saw the script's calls"
        for role in CONSUL_ROLES:
            status, policy = read(fresh, f"/v1/acl/policy/name/tiered-{role}", management)
            assert status == 200 and policy["Rules"] == \
                (CONSUL_CONFIG.parent / "policies" / f"{role}.hcl").read_text()
        edge = secrets["CONSUL_EDGE_TOKEN"]
        assert register(fresh, "tiered-edge", edge).status_code == 200
        assert register(fresh, "tiered-center", edge).status_code == 403
    finally:
        fresh.stop()
