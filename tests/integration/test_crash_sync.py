"""SIGKILL ``registry serve`` while a real fleet syncs, and ``registry rollback`` mid-run.

One registry, one center and one edge subscribed with ``--registry`` (tiny releases). The
registry is killed at moments observed in its database, not after a guessed delay: (a) while a
node downloads and installs a new version (it has acknowledged DOWNLOADING, not yet ACTIVE:
their first sync from empty stores, a real ``publish``, re-published versions whose bytes they
copy locally) and (b) during ``rollback``/``promote`` rollouts (a seeded choice: at once after
the commit, or once the first node has acknowledged ACTIVE); the ``registry rollback`` command
itself is killed mid-run too. After every kill the database passes ``integrity_check``, the
audit chain verifies and no half version is visible; after the registry is restarted on the
same port every node converges: ``registry status`` shows it ACTIVE on the desired version,
and the node answers with that version.
"""

from __future__ import annotations

import contextlib
import random
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from harness.processes import RegistryProcess, start_registry, start_tier
from registry.releases.catalog import Catalog
from tests.conftest import REGISTRY, RegistryCli
from tests.integration.test_crash import check_consistent
from tests.integration.test_sync import (
    BODY,
    REGISTRY_ENV,
    SYNC_FLAGS,
    TOKEN,
    node_id,
    served,
    status,
    wait_for,
)
from tests.servers import Server

pytestmark = [pytest.mark.integration, pytest.mark.slow]
SEED = 20261201
# node acks written every 20 ms, not every 250: a node's DOWNLOADING and ACTIVE acks (0.1-0.3 s
# apart) land in different commits, so the kills can be timed between them
ENV = {**REGISTRY_ENV, "REGISTRY_NODE_WRITE_INTERVAL_S": "0.02"}


