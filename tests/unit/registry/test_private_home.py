"""The store's own modes, without the ``registry`` command's umask: a home, its database (and
SQLite's WAL and shared-memory files) and its blob and chunk folders are private whatever the
umask of the process that makes them."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from registry.store import private
from registry.store.blobs import BlobStore
from registry.store.db import connect

pytestmark = pytest.mark.usefixtures("permissive_umask")


def modes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode)
            for p in (root, *root.rglob("*"))}


def test_the_database_and_its_wal_files_are_made_0600_in_a_0700_home(tmp_path: Path) -> None:
    home = tmp_path / "a" / "home"
    db = connect(home / "registry.sqlite3")
    db.execute("CREATE TABLE t (x)")
    try:
        found = modes(tmp_path / "a")
        assert {"home/registry.sqlite3", "home/registry.sqlite3-wal",
                "home/registry.sqlite3-shm"} <= set(found)
        assert {path: mode for path, mode in found.items() if mode & 0o077} == {}
        assert found["home"] == 0o700 and found["home/registry.sqlite3-wal"] == 0o600
    finally:
        db.conn.close()


def test_blob_folders_are_0700_and_blobs_0600(tmp_path: Path) -> None:
    source = tmp_path / "artifact.onnx"
    source.write_bytes(b"weights")
    os.chmod(source, 0o644)
    store = BlobStore(tmp_path / "home" / "blobs")
    sha, _ = store.put(source)
    found = modes(tmp_path / "home")
    assert found[f"blobs/sha256/{sha[:2]}/{sha}"] == 0o600
    assert {path: oct(mode) for path, mode in found.items() if mode & 0o077} == {}


def test_folders_keeps_what_exists_and_makes_the_rest_private(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o755)
    private.folders(tmp_path / "x" / "y")
    assert stat.S_IMODE(tmp_path.stat().st_mode) == 0o755  # not this code's to change
    assert stat.S_IMODE((tmp_path / "x").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "x" / "y").stat().st_mode) == 0o700
