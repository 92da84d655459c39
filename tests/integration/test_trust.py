"""Release metadata on The Update Framework against real processes: ``registry serve``, a
center and an edge provisioned once with the registry's public key (as before TUF), and the
``registry`` commands an operator runs. The tests share the fleet and run in file order.

- a rotated root (and a rotated publisher key) is followed by every node without a restart;
- a release below its targets threshold waits, and goes out when a second publisher signs;
- a frozen registry (it answers, but cannot advance the timestamp) is flagged stale by every
  node within the expiry, and the nodes keep serving;
- a release the old, revoked publisher key signed is refused by every node.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from harness.processes import BIN, RegistryProcess, start_registry, start_tier
from registry.store.db import transaction
from registry.trust import keys, tuf
from tests.conftest import RegistryCli
from tests.integration.test_sync import (
    BODY,
    REGISTRY_ENV,
    SYNC_FLAGS,
    TOKEN,
    served,
    status,
    wait_for,
)
from tests.servers import Server, start

pytestmark = [pytest.mark.integration, pytest.mark.slow]
EXPIRY_S = 4.0  # the timestamp's life: re-signed every third of it
ENV = {**REGISTRY_ENV, "REGISTRY_TIMESTAMP_EXPIRY_S": str(EXPIRY_S)}


@dataclass
class Fleet:
    root: Path
    cli: RegistryCli
    registry: RegistryProcess
    nodes: list[Server] = field(default_factory=list)

    def key(self, name: str) -> Path:
        """A new key pair in its own folder: the private key's path."""
        made = self.cli("keygen", "--out", self.root / name, "--json").json()
        return Path(made["private_key_path"])

    def rows(self) -> dict[str, dict[str, Any]]:
        return status(self.cli)

    def all_serve(self, version: int) -> bool:
        return all(served(node) == version for node in self.nodes)

    def trust_of(self, node: Server) -> dict[str, Any]:
        answer: dict[str, Any] = httpx.get(f"{node.url}/v2/health/ready", timeout=5).json()
        return dict(answer.get("trust") or {})

    def flags(self, pinned: str) -> tuple[str, ...]:
        return ("--registry", self.registry.target, "--release-key", pinned, *SYNC_FLAGS)

    def restart_node(self, at: int, pinned: str) -> None:
        """The same node (id, store) started again."""
        node = self.nodes[at]
        node.stop()
        self.nodes[at] = start_tier(node.tier, self.root / node.tier, self.root,
                                    "--poll-interval-s", "0.2", *self.flags(pinned),
                                    env={"PATH": str(BIN)}, registry_secret=TOKEN,
                                    node_id=node.node)

    def restart_registry(self, env: dict[str, str]) -> None:
        self.registry.stop()
        self.registry = start_registry(self.cli.home, self.root, TOKEN, port=self.registry.port,
                                       env=env)


def list_behind_the_registry(cli: RegistryCli, model: str, base: int, key: Path) -> int:
    """What someone holding the registry's database and ``key`` could do: record a new version
    (a copy of ``base``) and list it in a targets metadata signed by ``key`` alone, marked
    complete. Returns the version."""
    catalog = cli.catalog()
    manifest = catalog.resolve(model, str(base)).manifest
    version = catalog.create_version(msgspec.structs.replace(manifest, publisher="mallory"))
    row = catalog.resolve(model, str(version))
    with transaction(catalog.db) as conn:
        stored = tuf.latest(conn, tuf.TARGETS)
        assert stored is not None
        md = stored.md
        md.signed.version += 1
        md.signed.targets.update(tuf.release_files(row.manifest, row.manifest_bytes))
        md.sign(tuf.CryptoSigner(keys.load_private_key(key)))
        tuf._put(conn, tuf.TARGETS, md, True)
    return version


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, tiny_release: Path) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("trust")
    cli = RegistryCli(root / "registry")
    cli("publish", tiny_release, "--name", "tiny")  # version 1
    pinned = cli("key", "--path").stdout.strip()
    # as a registry from before TUF left it: signed releases, no metadata yet
    with transaction(cli.catalog().db) as conn:
        conn.execute("DELETE FROM trust_metadata")
    # ... and an edge that installed version 1 then (checked with the pinned key)
    cli("pull", "tiny@1", "--tier", "edge", "--store", root / "edge")
    f = Fleet(root, cli, start_registry(cli.home, root, TOKEN, env=ENV))
    try:
        for tier in ("center", "edge"):
            f.nodes.append(start(tier, root / tier, root, *f.flags(pinned),
                                 registry_secret=TOKEN))
        yield f
    finally:
        for node in f.nodes:
            node.stop()
        f.registry.stop()


