from __future__ import annotations

from pathlib import Path

import pytest

from registry.errors import IntegrityError
from registry.store.blobs import BlobStore
from serving.release.store import file_sha256


def test_identical_content_is_stored_once(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "blobs")
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    a.write_bytes(b"x" * 3_000_000)
    b.write_bytes(b"x" * 3_000_000)
    assert store.put(a) == store.put(b) == (file_sha256(a), 3_000_000)
    assert len(list((tmp_path / "blobs" / "sha256").rglob("*"))) == 2  # one folder, one file
    assert list((tmp_path / "blobs" / "tmp").iterdir()) == []


def test_corrupt_blob_is_refused_on_copy(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "blobs")
    src = tmp_path / "a.bin"
    src.write_bytes(b"model weights")
    sha, _ = store.put(src)
    store.path(sha).write_bytes(b"model weightz")
    with pytest.raises(IntegrityError, match="corrupt"):
        store.copy_to(sha, tmp_path / "out.bin")
