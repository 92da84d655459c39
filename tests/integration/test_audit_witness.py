"""Audit witnesses: the nodes keep the registry's signed word of how far its audit chain reached,
so records removed after the last directive a node accepted (an older signed head put back,
``node_models.directive_seq`` lowered) are caught once a node reconnects. Before, nothing
outside the registry's home had seen those records and ``registry audit --verify`` passed."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from harness.processes import start_registry
from registry.trust import anchor
from sync.node import witness_store
from tests.conftest import RegistryCli
from tests.integration.test_sync import metric, wait_for
from tests.servers import start

pytestmark = [pytest.mark.integration, pytest.mark.slow]
SECRET = "audit-witness-secret-0123456789"
FAST = {"REGISTRY_WITNESS_INTERVAL_S": "0.3"}


def told(store: Path) -> int:
    """The seq of the witness the node keeps (0: none)."""
    try:
        return int(json.loads((store / witness_store.FILE).read_bytes())["seq"])
    except FileNotFoundError:
        return 0


def test_records_removed_after_the_last_directive_are_caught_when_a_node_reconnects(
        tiny_release: Path, tmp_path: Path) -> None:
    cli = RegistryCli(tmp_path / "registry")
    cli("publish", tiny_release, "--name", "tiny")
    key = str(cli("key", "--json").json()["public_key_path"])
    store = tmp_path / "edge"
    flags = ("--sync-backoff-max-s", "1", "--release-key", key)
    registry = start_registry(cli.home, tmp_path, SECRET, env=FAST)
    try:
        edge = start("edge", store, tmp_path, "--registry", registry.target, *flags,
                     registry_secret=SECRET)
        try:
            wait_for(lambda: any(r["node"] == edge.node_id and r["directive_seq"]
                                 for r in cli("status", "--json").json()), 60,
                     "the edge's ACTIVE ack with its directive's seq")
            wait_for(lambda: told(store) >= json.loads(
                (cli.home / anchor.FILE).read_bytes())["seq"], 30, "the edge told the head")
            cut = json.loads((cli.home / anchor.FILE).read_bytes())["seq"]
            older = (cli.home / anchor.FILE).read_bytes()  # valid, signed, the chain at `cut`
            cli("cascade", "tiny", "--split", "equal")  # changes no node's directive ...
            cli("cascade", "tiny", "--split", "traffic")
            wait_for(lambda: told(store) > cut, 30, "the edge told the newer head")
        finally:
            edge.stop()
    finally:
        registry.stop()
    seen = told(store)
    (row,) = [r for r in cli("status", "--json").json() if r["node"] == edge.node_id]
    assert row["directive_seq"] <= cut < seen  # ... so no directive names those records
    assert cli("audit", "--verify", "--json").json()["ok"]

    # the registry host's writer: the newest records gone, the older head back, what the
    # database says nodes saw lowered
    conn = sqlite3.connect(cli.home / "registry.sqlite3")
    conn.executescript(f"""
        DROP TRIGGER audit_no_delete;
        DELETE FROM audit WHERE seq > {cut};
        CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit
        BEGIN SELECT RAISE(ABORT, 'audit log is append-only'); END;
        UPDATE node_models SET directive_seq = MIN(directive_seq, {cut});
        UPDATE nodes SET witness_seq = NULL, witness_hash = NULL;""")
    conn.close()
    (cli.home / anchor.FILE).write_bytes(older)
    # what is on the registry's disk alone agrees with itself: only a witness can tell
    assert cli("audit", "--verify", "--json").json()["ok"]

    registry = start_registry(cli.home, tmp_path, SECRET, env=FAST)
    try:
        edge = start("edge", store, tmp_path, "--registry", registry.target, *flags,
                     registry_secret=SECRET)
        try:
            wait_for(lambda: metric(registry.metrics_url,
                                    "registry_audit_witness_conflicts_total") >= 1, 60,
                     "the registry met the edge's witness")
            assert told(store) == seen  # the rewound registry's older head never replaces it
        finally:
            edge.stop()
    finally:
        registry.stop()
    assert "the audit chain lost records" in registry.log.read_text()
    after = cli("audit", "--verify", "--json", check=False)
    data = after.json()
    assert after.code == 1 and not data["ok"]
    assert data["first_bad"] is None and data["head_problem"] is None  # both still fooled
    assert data["nodes_seen_seq"] == seen
    assert f"was told the audit chain reached record {seen}" in data["nodes_problem"]