@dataclass
class Crashes:
    root: Path
    cli: RegistryCli
    registry: RegistryProcess
    nodes: list[Server]
    rng: random.Random
    kills: int = 0
    mid_rollout: int = 0  # kills before the registry had recorded every node's ACTIVE ack

    def commit_then_kill(self, *args: str | Path, downloads: bool = False) -> int:
        """Run ``registry ARGS`` (a command that moves production), then SIGKILL ``registry
        serve`` during the rollout that follows the commit: while a node downloads
        (``downloads``), else at once after the commit (before the push) or once the first
        node has acknowledged the new version ACTIVE (the other still swapping), a seeded
        choice. Returns the new production version."""
        before, seen = self.production(), self.last_seq()
        command = subprocess.Popen([str(REGISTRY), *map(str, args)], env=self.cli.env(),
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for(lambda: self.production() != before, 120, f"registry {args} to commit",
                     poll=0.005)
            if downloads:
                self.kill_while_downloading(self.production())
            else:
                if self.rng.random() < 0.5:
                    want = self.production()
                    wait_for(lambda: self.acks(want, "ACTIVE", seen), 30,
                             f"a node's ACTIVE ack of version {want}", poll=0.005)
                self.kill_registry()
        finally:
            assert command.wait(timeout=120) == 0
        return self.production()

    def kill_registry(self) -> None:
        """SIGKILL ``registry serve`` now; count whether the rollout of the production version
        was still under way (read from the database the kill left)."""
        self.registry.kill()
        self.kills += 1
        want, rows = self.production(), status(self.cli)
        if any((rows.get(node_id(n), {}).get("state"), rows.get(node_id(n), {}).get("version"))
               != ("ACTIVE", want) for n in self.nodes):
            self.mid_rollout += 1

    def restart_registry(self) -> None:
        self.registry = start_registry(self.cli.home, self.root, TOKEN, port=self.registry.port,
                                       env=ENV)

    def query(self, sql: str, *params: object) -> list[tuple[object, ...]]:
        """Read straight from the database (read-only: no CLI start-up in the timing)."""
        uri = f"file:{self.cli.home / 'registry.sqlite3'}?mode=ro"
        with contextlib.closing(sqlite3.connect(uri, uri=True)) as db:
            return list(db.execute(sql, params))

    def production(self) -> int:
        rows = self.query("SELECT version FROM aliases WHERE model = 'tiny' AND "
                          "alias = 'production'")
        return int(str(rows[0][0])) if rows else 0

    def last_seq(self) -> int:
        rows = self.query("SELECT COALESCE(MAX(seq), 0) FROM audit")
        return int(str(rows[0][0]))

    def acks(self, version: int, state: str, after: int = 0) -> dict[str, int]:
        """Node (audit actor) -> seq of its latest ``state`` ack of ``version`` after ``after``."""
        return {str(actor): int(str(seq)) for actor, seq in self.query(
            "SELECT actor, MAX(seq) FROM audit WHERE action = 'ack' AND version = ? AND "
            "json_extract(payload, '$.state') = ? AND seq > ? GROUP BY actor",
            version, state, after)}

    def kill_while_downloading(self, version: int) -> None:
        """SIGKILL ``registry serve`` while a node installs ``version``: it has acknowledged
        DOWNLOADING and not yet ACTIVE (the copy or fetch, load and swap that follow take
        0.1-0.3 s, so the kill lands there). Should every node be ACTIVE on it before that is
        seen (a fast first sync), the kill comes after the rollout instead."""
        def installing() -> bool:
            active = self.acks(version, "ACTIVE")
            return any(seq > active.get(actor, 0)
                       for actor, seq in self.acks(version, "DOWNLOADING").items()) or \
                len(active) == len(self.nodes)

        wait_for(installing, 30, f"a node downloading version {version}", poll=0.002)
        self.kill_registry()

    def rollout(self, kind: str) -> tuple[str, ...]:
        """Arguments of a ``registry`` command that moves production: ``rollback`` (a
        ``promote`` on version 1, where there is nothing to roll back to) or ``promote``."""
        row = self.cli("list", "--json").json()[0]
        current, latest = int(row["production"]), int(row["latest"])
        if kind == "rollback" and current > 1:
            return ("rollback", "tiny")
        other = self.rng.choice([v for v in range(1, latest + 1) if v != current])
        return ("promote", "tiny", "--version", str(other))

    def check(self) -> None:
        """The registry on disk: consistent, and its audit chain verifies through the CLI."""
        check_consistent(self.cli.home)
        self.cli("audit", "--verify")

    def converged(self) -> None:
        """Every node ACTIVE on production in ``registry status`` and answering with it."""
        want = self.production()

        def done() -> bool:
            rows = status(self.cli)
            return all(node_id(n) in rows and
                       (rows[node_id(n)]["state"], rows[node_id(n)]["version"],
                        rows[node_id(n)]["connected"]) == ("ACTIVE", want, True)
                       and served(n) == want for n in self.nodes)

        wait_for(done, 30, f"every node ACTIVE on version {want}")
        for node in self.nodes:
            answer = httpx.post(f"{node.url}/v2/models/tiny/infer", content=BODY, timeout=10)
            assert answer.status_code == 200 and answer.json()["model_version"] == str(want)


@pytest.fixture
def crashes(tmp_path: Path, tiny_release: Path) -> Iterator[Crashes]:
    cli = RegistryCli(tmp_path / "registry")
    cli("publish", tiny_release, "--name", "tiny")  # version 1
    registry = start_registry(cli.home, tmp_path, TOKEN, env=ENV)
    fleet = Crashes(tmp_path, cli, registry, [], random.Random(SEED))
    try:
        # empty stores: the first kill lands while they download version 1
        center = start_tier("center", tmp_path / "center", tmp_path, "--registry",
                            registry.target, *SYNC_FLAGS, "--poll-interval-s", "0.2",
                            until="live", registry_secret=TOKEN)
        fleet.nodes.append(center)
        fleet.nodes.append(start_tier("edge", tmp_path / "edge", tmp_path, "--registry",
                                      registry.target, "--center-url", center.url, *SYNC_FLAGS,
                                      "--poll-interval-s", "0.2", until="live",
                                      registry_secret=TOKEN))
        yield fleet
    finally:
        for node in fleet.nodes:
            node.stop()
        fleet.registry.stop()


def republish(cli: RegistryCli, version: int) -> int:
    """Commit a new version with ``version``'s artifacts (what ``publish`` commits, minus the
    build): the nodes copy the bytes they hold, then load, swap and acknowledge."""
    catalog: Catalog = cli.catalog()
    try:
        return catalog.create_version(catalog.resolve("tiny", str(version)).manifest)
    finally:
        catalog.db.conn.close()


def kill_cli_mid_run(fleet: Crashes, full: float, *args: str, blocked: bool = False) -> bool:
    """Run ``registry ARGS`` and SIGKILL it at a random moment of its usual run time; True if
    it was killed (False: it finished first). ``blocked``: the test holds the database's write
    lock meanwhile, so the command cannot finish (it waits for the lock after start-up) and the
    kill lands mid-run whatever the machine's speed."""
    lock = sqlite3.connect(fleet.cli.home / "registry.sqlite3", isolation_level=None)
    try:
        if blocked:
            lock.execute("BEGIN IMMEDIATE")
        proc = subprocess.Popen([str(REGISTRY), *args], env=fleet.cli.env(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            proc.wait(timeout=fleet.rng.uniform(0.3, 1.1) * full)
            return False
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
            return True
    finally:
        if blocked:
            lock.execute("ROLLBACK")
        lock.close()


def test_sigkill_registry_serve_during_sync_and_rollouts(crashes: Crashes,
                                                         tiny_release_b: Path) -> None:
    fleet, rng = crashes, crashes.rng
    # (a) the first sync: a download into an empty store
    fleet.kill_while_downloading(1)
    fleet.check()
    fleet.restart_registry()
    fleet.converged()
    # (a) a real publish (new artifacts: both nodes download them), then re-published versions
    # (bytes copied locally) and (b) rollback/promote rollouts; sometimes another rollback is
    # committed while the registry is down
    fleet.commit_then_kill("publish", tiny_release_b, "--name", "tiny", downloads=True)  # v2
    for kind in ("republish", "rollback", "promote", "republish"):
        fleet.check()
        if rng.random() < 0.4:
            fleet.cli(*fleet.rollout("rollback"))
            fleet.check()
        fleet.restart_registry()
        fleet.converged()
        if kind == "republish":
            fleet.kill_while_downloading(republish(fleet.cli, rng.choice([1, 2])))
        else:
            fleet.commit_then_kill(*fleet.rollout(kind))
    fleet.check()
    fleet.restart_registry()
    fleet.converged()
    # the rollback command killed mid-run (registry serve stays up)
    republish(fleet.cli, 1)  # production > 1 from here on: there is always a version below
    started = time.monotonic()
    fleet.cli("rollback", "tiny")
    full = time.monotonic() - started
    killed = 0
    for attempt in range(4):  # two kill at a random moment, two while it waits for the lock
        republish(fleet.cli, 2)
        killed += kill_cli_mid_run(fleet, full, "rollback", "tiny", blocked=attempt % 2 == 1)
        fleet.check()
        fleet.converged()
    print(f"registry serve killed {fleet.kills} times, {fleet.mid_rollout} of them before "
          f"every node's ACTIVE ack was recorded; registry rollback killed {killed} of 4 times")
    assert fleet.mid_rollout >= 3, "the kills missed the rollouts"
    assert killed >= 2
