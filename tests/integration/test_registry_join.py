"""A standby whose home starts empty (``REGISTRY_JOIN``), started before the registry that holds
the fleet's history, as Swarm or Kubernetes may start them: it must not win the first election
(which would have the history replaced by its empty database), must lead once it has copied a
primary's, and must then take over when that primary is gone. Real ``registry serve`` processes
and a real Consul lock."""

from __future__ import annotations

import signal
import sqlite3
import time
from pathlib import Path

import pytest

from harness.processes import free_port
from registry.trust import pki
from tests.integration.test_failover import _Cli, chain, leading, versions, wait_for
from tiered.commands import registry_argv
from tiered.stack import Stack

pytestmark = [pytest.mark.integration, pytest.mark.slow]
TTL = {"REGISTRY_LOCK_TTL_S": "2"}


def start(stack: Stack, name: str, home: Path, **env: str) -> None:
    port = free_port()
    stack.spawn(name, registry_argv(home, port, free_port()), port, "registry",
                env={"REGISTRY_HOME": str(home), **TTL, **env})


def role_of(home: Path) -> str | None:
    try:
        with sqlite3.connect(f"file:{home / 'registry.sqlite3'}?mode=ro", uri=True) as conn:
            return str(conn.execute("SELECT role FROM replication_state").fetchone()[0])
    except (sqlite3.Error, TypeError):
        return None


def test_an_empty_joining_standby_waits_for_the_history_then_can_take_over(
        ha_stack: Stack, tiny_release: Path) -> None:
    stack = ha_stack
    history = _Cli(stack.registry_home, key=str(stack.signing_key))
    history("publish", tiny_release, "--name", "tiny")
    held = chain(stack.registry_home)
    joining = stack.registry_homes()["registry-standby-1"]
    pki.fleet(stack.tls, ["127.0.0.1", "localhost"])
    stack.start_consul()
    start(stack, "registry-standby-1", joining, REGISTRY_JOIN="true")
    # alone for three lock TTLs past its start-up grace: it never takes the lock
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline:
        assert not leading(joining), "the empty joining registry took the lock"
        time.sleep(0.2)
    assert "joining (REGISTRY_JOIN)" in (stack.root / "logs" / "registry-standby-1.log"
                                         ).read_text()
    start(stack, "registry", stack.registry_home)
    wait_for("the registry with the history leading", lambda: leading(stack.registry_home), 30)
    wait_for("the joining one copied it", lambda: chain(joining)[: len(held)] == held, 60)
    assert chain(stack.registry_home)[: len(held)] == held  # the history was kept, not replaced
    assert role_of(joining) == "standby"
    # joined: it now leads when the primary is gone
    primary = stack.children["registry"].process
    primary.send_signal(signal.SIGKILL)
    primary.wait(10)
    wait_for("the joined standby taking over", lambda: leading(joining), 60)
    assert versions(joining) == [1]
