"""``registry.ha.backup`` on real SQLite files and blob stores (no models: blobs are bytes)."""

from __future__ import annotations

import json
import shutil
import sqlite3
import threading
import time
from pathlib import Path

import pytest
import sqlite_utils

from registry.errors import BackupRefused, IntegrityError, NotFound, SigningKeyError
from registry.ha import backup, changes
from registry.settings import RegistrySettings
from registry.store import chain, role
from registry.store.blobs import BlobStore
from registry.store.chain import Record
from registry.store.clock import now
from registry.store.db import connect, transaction
from registry.trust import anchor


def settings_for(home: Path) -> RegistrySettings:
    return RegistrySettings(home=home, actor="tester@ci")


def append(db: sqlite_utils.Database, settings: RegistrySettings, action: str = "note",
           **fields: object) -> None:
    with anchor.audited(db, anchor.for_settings(settings)) as conn:
        chain.append(conn, actor="tester@ci", action=action, payload={"n": "ü"},
                     **fields)  # type: ignore[arg-type]


def add_blob(db: sqlite_utils.Database, settings: RegistrySettings, data: bytes,
             tmp: Path) -> str:
    source = tmp / f"blob-{len(data)}-{data[:4].hex()}"
    source.write_bytes(data)
    sha, size = BlobStore(settings.blobs).put(source)
    with anchor.audited(db, anchor.for_settings(settings)) as conn:
        chain.append(conn, actor="tester@ci", action="blob", sha256=sha)
        conn.execute("INSERT OR IGNORE INTO blobs VALUES (?, ?, ?)", (sha, size, now()))
    return sha


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A registry home: a signed chain of a few records, two blobs, a model version."""
    home = tmp_path / "home"
    settings = settings_for(home)
    db = connect(settings.database)
    add_blob(db, settings, b"x" * 300_000, tmp_path)
    add_blob(db, settings, b"tiny", tmp_path)
    with anchor.audited(db, anchor.for_settings(settings)) as conn:
        chain.append(conn, actor="tester@ci", action="publish", model="m", version=1)
        conn.execute("INSERT INTO models VALUES ('m', ?)", (now(),))
        conn.execute("INSERT INTO versions VALUES ('m', 1, '{}', ?, NULL, 't', ?)",
                     ("0" * 64, now()))
    for _ in range(3):
        append(db, settings)
    db.conn.close()
    return home


def blob_tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes()
            for p in sorted((root / "blobs" / "sha256").rglob("*")) if p.is_file()}


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


# -- the fast chain walk -----------------------------------------------------------------------

ODD_ROWS = [
    (1, "2026-01-01T00:00:00.000+00:00", "é@host", "publish", None, None, None, "{}",
     chain.GENESIS),
    (2, "t", "a\"b\\c\n\t\x00\x1f", "r", "日本語", 7, "f" * 64, '{"x":"ü 😀"}', "0" * 64),
    (3, "", "", "", "", 0, "", "", ""),
    (4, "t", "\u2028\u2029\ufeff", "x", "m", -(2**63), None, "[]", "p"),
]


@pytest.mark.parametrize("fields", ODD_ROWS)
def test_the_fast_row_hash_is_records_expected_hash(fields: tuple[object, ...]) -> None:
    record = Record(*fields, hash="")  # type: ignore[arg-type]
    assert chain.row_hash((*fields, "")) == record.expected_hash()


def test_odd_types_take_the_slow_path_and_still_agree() -> None:
    fields = (5, "t", "a", "b", "m", 1.5, None, "{}", "p")  # a REAL a forger wrote
    assert chain.row_hash((*fields, "")) == Record(*fields, hash="").expected_hash()  # type: ignore[arg-type]
    assert chain.row_hash((6, "t", "a", "b", "m", True, None, "{}", "p", "")) == Record(
        6, "t", "a", "b", "m", True, None, "{}", "p", "").expected_hash()


def test_verify_walks_chains_written_by_append_including_odd_text(tmp_path: Path) -> None:
    db = connect(tmp_path / "r.sqlite3")
    for i, (_, _, actor, action, model, version, sha, _, _) in enumerate(ODD_ROWS * 3):
        with transaction(db) as conn:
            chain.append(conn, actor=actor or "x", action=action or "y", model=model,
                         version=version, sha256=sha, payload={"i": i, "s": actor})
    assert chain.verify(db) == chain._verify_rows(db.conn) == (12, None)
    assert all(r.expected_hash() == r.hash for r in chain.records(db))
    db.conn.execute("DROP TRIGGER audit_no_update")
    db.conn.execute("UPDATE audit SET actor = 'mallory' WHERE seq = 7")
    for checked, finding in (chain.verify(db), chain._verify_rows(db.conn)):
        assert checked == 6 and finding is not None and finding.seq == 7
        assert "altered" in finding.reason


def test_a_value_sqlite_writes_otherwise_is_judged_by_the_definition(tmp_path: Path) -> None:
    """SQLite's json_array writes the REAL 0.1 + 0.2 as 0.3, Python's json as
    0.30000000000000004: the fast walk must fall back to Record.expected_hash, not call the
    record altered (and still catch a real change to it)."""
    db = connect(tmp_path / "r.sqlite3")
    with transaction(db) as conn:
        chain.append(conn, actor="a", action="b")
        fields = (2, "t", "a", "b", "m", 0.1 + 0.2, None, "{}", chain.head(conn).hash)  # type: ignore[union-attr]
        digest = Record(*fields, hash="").expected_hash()  # type: ignore[arg-type]
        conn.execute("INSERT INTO audit VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", (*fields, digest))
        chain.append(conn, actor="a", action="c")
    assert db.conn.execute("SELECT json_array(version) FROM audit WHERE seq = 2").fetchone()[0] \
        == "[0.3]"
    assert chain.verify(db) == chain._verify_rows(db.conn) == (3, None)
    db.conn.execute("DROP TRIGGER audit_no_update")
    db.conn.execute("UPDATE audit SET version = 0.3 WHERE seq = 2")
    assert chain.verify(db)[1].seq == 2  # type: ignore[union-attr]
    assert chain._verify_rows(db.conn)[1].seq == 2  # type: ignore[union-attr]


# -- backup ------------------------------------------------------------------------------------


def test_round_trip_restores_the_same_registry(home: Path, tmp_path: Path) -> None:
    dest, target = tmp_path / "backup", tmp_path / "restored"
    made = backup.backup(settings_for(home), dest)
    manifest = json.loads((dest / backup.MANIFEST).read_text())
    assert manifest == made.manifest
    assert manifest["counts"] == {"models": 1, "versions": 1, "audit": 6}
    assert manifest["audit_head"]["seq"] == 6
    assert manifest["signed_head"]["seq"] == 6
    assert len(manifest["blobs"]) == 2 and manifest["key_id"]
    assert blob_tree(dest) == blob_tree(home)
    assert not (dest / "keys" / "signing.key").exists()  # the private key is kept apart
    assert leftovers(tmp_path) == []

    result = backup.restore(settings_for(target), dest, target)
    assert (result.head_seq, result.checked, result.blobs) == (6, 6, 2)
    assert blob_tree(target) == blob_tree(home)
    restored = connect(target / "registry.sqlite3")
    original = connect(home / "registry.sqlite3")
    assert chain.verify(restored) == (6, None)
    assert [r.hash for r in chain.records(restored)] == [r.hash for r in chain.records(original)]
    assert (target / "audit-head.json").read_bytes() == (home / "audit-head.json").read_bytes()
    assert result.warnings and "signing key" in result.warnings[0]  # no keys/ carried
    assert leftovers(tmp_path) == []


def test_backup_refuses_a_taken_destination_and_a_missing_home(home: Path,
                                                               tmp_path: Path) -> None:
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "file").write_text("x")
    with pytest.raises(BackupRefused, match="not an empty folder"):
        backup.backup(settings_for(home), taken)
    with pytest.raises(NotFound, match="no registry database"):
        backup.backup(settings_for(tmp_path / "nothing"), tmp_path / "b")
    empty = tmp_path / "empty"
    empty.mkdir()
    backup.backup(settings_for(home), empty)  # an empty folder is fine
    assert (empty / backup.MANIFEST).is_file()


@pytest.mark.parametrize("damage", ["missing", "corrupt"])
def test_backup_of_a_damaged_blob_fails_and_leaves_nothing(home: Path, tmp_path: Path,
                                                           damage: str) -> None:
    big = max((home / "blobs" / "sha256").rglob("*"), key=lambda p: p.stat().st_size)
    if damage == "missing":
        big.unlink()
    else:
        data = bytearray(big.read_bytes())
        data[1000] ^= 1
        big.write_bytes(bytes(data))
    error = NotFound if damage == "missing" else IntegrityError
    with pytest.raises(error, match=big.name):
        backup.backup(settings_for(home), tmp_path / "backup")
    assert not (tmp_path / "backup").exists()
    assert leftovers(tmp_path) == []


# -- restore refusals --------------------------------------------------------------------------


@pytest.fixture
def made(home: Path, tmp_path: Path) -> Path:
    backup.backup(settings_for(home), tmp_path / "backup")
    return tmp_path / "backup"


def refused(made: Path, tmp_path: Path, error: type[Exception], match: str) -> None:
    target = tmp_path / "restored"
    with pytest.raises(error, match=match):
        backup.restore(settings_for(target), made, target)
    assert not target.exists()
    assert leftovers(tmp_path) == []


def test_a_flipped_byte_in_the_database_is_refused(made: Path, tmp_path: Path) -> None:
    database = made / "registry.sqlite3"
    data = bytearray(database.read_bytes())
    data[len(data) // 2] ^= 0x40
    database.write_bytes(bytes(data))
    refused(made, tmp_path, IntegrityError, r"registry\.sqlite3 .*sha256")


def test_a_truncated_blob_is_refused_naming_it(made: Path, tmp_path: Path) -> None:
    big = max((made / "blobs" / "sha256").rglob("*"), key=lambda p: p.stat().st_size)
    big.write_bytes(big.read_bytes()[:1000])
    refused(made, tmp_path, IntegrityError, f"blob {big.name} .*1000 bytes")


def test_a_same_size_corrupted_blob_is_refused_naming_it(made: Path, tmp_path: Path) -> None:
    """One flipped bit, the size unchanged: only the content's sha256 tells."""
    big = max((made / "blobs" / "sha256").rglob("*"), key=lambda p: p.stat().st_size)
    data = bytearray(big.read_bytes())
    data[len(data) // 2] ^= 1
    big.write_bytes(bytes(data))
    refused(made, tmp_path, IntegrityError, f"blob {big.name} .*corrupt")


def test_a_rewritten_chain_with_a_matching_manifest_is_refused(made: Path,
                                                               tmp_path: Path) -> None:
    """Someone who rewrites the database and its manifest entry still meets the chain."""
    database = made / "registry.sqlite3"
    with sqlite3.connect(database) as conn:
        conn.execute("DROP TRIGGER audit_no_update")
        conn.execute("UPDATE audit SET actor = 'mallory' WHERE seq = 2")
    conn.close()
    manifest = json.loads((made / backup.MANIFEST).read_text())
    manifest["database"]["sha256"], manifest["database"]["size"] = \
        backup.file_digest(database)
    (made / backup.MANIFEST).write_text(json.dumps(manifest))
    refused(made, tmp_path, IntegrityError, "chain is broken at record 2")


def test_a_cut_chain_is_refused_by_the_signed_head(made: Path, tmp_path: Path) -> None:
    database = made / "registry.sqlite3"
    with sqlite3.connect(database) as conn:
        conn.execute("DROP TRIGGER audit_no_delete")
        conn.execute("DELETE FROM audit WHERE seq = 6")
    conn.close()
    manifest = json.loads((made / backup.MANIFEST).read_text())
    manifest["database"]["sha256"], manifest["database"]["size"] = \
        backup.file_digest(database)
    manifest["audit_head"]["seq"] = 5
    manifest["audit_head"]["hash"] = sqlite3.connect(database).execute(
        "SELECT hash FROM audit WHERE seq = 5").fetchone()[0]
    (made / backup.MANIFEST).write_text(json.dumps(manifest))
    refused(made, tmp_path, IntegrityError, "signed head: .*records 6..6 were removed")


def test_not_a_backup_and_no_backup(tmp_path: Path) -> None:
    (tmp_path / "folder").mkdir()
    refused(tmp_path / "folder", tmp_path, BackupRefused, "not a registry backup")
    refused(tmp_path / "absent", tmp_path, NotFound, "no backup folder")


def test_an_existing_home_needs_force_and_is_moved_aside(home: Path, made: Path,
                                                          tmp_path: Path) -> None:
    """The home went on after the backup: restoring the older backup names what is lost."""
    settings = settings_for(home)
    db = connect(settings.database)
    with anchor.audited(db, anchor.for_settings(settings)) as conn:
        chain.append(conn, actor="tester@ci", action="publish", model="m", version=2)
        conn.execute("INSERT INTO versions VALUES ('m', 2, '{}', ?, NULL, 't', ?)",
                     ("1" * 64, now()))
        conn.execute("INSERT INTO nodes (node_id, tier, region, first_seen, last_seen) "
                     "VALUES ('edge-1', 'edge', 'eu', 'now', 'now')")
        conn.execute("INSERT INTO node_models (node_id, model, state, updated_at, "
                     "directive_seq) VALUES ('edge-1', 'm', 'ACTIVE', 'now', 7)")
    append(db, settings)
    db.conn.close()
    before = sorted(p.name for p in home.iterdir())
    with pytest.raises(BackupRefused, match="--force"):
        backup.restore(settings, made, home)
    assert sorted(p.name for p in home.iterdir()) == before

    result = backup.restore(settings, made, home, force=True)
    assert result.replaced is not None and result.replaced.name.startswith("home.replaced-")
    assert (result.replaced / "registry.sqlite3").is_file()  # kept, not deleted
    assert result.missing is not None
    assert result.missing.records == (7, 8) and result.missing.versions == [("m", 2)]
    assert result.missing.nodes_seen_seq == 7 and not result.missing.diverged
    assert result.carried == ["keys"]  # the signing key stays with the registry
    assert not result.warnings
    text = "\n".join(backup.notes(result))
    assert "records 7..8 are not in this backup" in text and "m@2" in text
    assert "up to seq 7" in text and "ends at seq 6" in text and "keep refusing" in text
    restored = connect(home / "registry.sqlite3")
    assert chain.verify(restored) == (6, None)
    # the carried key checks the restored head, and the next write moves it forward
    append(restored, settings)
    assert anchor.read(home / anchor.FILE).head.seq == 7  # type: ignore[union-attr]


def test_a_backup_of_a_group_s_primary_restores_as_a_standalone_registry_that_takes_writes(
        home: Path, tmp_path: Path) -> None:
    """A primary's backup carries its role and (expired) lease: restored as it was, the
    triggers would refuse every write. A restored registry is standalone until it joins a
    group again."""
    db = connect(settings_for(home).database)
    with transaction(db) as conn:
        role.set_role(conn, "primary", term=3, registry_id="registry-a",
                             leader="10.0.0.1:50051", lease_until=time.time() + 60)
        changes.acked(conn, "registry-b", 5)
    backup.backup(settings_for(home), tmp_path / "backup")
    backup.restore(settings_for(tmp_path / "r"), tmp_path / "backup", tmp_path / "r")
    restored = connect(tmp_path / "r" / "registry.sqlite3")
    state = role.state(restored.conn)
    assert (state.role, state.leader, state.lease_until) == ("standalone", None, 0.0)
    assert restored.conn.execute("SELECT count(*) FROM replicas").fetchone()[0] == 0
    with pytest.raises(SigningKeyError, match="only its public half"):  # no new key minted
        append(restored, settings_for(tmp_path / "r"))
    shutil.copy(home / "keys" / "signing.key", tmp_path / "r" / "keys" / "signing.key")
    append(restored, settings_for(tmp_path / "r"))  # the key back: writes are accepted


# -- concurrency -------------------------------------------------------------------------------


def test_backup_during_writes_is_a_snapshot_whose_chain_verifies(
        home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer appends (BEGIN IMMEDIATE) throughout the backup: it is never held up for long
    and the backup is a consistent snapshot, its signed head no further than its chain. Small
    steps: the writer commits between many of them (the pinned read transaction keeps them
    one snapshot)."""
    monkeypatch.setattr(backup, "STEP_PAGES", 64)
    settings = settings_for(home)
    db = connect(settings.database)
    with transaction(db) as conn:  # bulk: a database big enough for the copy to take a while
        for _ in range(20_000):
            chain.append(conn, actor="bulk", action="note", payload={"pad": "x" * 200})
    append(db, settings)
    for i in range(8):
        add_blob(db, settings, bytes([i]) * 2_000_000, tmp_path)
    stop, waits = threading.Event(), []

    def writer() -> None:
        wdb = connect(settings.database)
        the_anchor = anchor.for_settings(settings)
        while not stop.is_set():
            started = time.perf_counter()
            with anchor.audited(wdb, the_anchor) as conn:
                chain.append(conn, actor="writer", action="note")
            waits.append(time.perf_counter() - started)
            time.sleep(0.005)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        time.sleep(0.05)
        before = len(waits)
        result = backup.backup(settings, tmp_path / "backup")
        during = len(waits) - before
    finally:
        stop.set()
        thread.join()
    assert during >= 3, "the writer made no progress while the backup ran"
    assert max(waits) < 2.0
    head = result.manifest["audit_head"]["seq"]
    assert result.manifest["signed_head"]["seq"] <= head
    assert chain.head(db.conn).seq > head  # type: ignore[union-attr]  # writes went on
    restored = backup.restore(settings_for(tmp_path / "r"), tmp_path / "backup",
                              tmp_path / "r")
    assert restored.head_seq == head == restored.checked
