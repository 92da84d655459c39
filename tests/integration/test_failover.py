"""Lose the registry's host, lose nothing: a primary and two standbys elected through a real
Consul lock, in a running fleet (centers, edges, nginx) with clients going through nginx.

The tests share one fleet and run in file order: each kills the registry that is primary at
that moment and checks the takeover, then brings the old one back as a standby.
"""

from __future__ import annotations

import json
import shutil
import signal
import sqlite3
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.processes import BIN, free_port
from tests.conftest import RegistryCli
from tiered.children import Child
from tiered.stack import Stack

pytestmark = [pytest.mark.integration, pytest.mark.slow]
BODY = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["fine film"]}]}
SECRET = "failover-token-0123456789"


def wait_for(what: str, ready: Callable[[], bool], timeout: float = 60) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        try:
            if ready():
                return time.monotonic() - started
        except (sqlite3.Error, httpx.HTTPError, OSError):
            pass
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout}s: {what}")


def role(home: Path) -> str:
    with sqlite3.connect(f"file:{home / 'registry.sqlite3'}?mode=ro", uri=True) as conn:
        return str(conn.execute("SELECT role FROM replication_state").fetchone()[0])


def leading(home: Path) -> bool:
    """The registry at ``home`` is the primary with an unexpired lease (a killed primary's file
    still says primary; its lease has run out)."""
    if not (home / "registry.sqlite3").exists():
        return False
    with sqlite3.connect(f"file:{home / 'registry.sqlite3'}?mode=ro", uri=True) as conn:
        # a registry starting up has created its file but not yet its schema: not leading
        if conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'replication_state'"
                        ).fetchone() is None:
            return False
        row = conn.execute("SELECT role, lease_until FROM replication_state").fetchone()
    return bool(row[0] == "primary" and row[1] > time.time())


def versions(home: Path, model: str = "tiny") -> list[int]:
    with sqlite3.connect(f"file:{home / 'registry.sqlite3'}?mode=ro", uri=True) as conn:
        return [int(r[0]) for r in conn.execute("SELECT version FROM versions WHERE model = ? "
                                                "ORDER BY version", (model,))]


def chain(home: Path) -> list[tuple[int, str, str]]:
    with sqlite3.connect(f"file:{home / 'registry.sqlite3'}?mode=ro", uri=True) as conn:
        return [(int(s), str(a), str(h)) for s, a, h in
                conn.execute("SELECT seq, action, hash FROM audit ORDER BY seq")]


@dataclass
class Clients:
    """Requests through nginx, one after another on two threads, until stopped."""

    url: str
    stop: threading.Event = field(default_factory=threading.Event)
    answered: int = 0
    failed: list[str] = field(default_factory=list)

    def run(self) -> None:
        with httpx.Client(timeout=10) as client:
            while not self.stop.is_set():
                try:
                    r = client.post(f"{self.url}/v2/models/tiny/infer", json=BODY)
                    if r.status_code == 200:
                        self.answered += 1
                    else:
                        self.failed.append(f"{r.status_code} {r.text[:100]}")
                except httpx.HTTPError as exc:
                    self.failed.append(repr(exc))
                time.sleep(0.02)


@dataclass
class Group:
    stack: Stack
    clis: dict[str, RegistryCli]

    def primary(self) -> str:
        """The registry child that is primary now (waits for one)."""
        found: list[str] = []

        def one() -> bool:
            found[:] = [n for n, cli in self.clis.items() if leading(cli.home)]
            return len(found) == 1

        wait_for("exactly one primary", one)
        return found[0]

    def others(self, name: str) -> list[str]:
        return [n for n in self.clis if n != name]

    def all_hold(self, home: Path) -> bool:
        """Every registry holds the same audit chain as ``home``."""
        ours = chain(home)
        return all(chain(cli.home) == ours for cli in self.clis.values())


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory, tiny_release: Path) -> Iterator[Group]:
    root = tmp_path_factory.mktemp("failover")
    stack = Stack(root, root / "registry", SECRET, http_port=free_port(),
                  consul_port=free_port(), standbys=2, regions=("eu",),
                  nginx_flags=("--rate", "1000", "--burst", "500"))
    key = str(stack.signing_key)
    clis = {name: _Cli(home, key=key) for name, home in stack.registry_homes().items()}
    clis["registry"]("publish", tiny_release, "--name", "tiny")
    try:
        stack.up(timeout=180)
        yield Group(stack, clis)
    finally:
        stack.stop()


@dataclass
class _Cli(RegistryCli):
    key: str = ""

    def __call__(self, *args: str | Path, check: bool = True, timeout: float = 120,
                 env: dict[str, str] | None = None) -> Any:
        self.extra = env or {}
        try:
            return super().__call__(*args, check=check, timeout=timeout)
        finally:
            self.extra = {}

    def env(self) -> dict[str, str]:
        return {**super().env(), "REGISTRY_SIGNING_KEY": self.key, **self.extra}


def nodes_run(stack: Stack, version: int) -> bool:
    """Every center and edge reports ``version`` of tiny as what it serves."""
    for name, child in stack.children.items():
        if child.role not in ("center", "edge"):
            continue
        current = stack.root / "stores" / name / "tiny" / "CURRENT"
        if not current.is_file() or current.read_text().strip() != str(version):
            return False
    return True


def kill(stack: Stack, name: str) -> Child:
    child = stack.children[name]
    child.process.send_signal(signal.SIGKILL)
    child.process.wait(10)
    return child


def restart(stack: Stack, child: Child) -> None:
    stack.spawn(child.name, child.argv, child.port, child.role,
                env={"REGISTRY_HOME": str(child.argv[child.argv.index("--home") + 1])})