def test_nodes_provisioned_with_the_key_move_over_to_tuf(fleet: Fleet) -> None:
    """A registry and nodes from before TUF: root version 1 is made by `registry serve` with
    the key the nodes pinned, and each node takes it without a re-provision; the edge's
    store, installed before, is checked against the trusted targets from then on."""
    assert served(fleet.nodes[1]) == 1  # at once: from its store, by the pinned key
    wait_for(lambda: fleet.all_serve(1), 60, "version 1 on both nodes")
    wait_for(lambda: all((fleet.rows().get(n.node) or {}).get("trust") for n in
                         fleet.nodes), 30, "both nodes' trust reports")
    for node in fleet.nodes:
        held = fleet.rows()[node.node]["trust"]
        assert held["root_version"] == 1 and not held["stale"] and held["error"] is None
        assert fleet.trust_of(node)["root_version"] == 1
    tuf = fleet.cli("key", "--json").json()["tuf"]
    assert tuf["root_version"] == 1 and tuf["versions"]["timestamp"]["version"] >= 1
    assert tuf["roles"]["root"]["keys"] == [fleet.cli("key", "--json").json()["key_id"]]
    # restarted: version 1 passes the store's check against the targets kept on disk
    edge = fleet.nodes[1]
    assert (fleet.root / "edge" / ".tuf" / "targets.json").is_file()
    fleet.restart_node(1, str(fleet.cli("key", "--path").stdout.strip()))
    assert served(fleet.nodes[1]) == 1 and fleet.nodes[1].node == edge.node
    assert fleet.trust_of(fleet.nodes[1])["root_version"] == 1


def test_a_rotated_root_and_publisher_key_are_followed_without_a_restart(
        fleet: Fleet, tiny_release_b: Path) -> None:
    pids = [node.process.pid for node in fleet.nodes]
    root_key, publisher = fleet.key("root-1"), fleet.key("publisher-1")
    fleet.cli("key", "rotate", "--role", "root", "--key", root_key)  # signed by the old key too
    done = fleet.cli("key", "rotate", "--role", "targets", "--key", publisher, "--root-key",
                     root_key, "--json").json()
    assert done["root_version"] == 3 and done["targets"]["complete"]
    fleet.cli("--signing-key", publisher, "publish", tiny_release_b, "--name", "tiny")
    wait_for(lambda: fleet.all_serve(2), 90, "version 2, signed by the new publisher key")
    wait_for(lambda: all(fleet.trust_of(n)["root_version"] == 3 for n in fleet.nodes), 30,
             "root version 3 on both nodes")
    assert [node.process.pid for node in fleet.nodes] == pids  # no restart
    audited = [r["action"] for r in fleet.cli("audit", "--json").json()]
    assert audited.count("rotate-key") == 2
    # the old key may publish no more: refused before any work, nothing recorded
    old = fleet.cli("key", "--json").json()["private_key_path"]
    result = fleet.cli("--signing-key", old, "publish", tiny_release_b, "--name", "tiny",
                       check=False)
    assert result.code == 2 and "is not a targets key of root version 3" in result.stderr
    assert [m["latest"] for m in fleet.cli("list", "--json").json()] == [2]


