"""SIGKILL ``registry serve`` while a real fleet syncs, and ``registry rollback`` mid-run.

One registry, one center and one edge subscribed with ``--registry`` (tiny releases). The
registry is killed at seeded random moments (a) while the nodes download, install and
acknowledge a new version (their first sync from empty stores, a real ``publish``, re-published
versions whose bytes they copy locally) and (b) during ``rollback``/``promote`` rollouts; the
``registry rollback`` command itself is killed mid-run too. After every kill the database
passes ``integrity_check``, the audit chain verifies and no half version is visible; after the
registry is restarted on the same port every node converges: ``registry status`` shows it
ACTIVE on the desired version, and the node answers with that version.
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

from registry.catalog import Catalog
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
from tiered.processes import RegistryProcess, start_registry, start_tier

pytestmark = [pytest.mark.integration, pytest.mark.slow]
SEED = 20261201
KILL_WINDOW_S = 0.3  # after a rollout's commit: the push (0.2 s watch), the swaps, the acks


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
        serve`` at a random moment of the rollout that follows the commit (the push, the nodes'
        swaps and acks), or while the nodes download. Returns the new production version."""
        before = self.production()
        command = subprocess.Popen([str(REGISTRY), *map(str, args)], env=self.cli.env(),
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for(lambda: self.production() != before, 120, f"registry {args} to commit")
            if downloads:
                self.kill_while_downloading(self.production())
            else:
                self.kill_registry_after(self.rng.uniform(0, KILL_WINDOW_S))
        finally:
            assert command.wait(timeout=120) == 0
        return self.production()

    def kill_registry_after(self, delay: float) -> None:
        """SIGKILL ``registry serve`` ``delay`` s from now; count whether the rollout of the
        production version was still under way (read from the database the kill left)."""
        time.sleep(delay)
        self.registry.kill()
        self.kills += 1
        want, rows = self.production(), status(self.cli)
        if any((rows.get(node_id(n), {}).get("state"), rows.get(node_id(n), {}).get("version"))
               != ("ACTIVE", want) for n in self.nodes):
            self.mid_rollout += 1

    def restart_registry(self) -> None:
        self.registry = start_registry(self.cli.home, self.root, TOKEN, port=self.registry.port,
                                       env=REGISTRY_ENV)

    def query(self, sql: str, *params: object) -> list[tuple[object, ...]]:
        """Read straight from the database (read-only: no CLI start-up in the timing)."""
        uri = f"file:{self.cli.home / 'registry.sqlite3'}?mode=ro"
        with contextlib.closing(sqlite3.connect(uri, uri=True)) as db:
            return list(db.execute(sql, params))

    def production(self) -> int:
        rows = self.query("SELECT version FROM aliases WHERE model = 'tiny' AND "
                          "alias = 'production'")
        return int(str(rows[0][0])) if rows else 0

    def kill_while_downloading(self, version: int) -> None:
        """SIGKILL ``registry serve`` in the middle of ack handling: once a node has reported
        DOWNLOADING ``version`` (it copies or fetches, then loads and swaps; its ACTIVE ack
        follows within a few hundred ms)."""
        deadline = time.monotonic() + 30
        while not self.query("SELECT 1 FROM audit WHERE action = 'ack' AND version = ? AND "
                             "json_extract(payload, '$.state') = 'DOWNLOADING'", version):
            assert time.monotonic() < deadline, f"no DOWNLOADING ack of version {version}"
            time.sleep(0.005)  # tight: the swap that follows takes 0.1-0.3 s
        self.kill_registry_after(self.rng.uniform(0, 0.05))

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
    registry = start_registry(cli.home, tmp_path, TOKEN, env=REGISTRY_ENV)
    fleet = Crashes(tmp_path, cli, registry, [], random.Random(SEED))
    try:
        # empty stores: the first kill lands while they download version 1
        center = start_tier("center", tmp_path / "center", tmp_path, "--registry",
                            registry.target, *SYNC_FLAGS, "--poll-interval-s", "0.2",
                            until="live")
        fleet.nodes.append(center)
        fleet.nodes.append(start_tier("edge", tmp_path / "edge", tmp_path, "--registry",
                                      registry.target, "--center-url", center.url, *SYNC_FLAGS,
                                      "--poll-interval-s", "0.2", until="live"))
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


def kill_cli_mid_run(fleet: Crashes, full: float, *args: str) -> bool:
    """Run ``registry ARGS`` and SIGKILL it at a random moment of its usual run time; True if
    it was killed (False: it finished first)."""
    proc = subprocess.Popen([str(REGISTRY), *args], env=fleet.cli.env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        proc.wait(timeout=fleet.rng.uniform(0.3, 1.1) * full)
        return False
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
        return True


def test_sigkill_registry_serve_during_sync_and_rollouts(crashes: Crashes,
                                                         tiny_release_b: Path) -> None:
    fleet, rng = crashes, crashes.rng
    # (a) the center's first sync: a download into an empty store
    fleet.kill_registry_after(rng.uniform(0, 0.3))
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
    for _ in range(4):
        republish(fleet.cli, 2)
        killed += kill_cli_mid_run(fleet, full, "rollback", "tiny")
        fleet.check()
        fleet.converged()
    print(f"registry serve killed {fleet.kills} times, {fleet.mid_rollout} of them before "
          f"every node's ACTIVE ack was recorded; registry rollback killed {killed} of 4 times")
    assert fleet.mid_rollout >= 3, "the kills missed the rollouts"
    assert killed >= 2