def test_an_acknowledged_publish_is_on_a_standby_when_the_command_returns(
        group: Group, tiny_release: Path) -> None:
    primary = group.primary()
    standbys = group.others(primary)
    for name in standbys:
        wait_for("each standby holds version 1", lambda n=name: versions(  # type: ignore[misc]
            group.clis[n].home) == [1])
    published = group.clis[primary]("publish", tiny_release, "--name", "tiny", "--json").json()
    # semi-synchronous: read the standbys' databases the moment the command returned
    version = published["manifest"]["version"]
    assert any(versions(group.clis[n].home) == [1, version] for n in standbys)
    wait_for("every node runs it", lambda: nodes_run(group.stack, version), 120)
    wait_for("both standbys hold it", lambda: group.all_hold(group.clis[primary].home))
    wait_for("the primary lists both standbys, none behind", lambda: [
        s["behind"] for s in group.clis[primary]("replication", "--json").json()["standbys"]]
        == [0, 0])
    for name in standbys:
        shown = group.clis[name]("replication", "--json").json()
        assert (shown["role"], shown["writable"]) == ("standby", False)
        assert shown["primary"] == f"127.0.0.1:{group.stack.children[primary].port}"


def test_with_its_standbys_gone_a_change_stands_on_the_primary_alone_and_says_so(
        group: Group) -> None:
    stack = group.stack
    primary = group.primary()
    cli = group.clis[primary]
    gone = [kill(stack, name) for name in group.others(primary)]
    try:
        result = cli("cascade", "tiny", "--mode", "static", "--capacity", "77", check=False,
                     env={"REGISTRY_SYNC_TIMEOUT_S": "1"})
        assert result.code == 0, result.stderr
        assert "replicated asynchronously" in result.stderr
        assert cli("replication", "--json").json()["async_commits"] >= 1
    finally:
        for child in gone:
            restart(stack, child)
    wait_for("the standbys caught up after coming back", lambda: group.all_hold(cli.home), 120)
    assert group.primary() == primary
    assert [role(group.clis[n].home) for n in group.others(primary)] == ["standby"] * 2


def test_sigkill_of_the_primary_under_load_with_a_publish_in_flight(
        group: Group, tiny_release: Path) -> None:
    stack = group.stack
    primary = group.primary()
    clients = Clients(stack.url)
    threads = [threading.Thread(target=clients.run) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        before = versions(group.clis[primary].home)
        in_flight = subprocess.Popen(
            [str(BIN / "registry"), "publish", str(tiny_release), "--name", "tiny", "--json"],
            env=group.clis[primary].env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)
        time.sleep(1.0)
        killed_at = time.monotonic()
        old = kill(stack, primary)
        # the first write a standby's home accepts: a cheap one, tried until one is accepted
        candidates = [group.clis[n] for n in group.others(primary)]
        accepted = wait_for("a write accepted by a new primary", lambda: any(cli(
            "cascade", "tiny", "--mode", "static", "--capacity", "100", check=False).code == 0
            for cli in candidates), 60)
        failover_s = time.monotonic() - killed_at
        new = group.clis[group.primary()]
        out, errors = in_flight.communicate(timeout=120)
        assert role(new.home) == "primary"
        print(f"failover: {failover_s:.1f}s from SIGKILL to the first accepted write "
              f"({accepted:.1f}s of trying)")
        assert failover_s < 30
        after = versions(new.home)
        if in_flight.returncode == 0:  # acknowledged: it must be on the new primary
            assert json.loads(out)["manifest"]["version"] in after
        else:  # refused or not confirmed by a standby: said so, and nothing half-done
            assert "primary" in errors or "standby" in errors, errors
        assert after[: len(before)] == before
        # a second publish on the new primary reaches every node
        published = new("publish", tiny_release, "--name", "tiny", "--json").json()
        wait_for("every node runs the new primary's release",
                 lambda: nodes_run(stack, published["manifest"]["version"]), 180)
        assert new("audit", "--verify", "--json").json()["ok"]
        # the old primary returns: it follows, and its history ends up the new primary's
        restart(stack, old)
        wait_for("the old primary follows", lambda: role(group.clis[primary].home) ==
                 "standby", 60)
        wait_for("the old primary and the other standby hold the new primary's chain",
                 lambda: group.all_hold(new.home), 120)
        assert group.clis[primary]("audit", "--verify", "--json").json()["ok"]
        refused = group.clis[primary]("cascade", "tiny", "--mode", "static", "--capacity", "5",
                                      check=False)
        assert refused.code == 6 and "standby" in refused.stderr, refused
        actions = [a for _, a, _ in chain(new.home)]
        assert actions.count("registry-promote") >= 2
    finally:
        clients.stop.set()
        for t in threads:
            t.join(30)
    assert clients.answered > 0
    assert clients.failed == [], clients.failed[:5]


def test_the_primary_s_disk_wiped_it_comes_back_empty_and_copies_everything(
        group: Group, tiny_release: Path) -> None:
    stack = group.stack
    primary = group.primary()
    wait_for("the standbys caught up", lambda: group.all_hold(group.clis[primary].home))
    held = chain(group.clis[primary].home)
    old = kill(stack, primary)
    home = group.clis[primary].home
    shutil.rmtree(home)
    new = group.clis[group.primary()]  # one of the standbys, elected
    assert new.home != home
    assert chain(new.home)[: len(held)] == held  # nothing acknowledged is missing
    published = new("publish", tiny_release, "--name", "tiny", "--json").json()
    assert published["manifest"]["version"] in versions(new.home)
    restart(stack, old)
    wait_for("the wiped registry copied everything back",
             lambda: (home / "registry.sqlite3").exists() and group.all_hold(new.home), 120)
    assert group.clis[primary]("audit", "--verify", "--json").json()["ok"]
    assert role(home) == "standby"
