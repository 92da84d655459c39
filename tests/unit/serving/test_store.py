from __future__ import annotations

import hashlib
from pathlib import Path

import msgspec
import pytest

from serving.release.manifest import (
    Artifact,
    Calibration,
    Fidelity,
    Manifest,
    Preprocessing,
    TensorSpec,
    is_valid_name,
)
from serving.release.store import InstalledReleases, ModelStore, StoreError

CONTENT = {"model.onnx": b"onnx bytes", "tokenizer.json": b"{}", "model.pt": b"torchscript"}


def _artifact(name: str, fmt: str) -> Artifact:
    data = CONTENT[name]
    return Artifact(name, hashlib.sha256(data).hexdigest(), len(data), fmt)  # type: ignore[arg-type]


def manifest(version: int = 1) -> Manifest:
    return Manifest(
        name="sentiment", version=version, labels=["neg", "pos"],
        inputs=[TensorSpec("input_ids", "INT64", [-1, -1]),
                TensorSpec("attention_mask", "INT64", [-1, -1])], outputs=[],
        preprocessing=Preprocessing("tokenizer.json", 64),
        center=_artifact("model.pt", "torchscript"), edge=_artifact("model.onnx", "onnx"),
        tokenizer=_artifact("tokenizer.json", "tokenizer"),
        calibration=Calibration(source="default", threshold=0.9),
        fidelity=Fidelity(1.0, 10, 0.97, "generated"), publisher="t", published_at="now",
        source_sha256="0" * 64)


def write_good(artifact: Artifact, destination: Path) -> None:
    destination.write_bytes(CONTENT[artifact.file])


def test_install_stages_verifies_and_activates(tmp_path: Path) -> None:
    store = ModelStore(tmp_path)
    folder = store.install(manifest(), "edge", write_good)
    assert folder == tmp_path / "sentiment" / "1"
    assert sorted(p.name for p in folder.iterdir()) == ["model.onnx", "release.json",
                                                        "tokenizer.json"]
    assert store.current("sentiment") == 1
    assert store.verify("sentiment", 1, "edge") == manifest()
    installed = InstalledReleases(tmp_path)  # what serving reads: the same folder, no writes
    assert installed.current("sentiment") == 1 and installed.versions("sentiment") == [1]
    assert installed.verify("sentiment", 1, "edge") == manifest()
    assert not any(p.name.startswith(".staging") for p in (tmp_path / "sentiment").iterdir())


def test_corrupted_transfer_never_becomes_visible(tmp_path: Path) -> None:
    store = ModelStore(tmp_path)
    store.install(manifest(1), "edge", write_good)

    def corrupt(artifact: Artifact, destination: Path) -> None:
        destination.write_bytes(CONTENT[artifact.file][:-1] + b"!")

    with pytest.raises(StoreError, match=r"sha256|bytes"):
        store.install(manifest(2), "edge", corrupt)
    assert store.versions("sentiment") == [1]
    assert store.current("sentiment") == 1
    assert [p.name for p in (tmp_path / "sentiment").iterdir() if p.name.startswith(".")] == []


def test_tampered_store_fails_verification(tmp_path: Path) -> None:
    store = ModelStore(tmp_path)
    folder = store.install(manifest(), "center", write_good)
    (folder / "model.pt").write_bytes(b"TORCHSCRIPT")
    with pytest.raises(StoreError, match="sha256"):
        InstalledReleases(tmp_path).verify("sentiment", 1, "center")


def test_unsafe_names_are_refused(tmp_path: Path) -> None:
    store = ModelStore(tmp_path)
    for bad in ["../etc", "a/b", ".hidden", "UPPER", "", "a..b", "x" * 200]:
        assert not is_valid_name(bad)
        with pytest.raises(StoreError, match="invalid model name"):
            store.model_dir(bad)
    evil = msgspec.structs.replace(manifest(), edge=msgspec.structs.replace(
        manifest().edge, file="../../escape.onnx"))
    with pytest.raises(StoreError, match="unsafe"):
        store.install(evil, "edge", write_good)
    assert not (tmp_path.parent / "escape.onnx").exists()


def test_prune_keeps_what_is_asked_and_never_current(tmp_path: Path) -> None:
    store = ModelStore(tmp_path)
    for version in (1, 2, 3, 4):
        store.install(manifest(version), "edge", write_good, activate=version == 2)
    assert store.prune("sentiment", keep={4}) == [1, 3]  # 2 is CURRENT: kept whatever keep says
    assert store.versions("sentiment") == [2, 4] and store.current("sentiment") == 2


def test_find_locates_an_installed_file_by_sha256(tmp_path: Path) -> None:
    store = ModelStore(tmp_path)
    assert store.find(manifest().edge.sha256) is None
    store.install(manifest(1), "edge", write_good)
    found = store.find(manifest().edge.sha256)
    assert found is not None and hashlib.sha256(found.read_bytes()).hexdigest() == \
        manifest().edge.sha256
    assert store.find("f" * 64) is None
