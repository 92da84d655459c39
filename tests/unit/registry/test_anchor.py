"""The signed audit head beside the database: what the hash chain alone cannot show."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import threading
from pathlib import Path

import pytest
import sqlite_utils

from registry.settings import RegistrySettings
from registry.store import chain
from registry.store.db import connect
from registry.trust import anchor, keys
from tests.conftest import RegistryCli


def _settings(home: Path) -> RegistrySettings:
    return RegistrySettings(home=home)


def _append(db: sqlite_utils.Database, home: Path, n: int, actor: str = "a",
            anchored: bool = True) -> None:
    signed = anchor.for_settings(_settings(home)) if anchored else None
    for i in range(n):
        with anchor.audited(db, signed) as conn:
            chain.append(conn, actor=actor, action="promote", model="m", version=i + 1)


def _check(db: sqlite_utils.Database, home: Path) -> tuple[anchor.SignedHead | None, str | None]:
    settings = _settings(home)
    return anchor.check(db, home / anchor.FILE, keys.existing_public(settings),
                        settings.signing_key_path)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "registry"


@pytest.fixture
def db(home: Path) -> sqlite_utils.Database:
    db = connect(home / "registry.sqlite3")
    _append(db, home, 6)
    return db


def _truncate(database: Path, keep: int) -> None:
    """The attack: drop the append-only triggers, delete the newest records, put the triggers
    back, with nothing but sqlite3."""
    conn = sqlite3.connect(database)
    conn.executescript(f"""
        DROP TRIGGER audit_no_delete;
        DELETE FROM audit WHERE seq > {keep};
        CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit
        BEGIN SELECT RAISE(ABORT, 'audit log is append-only'); END;""")
    conn.close()


def test_an_untouched_registry_holds_its_signed_head(db: sqlite_utils.Database,
                                                     home: Path) -> None:
    head, problem = _check(db, home)
    assert problem is None and head is not None and head.head == chain.head(db.conn)
    assert head.key_id == keys.signer(_settings(home)).key_id
    assert chain.verify(db) == (6, None)


def test_deleting_the_newest_records_is_found(db: sqlite_utils.Database, home: Path) -> None:
    _truncate(home / "registry.sqlite3", keep=4)
    assert chain.verify(db) == (4, None)  # the chain alone still looks whole
    _, problem = _check(db, home)
    assert problem is not None and "records 5..6 were removed (truncated)" in problem


def test_the_cli_verify_fails_on_truncation_and_passes_untouched(db: sqlite_utils.Database,
                                                                 home: Path) -> None:
    cli = RegistryCli(home)
    intact = cli("audit", "--verify")
    assert "audit chain intact" in intact.stdout and "signed head holds" in intact.stdout
    _truncate(home / "registry.sqlite3", keep=5)
    result = cli("audit", "--verify", "--json", check=False)
    assert result.code == 1
    data = result.json()
    assert not data["ok"] and data["first_bad"] is None and "truncated" in data["head_problem"]
    human = cli("audit", "--verify", check=False)
    assert human.code == 1 and "signed head check failed" in human.stdout


def test_a_rewritten_tail_is_found_and_never_signed_over(db: sqlite_utils.Database,
                                                         home: Path) -> None:
    _truncate(home / "registry.sqlite3", keep=4)
    _append(db, home, 3, actor="mallory", anchored=False)  # seqs 5..7, a forked chain
    assert chain.verify(db)[1] is None
    _, problem = _check(db, home)
    assert problem is not None and "record 6 has another hash" in problem
    _append(db, home, 1)  # an honest write afterwards must not bless the fork
    head, problem = _check(db, home)
    assert head is not None and head.head.seq == 6 and problem is not None


def test_the_cli_verify_fails_on_a_rewritten_newest_record(db: sqlite_utils.Database,
                                                          home: Path) -> None:
    """The newest record's payload rewritten, in place (the chain finds it) or re-hashed too
    (only the signed head can: no later record links to it): `audit --verify` exits 1."""
    cli = RegistryCli(home)
    newest = chain.records(db)[-1]
    forged = chain.Record(**{**newest.__dict__, "payload": '{"forged":true}', "hash": ""})
    db.conn.execute("DROP TRIGGER audit_no_update")
    db.conn.execute("UPDATE audit SET payload = ? WHERE seq = ?", [forged.payload, newest.seq])
    data = cli("audit", "--verify", "--json", check=False).json()
    assert not data["ok"] and data["first_bad"]["seq"] == newest.seq
    assert "altered" in data["first_bad"]["reason"]
    db.conn.execute("UPDATE audit SET hash = ? WHERE seq = ?",
                    [forged.expected_hash(), newest.seq])
    assert chain.verify(db) == (6, None)  # the chain alone cannot tell
    result = cli("audit", "--verify", "--json", check=False)
    assert result.code == 1
    data = result.json()
    assert not data["ok"] and data["first_bad"] is None
    assert f"record {newest.seq} has another hash" in data["head_problem"]


def test_a_forged_or_edited_head_file_is_found(db: sqlite_utils.Database, home: Path) -> None:
    path = home / anchor.FILE
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "seq": 4, "hash": chain.records(db)[3].hash}))
    _, problem = _check(db, home)
    assert problem is not None and "does not verify" in problem
    path.write_text("{not json")
    _, problem = _check(db, home)
    assert problem is not None and "unreadable" in problem


def test_a_deleted_head_file_is_named_and_not_recreated_by_the_next_write(
        db: sqlite_utils.Database, home: Path) -> None:
    (home / anchor.FILE).unlink()
    _, problem = _check(db, home)
    assert problem is not None and "no signed head" in problem and "--anchor" in problem
    _append(db, home, 1)
    assert not (home / anchor.FILE).exists()
    cli = RegistryCli(home)
    assert cli("audit", "--verify", check=False).code == 1
    anchored = cli("audit", "--anchor", "--json").json()
    assert anchored["ok"] and anchored["head"]["seq"] == 7
    again = cli("audit", "--anchor", check=False)
    assert again.code == 1 and "nothing to anchor" in again.stderr
    assert cli("audit", "--verify").code == 0


def test_an_empty_registry_verifies_without_a_head(home: Path) -> None:
    db = connect(home / "registry.sqlite3")
    assert _check(db, home) == (None, None)


def test_concurrent_writers_only_move_the_head_forward(db: sqlite_utils.Database,
                                                       home: Path) -> None:
    def writer(name: str) -> None:
        _append(connect(home / "registry.sqlite3"), home, 15, actor=name)

    threads = [threading.Thread(target=writer, args=(f"w{i}",)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    head, problem = _check(db, home)
    assert problem is None and head is not None and head.head.seq == 6 + 45
    assert chain.verify(db) == (51, None)


def test_the_sqlite3_shell_attack_if_the_shell_is_here(db: sqlite_utils.Database,
                                                       home: Path) -> None:
    """The finding's exact steps with the ``sqlite3`` program, where it is installed."""
    shell = subprocess.run(["which", "sqlite3"], capture_output=True, text=True).stdout.strip()
    if not shell:
        pytest.skip("no sqlite3 shell on this machine (the Python sqlite3 test covers it)")
    subprocess.run([shell, str(home / "registry.sqlite3")], check=True, text=True, input=(
        "DROP TRIGGER audit_no_delete; DELETE FROM audit WHERE seq > 3; CREATE TRIGGER "
        "audit_no_delete BEFORE DELETE ON audit BEGIN SELECT RAISE(ABORT, 'x'); END;"))
    assert "truncated" in str(_check(db, home)[1])
