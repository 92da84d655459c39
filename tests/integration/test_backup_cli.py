"""``registry backup`` and ``registry restore`` through the installed console script, on a
registry with real releases, a revoked node token and a cascade policy."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import RegistryCli

pytestmark = pytest.mark.integration


def blobs(home: Path) -> dict[str, bytes]:
    root = home / "blobs" / "sha256"
    return {p.name: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def hidden(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


@pytest.fixture
def populated(registry_cli: RegistryCli, tiny_release: Path) -> RegistryCli:
    registry_cli("publish", tiny_release, "--name", "sentiment")
    registry_cli("publish", tiny_release, "--name", "sentiment")
    registry_cli("node", "revoke", "edge-1")
    registry_cli("cascade", "sentiment", "--mode", "static", "--capacity", "100")
    return registry_cli


def test_backup_then_restore_gives_the_same_registry(populated: RegistryCli, tmp_path: Path,
                                                     tiny_release: Path) -> None:
    dest = tmp_path / "backup"
    made = populated("backup", dest, "--json").json()
    assert made["counts"] == {"models": 1, "versions": 2, "audit": 4}
    assert made["audit_head"]["seq"] == 4 and made["signed_head"]["seq"] == 4
    assert populated("audit", "--json").json()[-1]["seq"] == 4  # backup recorded nothing
    refused = populated("backup", dest, check=False)
    assert refused.code == 2 and "not an empty folder" in refused.stderr

    restored = RegistryCli(tmp_path / "restored")
    result = populated("restore", dest, "--home", restored.home, "--json").json()
    assert (result["head_seq"], result["checked"], result["blobs"]) == (4, 4, 4)
    assert result["replaced"] is None and "signing key" in result["warnings"][0]
    assert any("ends at seq 4" in n and "keep refusing" in n for n in result["notes"])
    # the private key is never in a backup, its public half is: the restored chain and its
    # signed head check out with public material alone
    assert sorted(p.name for p in (restored.home / "keys").iterdir()) == ["signing.pub"]
    verdict = restored("audit", "--verify", "--json").json()
    assert verdict["ok"] and verdict["head"]["seq"] == 4
    # ... and nothing mints a new key in its place: the operator puts it back, as warned
    refused = restored("publish", tiny_release, "--name", "sentiment", check=False)
    assert refused.code == 2 and "only its public half" in refused.stderr
    assert not (restored.home / "keys" / "signing.key").exists()
    shutil.rmtree(restored.home / "keys")
    shutil.copytree(populated.home / "keys", restored.home / "keys")
    verdict = restored("audit", "--verify", "--json").json()
    assert verdict["ok"] and verdict["checked"] == 4 and verdict["head"]["seq"] == 4
    for command in (("list", "--json"), ("show", "sentiment", "--json"),
                    ("show", "sentiment@2", "--json"), ("audit", "--json"),
                    ("cascade", "sentiment", "--json")):
        got, had = restored(*command).json(), populated(*command).json()
        if isinstance(got, dict):  # each says its own home
            assert (got.pop("home"), had.pop("home")) == (str(restored.home),
                                                          str(populated.home))
        assert got == had
    generations = restored.catalog().db.conn.execute(
        "SELECT node_id, generation FROM node_tokens").fetchall()
    assert generations == [("edge-1", 2)]  # the revoked token stays revoked
    assert blobs(restored.home) == blobs(populated.home) and len(blobs(restored.home)) == 4
    assert hidden(tmp_path) == []


def test_a_corrupt_backup_is_refused_and_leaves_no_home(populated: RegistryCli,
                                                        tmp_path: Path) -> None:
    dest = tmp_path / "backup"
    populated("backup", dest)
    target = tmp_path / "restored"

    flipped = tmp_path / "flipped"
    shutil.copytree(dest, flipped)
    database = flipped / "registry.sqlite3"
    data = bytearray(database.read_bytes())
    data[4096 + 100] ^= 0x01
    database.write_bytes(bytes(data))
    result = populated("restore", flipped, "--home", target, check=False)
    assert result.code == 5
    assert "registry.sqlite3" in result.stderr and "does not match the manifest" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not target.exists()

    truncated = tmp_path / "truncated"
    shutil.copytree(dest, truncated)
    blob = max((truncated / "blobs").rglob("*"), key=lambda p: p.stat().st_size)
    blob.write_bytes(blob.read_bytes()[:-1])
    result = populated("restore", truncated, "--home", target, check=False)
    assert result.code == 5 and f"blob {blob.name}" in result.stderr
    assert "truncated" in result.stderr
    assert not target.exists()
    assert populated("restore", tmp_path / "nothing", "--home", target, check=False).code == 4
    assert hidden(tmp_path) == []


def test_restoring_an_older_backup_names_what_is_missing(populated: RegistryCli,
                                                         tiny_release: Path,
                                                         tmp_path: Path) -> None:
    dest = tmp_path / "backup"
    populated("backup", dest)
    populated("publish", tiny_release, "--name", "sentiment")  # version 3, record 5
    populated("rollback", "sentiment", "--to", "2")  # record 6
    db = populated.catalog().db
    db.conn.execute("INSERT INTO nodes (node_id, tier, region, first_seen, last_seen) "
                    "VALUES ('edge-2', 'edge', 'eu', 'now', 'now')")
    db.conn.execute("INSERT INTO node_models (node_id, model, state, updated_at, "
                    "directive_seq) VALUES ('edge-2', 'sentiment', 'ACTIVE', 'now', 6)")
    db.conn.close()

    refused = populated("restore", dest, check=False)
    assert refused.code == 2 and "--force" in refused.stderr
    assert populated("list", "--json").json()[0]["versions"] == 3  # untouched

    result = populated("restore", dest, "--force")
    text = " ".join(result.stdout.split())
    assert "records 5..6 are not in this backup" in text
    assert "sentiment@3" in text
    assert "up to seq 6" in text and "past this backup's head 4" in text
    assert "ends at seq 4" in text and "keep refusing" in text
    replaced = [p for p in tmp_path.iterdir() if p.name.startswith("registry.replaced-")]
    assert len(replaced) == 1 and (replaced[0] / "registry.sqlite3").is_file()
    # the restored home carries the old home's key: it verifies and goes on
    assert populated("list", "--json").json()[0]["versions"] == 2
    assert populated("audit", "--verify", "--json").json()["ok"]
    populated("publish", tiny_release, "--name", "sentiment")
    assert populated("audit", "--verify", "--json").json()["head"]["seq"] == 5