def test_a_release_below_its_threshold_waits_for_a_second_publisher(
        fleet: Fleet, tiny_release: Path) -> None:
    root_key = fleet.root / "root-1" / "signing.key"
    first, second = fleet.root / "publisher-1" / "signing.key", fleet.key("publisher-2")
    fleet.cli("key", "rotate", "--role", "targets", "--key", first, "--key", second,
              "--threshold", "2", "--root-key", root_key)
    fleet.cli("--signing-key", first, "publish", tiny_release, "--name", "tiny")  # version 3
    waiting = fleet.cli("key", "--json").json()["tuf"]["awaiting_signatures"]
    assert waiting["releases"] == ["tiny@3"] and (waiting["signed"], waiting["threshold"]) == \
        (1, 2)
    time.sleep(3 * EXPIRY_S / 2)  # pushes and timestamps go on meanwhile
    assert fleet.all_serve(2)
    assert not any((fleet.root / n.tier / "tiny" / "3").exists() for n in fleet.nodes)
    signed = fleet.cli("--signing-key", second, "sign", "tiny@3", "--json").json()
    assert signed["targets"]["complete"] and signed["targets"]["signed"] == 2
    wait_for(lambda: fleet.all_serve(3), 90, "version 3 once two publishers signed")


def test_a_frozen_registry_is_flagged_stale_by_every_node_within_the_expiry(
        fleet: Fleet) -> None:
    # the same database, but its online key is not root's: it answers, it cannot advance the
    # timestamp (a registry host restored without its online key, a replaying proxy)
    frozen_key = fleet.key("not-online")
    fleet.restart_registry({**ENV, "REGISTRY_ONLINE_KEY": str(frozen_key)})
    started = time.monotonic()
    wait_for(lambda: all(fleet.trust_of(n).get("stale") for n in fleet.nodes), 3 * EXPIRY_S,
             "every node stale")
    took = time.monotonic() - started
    print(f"every node stale {took:.1f} s after the frozen registry started "
          f"(timestamp expiry {EXPIRY_S:g} s)")
    assert took <= EXPIRY_S + 2.0, took
    for node in fleet.nodes:
        ready = httpx.get(f"{node.url}/v2/health/ready", timeout=5)
        assert ready.status_code == 200  # it keeps serving what it has
        assert any("release metadata stale since" in n for n in ready.json()["notes"])
        metrics = httpx.get(f"{node.url}/metrics", timeout=5).text
        assert f"{node.tier}_trust_stale 1.0" in metrics
    edge = fleet.nodes[1]
    answer = httpx.post(f"{edge.url}/v2/models/tiny/infer", content=BODY, timeout=10)
    assert answer.status_code == 200 and answer.json()["model_version"] == "3"
    wait_for(lambda: all((fleet.rows()[n.node]["trust"] or {}).get("stale")
                         for n in fleet.nodes), 30, "registry status showing both stale")
    since = fleet.rows()[edge.node]["trust"]["stale_since"]
    assert since == fleet.trust_of(edge)["stale_since"]
    assert "cannot advance the TUF timestamp" in fleet.registry.log.read_text()
    # the registry with the online key again: fresh within a re-signing
    fleet.restart_registry(ENV)
    wait_for(lambda: not any(fleet.trust_of(n).get("stale") for n in fleet.nodes), 30,
             "every node fresh again")


def test_a_release_the_revoked_key_signed_is_refused_by_every_node(fleet: Fleet) -> None:
    """Someone holding the registry's database and the publisher key revoked in the rotation
    lists a version in a targets metadata signed by it: every node refuses it."""
    old = Path(fleet.cli("key", "--json").json()["private_key_path"])
    assert list_behind_the_registry(fleet.cli, "tiny", 3, old) == 4

    def refused() -> bool:
        rows = fleet.rows()
        return all(rows[n.node]["state"] == "FAILED" for n in fleet.nodes)

    wait_for(refused, 30, "both nodes' FAILED (refused) acks")
    for node in fleet.nodes:
        row_ = fleet.rows()[node.node]
        assert "refused:" in row_["reason"] and \
            "not in the trusted TUF targets" in row_["reason"], row_["reason"]
        assert row_["version"] == 3 and row_["desired"] == 4
        assert not (fleet.root / node.tier / "tiny" / "4").exists()
    assert fleet.all_serve(3)
    # each node says why: the targets metadata is signed by no key root trusts
    wait_for(lambda: all("targets was signed by 0/" in (fleet.rows()[n.node]["trust"]
                                                          ["error"] or "")
                         for n in fleet.nodes), 30, "both nodes' trust errors")
