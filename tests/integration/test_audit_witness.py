"""Audit witnesses: the nodes keep the registry's signed word of how far its audit chain reached,
so records removed after the last directive a node accepted (an older signed head put back,
``node_models.directive_seq`` lowered) are caught once a node reconnects. Before, nothing
outside the registry's home had seen those records and ``registry audit --verify`` passed. In
a group the nodes are told only what a standby holds, so a failover past a record that never
reached the standby is no "rewrite", while rewriting a record they were told still is."""

from __future__ import annotations

import base64
import json
import os
import signal
import sqlite3
import time
from pathlib import Path

import pytest

from harness.processes import free_port, start_registry
from registry.trust import anchor, pki
from sync.node import witness_store
from sync.wire import witness
from tests.conftest import RegistryCli
from tests.integration import test_failover as ha
from tests.integration.test_sync import metric, wait_for
from tests.servers import start
from tiered.commands import registry_argv
from tiered.stack import Stack

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


def witness_row(home: Path, node: str) -> int | None:
    """The witness seq the registry at ``home`` keeps for ``node`` (None: none shown yet)."""
    with sqlite3.connect(f"file:{home / 'registry.sqlite3'}?mode=ro", uri=True) as conn:
        row = conn.execute("SELECT witness_seq FROM nodes WHERE node_id = ?", (node,)).fetchone()
    return None if row is None or row[0] is None else int(row[0])


def test_a_failover_past_an_unreplicated_record_is_no_rewrite_and_a_real_rewrite_still_is(
        ha_stack: Stack, tiny_release: Path) -> None:
    """Finding 5: the primary committed a record its standby never received, the standby took
    over and wrote its own record at that seq. The nodes were told only what the standby held,
    so `audit --verify` on the new primary passes; rewriting a record they were told fails it.
    Real `registry serve --ha` pair, Consul lock, edge."""
    stack = ha_stack
    fast = {"REGISTRY_WITNESS_INTERVAL_S": "0.3", "REGISTRY_SYNC_TIMEOUT_S": "1"}
    homes = stack.registry_homes()
    primary_home, standby_home = homes["registry"], homes["registry-standby-1"]
    clis = {name: ha._Cli(home, key=str(stack.signing_key)) for name, home in homes.items()}
    clis["registry"]("publish", tiny_release, "--name", "tiny")
    pki.fleet(stack.tls, ["127.0.0.1", "localhost"])
    stack.start_consul()
    start_member(stack, "registry", primary_home, **fast)
    ha.wait_for("the first registry leading", lambda: ha.leading(primary_home), 30)
    start_member(stack, "registry-standby-1", standby_home, **fast)
    stack.start_edge("edge-eu-1", "eu")
    store = stack.root / "stores" / "edge-eu-1"
    ha.wait_for("the edge active, told a head the standby holds", lambda: any(
        r["node"] == "edge-eu-1" and r["directive_seq"] for r in clis["registry"](
            "status", "--json").json()) and told_head(store) in audit_chain(standby_home), 90)

    standby = stack.children["registry-standby-1"].process
    standby.send_signal(signal.SIGSTOP)  # it applies and acks nothing from now on
    try:
        frozen = audit_chain(standby_home)  # what the standby holds, and will lead with
        wrote = clis["registry"]("cascade", "tiny", "--split", "equal")
        assert "replicated asynchronously" in wrote.stderr
        unreplicated = audit_chain(primary_home)[len(frozen)]  # on the primary alone
        time.sleep(2.0)  # more than six witness intervals: it would have been told by now
        held = told_head(store)
        assert held in frozen  # the edge was told only what the standby holds
        ha.kill(stack, "registry")
    finally:
        standby.send_signal(signal.SIGCONT)
    ha.wait_for("the standby leading", lambda: ha.leading(standby_home), 30)
    ha.wait_for("the new primary's own records", lambda: len(audit_chain(standby_home)) >=
                unreplicated[0], 30)
    mine = audit_chain(standby_home)[unreplicated[0] - 1]
    assert mine[0] == unreplicated[0] and mine[1] != unreplicated[1]  # the same seq, rewritten
    ha.wait_for("the edge showed its witness to the new primary",
                lambda: witness_row(standby_home, "edge-eu-1") == held[0], 60)
    new = clis["registry-standby-1"]
    verdict = new("audit", "--verify", "--json").json()
    assert verdict["ok"] and verdict["nodes_problem"] is None, verdict

    # tampering: the record the edge was told, rewritten in the new primary's file
    ha.kill(stack, "registry-standby-1")
    conn = sqlite3.connect(standby_home / "registry.sqlite3")
    conn.executescript(f"""
        DROP TRIGGER audit_no_update;
        UPDATE audit SET hash = '{"0" * 64}' WHERE seq = {held[0]};""")
    conn.close()
    after = new("audit", "--verify", "--json", check=False)
    assert after.code == 1 and not after.json()["ok"]
    assert "the chain was rewritten" in after.json()["nodes_problem"]


def told_head(store: Path) -> tuple[int, str] | None:
    """The seq and hash of the witness the node keeps (None: none)."""
    try:
        kept = json.loads((store / witness_store.FILE).read_bytes())
    except FileNotFoundError:
        return None
    head = witness.parse(base64.b64decode(kept["statement"]))
    return head.seq, head.hash


def audit_chain(home: Path) -> list[tuple[int, str]]:
    """Each record's seq and hash in the database at ``home``."""
    with sqlite3.connect(f"file:{home / 'registry.sqlite3'}?mode=ro", uri=True) as conn:
        return [(int(s), str(h)) for s, h in conn.execute("SELECT seq, hash FROM audit ORDER "
                                                          "BY seq")]


def start_member(stack: Stack, name: str, home: Path, **env: str) -> None:
    """One `registry serve --ha` of the stack's group, a short lock TTL, ``env`` added (and the
    test's PYTHONPATH: the stack hands its children a fresh environment, and the code under
    test may be a worktree's, not the installed one)."""
    port = free_port()
    path = {"PYTHONPATH": os.environ["PYTHONPATH"]} if "PYTHONPATH" in os.environ else {}
    stack.spawn(name, registry_argv(home, port, free_port()), port, "registry",
                env={"REGISTRY_HOME": str(home), "REGISTRY_LOCK_TTL_S": "2", **path, **env})
