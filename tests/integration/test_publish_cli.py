"""``registry publish`` and friends through the installed console script, on a real SQLite file."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

from registry.publish.validate import GENERATED_ROWS
from serving.model import torchscript
from serving.model.text import encode, load_tokenizer
from serving.release.store import ModelStore
from tests.conftest import TEST_FLOOR, RegistryCli
from tests.models import (
    NaNOutputs,
    WrongShape,
    WrongSignature,
    confident_classifier,
    fragile_classifier,
    save_script,
)

pytestmark = pytest.mark.integration


def blob_files(cli: RegistryCli) -> list[Path]:
    root = cli.home / "blobs" / "sha256"
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


def assert_nothing_recorded(cli: RegistryCli) -> None:
    assert cli("list", "--json").json() == []
    assert cli("audit", "--json").json() == []
    assert blob_files(cli) == []


def test_publish_twice_gives_versions_1_and_2_and_stores_blobs_once(
        registry_cli: RegistryCli, tiny_release: Path) -> None:
    first = registry_cli("publish", tiny_release, "--name", "sentiment", "--json").json()
    assert first["created"] and first["manifest"]["version"] == 1
    blobs_after_first = blob_files(registry_cli)
    assert len(blobs_after_first) == 4  # center, INT8 edge, tokenizer, probe
    second = registry_cli("publish", tiny_release, "--name", "sentiment", "--json").json()
    assert second["manifest"]["version"] == 2
    assert blob_files(registry_cli) == blobs_after_first  # identical artifacts stored once
    for role in ("center", "edge", "tokenizer", "probe"):
        assert first["manifest"][role]["sha256"] == second["manifest"][role]["sha256"]

    listed = registry_cli("list", "--json").json()
    assert [(m["name"], m["versions"], m["production"]) for m in listed] == [("sentiment", 2, 2)]
    shown = registry_cli("show", "sentiment@1", "--json").json()
    assert shown["version"] == 1 and shown["aliases"] == []
    manifest = shown["manifest"]
    assert manifest["labels"] == ["rotten", "fresh"]
    fidelity = manifest["fidelity"]
    assert fidelity["inputs"] == "calibration" and fidelity["rows"] == 200
    assert fidelity["minimum"] == TEST_FLOOR <= fidelity["top1_agreement"]
    # the publisher's CPU, next to the figure it produced; the quantization it chose
    assert fidelity["platform"]["machine"] and fidelity["platform"]["runtime"].startswith(
        "onnxruntime ")
    assert shown["fidelity_platform"] == fidelity["platform"]
    assert manifest["quantization"] == {"method": "dynamic", "weight_type": "int8",
                                        "per_channel": True, "reduce_range": True}
    assert manifest["edge"]["precision"] == "int8-dynamic-per-channel-7bit"
    assert manifest["probe"]["format"] == "probe" and manifest["probe"]["file"] == "probe.npz"
    assert manifest["calibration"]["source"] == "labelled"
    assert manifest["calibration"]["rows"] == 200 and len(manifest["calibration"]["curve"]) > 10
    records = registry_cli("audit", "--json").json()
    assert [(r["action"], r["version"], r["actor"]) for r in records] == [
        ("publish", 1, "tester@ci"), ("publish", 2, "tester@ci")]
    verdict = registry_cli("audit", "--verify")
    assert "intact" in verdict.stdout and "2 records" in verdict.stdout


def test_human_output_shows_the_summary(registry_cli: RegistryCli, tiny_release: Path) -> None:
    result = registry_cli("publish", tiny_release, "--name", "sentiment")
    for expected in ("published sentiment version 1", "INT8 fidelity", "measured on",
                     "7-bit weights", "probe", "threshold", "escalation rate",
                     "cascade accuracy"):
        assert expected in result.stdout
    assert "quantize edge to INT8" in result.stderr  # the visible steps
    skipped = registry_cli("publish", tiny_release, "--name", "sentiment", "--skip-existing")
    assert "unchanged since version 1" in skipped.stdout
    assert len(registry_cli("audit", "--json").json()) == 1


def test_pull_materializes_stores_the_tiers_can_load(
        registry_cli: RegistryCli, tiny_release: Path, tmp_path: Path) -> None:
    manifest = registry_cli("publish", tiny_release, "--name", "sentiment", "--json").json()[
        "manifest"]
    edge_store, center_store = ModelStore(tmp_path / "edge"), ModelStore(tmp_path / "center")
    registry_cli("pull", "sentiment", "--tier", "edge", "--store", edge_store.root)
    registry_cli("pull", "sentiment@1", "--tier", "center", "--store", center_store.root)
    assert edge_store.current("sentiment") == center_store.current("sentiment") == 1
    edge_dir, center_dir = edge_store.version_dir("sentiment", 1), center_store.version_dir(
        "sentiment", 1)
    assert sorted(p.name for p in edge_dir.iterdir()) == [
        "model.onnx", "probe.npz", "release.json", "release.sig", "tokenizer.json"]
    assert sorted(p.name for p in center_dir.iterdir()) == [
        "model.pt", "probe.npz", "release.json", "release.sig", "tokenizer.json"]
    edge_store.verify("sentiment", 1, "edge")

    rows = [json.loads(line) for line in
            (tiny_release / "calibration.jsonl").read_text().splitlines()]
    labels = np.array([["rotten", "fresh"].index(r["label"]) for r in rows])
    tokenizer = load_tokenizer(edge_dir / "tokenizer.json", manifest["preprocessing"]["max_length"])
    session = ort.InferenceSession(str(edge_dir / "model.onnx"),
                                   providers=["CPUExecutionProvider"])
    center = torchscript.load(center_dir / "model.pt")
    edge_pred, center_pred = [], []
    for start in range(0, len(rows), 32):
        enc = encode(tokenizer, [r["text"] for r in rows[start:start + 32]])
        edge_pred.append(session.run(None, enc.feeds())[0].argmax(1))
        with torch.inference_mode():
            center_pred.append(center(torch.from_numpy(enc.input_ids),
                                      torch.from_numpy(enc.attention_mask)).numpy().argmax(1))
    calibration = manifest["calibration"]
    assert (np.concatenate(edge_pred) == labels).mean() == pytest.approx(
        calibration["edge_accuracy"])
    assert (np.concatenate(center_pred) == labels).mean() == pytest.approx(
        calibration["center_accuracy"])

    registry_cli("pull", "sentiment", "--tier", "edge", "--store", edge_store.root)  # idempotent
    assert edge_store.versions("sentiment") == [1]


def test_single_torchscript_file(registry_cli: RegistryCli, tiny_release: Path) -> None:
    result = registry_cli("publish", tiny_release / "center.pt", "--name", "solo",
                          "--json").json()
    manifest = result["manifest"]
    assert manifest["calibration"] == {"source": "default", "threshold": 0.9,
                                       "escalation_rate": None, "center_accuracy": None,
                                       "edge_accuracy": None, "cascade_accuracy": None,
                                       "tolerance": None, "confidence": None, "rows": 0,
                                       "curve": [], "agreement": []}
    assert manifest["fidelity"]["inputs"] == "generated"
    assert manifest["fidelity"]["rows"] == GENERATED_ROWS
    assert manifest["inputs"][0] == {"name": "input_ids", "datatype": "INT64", "shape": [-1, -1]}
    assert manifest["labels"] == ["0", "1"] and manifest["tokenizer"] is None
    labelled = registry_cli("publish", tiny_release / "center.pt", "--name", "solo",
                            "--tokenizer", tiny_release / "tokenizer.json",
                            "--labels", "rotten,fresh", "--calibration",
                            tiny_release / "calibration.jsonl", "--json").json()["manifest"]
    assert labelled["version"] == 2 and labelled["calibration"]["source"] == "labelled"
    # center and edge are the same model, the edge quantized: INT8 flips a few rows (how many
    # depends on the CPU), so the edge alone is about as accurate as the center and the
    # calibrated cascade escalates little and stays within tolerance of center-only
    calibration = labelled["calibration"]
    assert abs(calibration["edge_accuracy"] - calibration["center_accuracy"]) <= 0.03
    assert calibration["cascade_accuracy"] >= calibration["center_accuracy"] - calibration[
        "tolerance"] - 1e-9
    assert calibration["escalation_rate"] <= 0.25


@pytest.mark.parametrize(("args", "code", "message"), [
    (["publish", "{tmp}/missing", "--name", "m"], 2, "no such file"),
    (["publish", "{tmp}/junk.pt", "--name", "m"], 2, "is not a TorchScript file"),
    (["publish", "{tmp}/signature.pt", "--name", "m"], 2, "wrong input signature"),
    (["publish", "{tmp}/nan.pt", "--name", "m"], 2, "NaN"),
    (["publish", "{tmp}/shape.pt", "--name", "m"], 2, "shape"),
    (["publish", "{release}", "--name", "../evil"], 2, "invalid model name"),
    (["publish", "{release}", "--name", "Bad Name"], 2, "invalid model name"),
    (["publish", "{tmp}/fragile.pt", "--name", "m", "--min-fidelity", "0.97"], 3,
     "below the 97.0% floor"),
    (["publish", "{tmp}/norelease", "--name", "m"], 2, "without tiered.json"),
    (["show", "nothing@1"], 4, "no model named"),
])
def test_bad_input_is_refused_and_records_nothing(
        registry_cli: RegistryCli, tiny_release: Path, tmp_path: Path, args: list[str],
        code: int, message: str) -> None:
    (tmp_path / "junk.pt").write_text("not a model")
    (tmp_path / "norelease").mkdir()
    save_script(WrongSignature(), tmp_path / "signature.pt")
    save_script(NaNOutputs(), tmp_path / "nan.pt")
    save_script(WrongShape(), tmp_path / "shape.pt")
    save_script(fragile_classifier(), tmp_path / "fragile.pt")
    filled = [a.format(tmp=tmp_path, release=tiny_release) for a in args]
    result = registry_cli(*filled, check=False)
    assert result.code == code, result.stderr
    assert message in " ".join(result.stderr.split())
    assert "Traceback" not in result.stderr
    assert_nothing_recorded(registry_cli)


def test_low_fidelity_needs_force(registry_cli: RegistryCli, tmp_path: Path) -> None:
    model = save_script(fragile_classifier(), tmp_path / "fragile.pt")
    forced = registry_cli("publish", model, "--name", "fragile", "--force", "--json").json()
    fidelity = forced["manifest"]["fidelity"]
    assert fidelity["forced"] and fidelity["top1_agreement"] < TEST_FLOOR


def test_the_gate_passes_a_model_int8_cannot_flip_even_at_a_floor_of_one(
        registry_cli: RegistryCli, tmp_path: Path) -> None:
    model = save_script(confident_classifier(), tmp_path / "confident.pt")
    result = registry_cli("publish", model, "--name", "confident", "--min-fidelity", "1",
                          "--json").json()
    fidelity = result["manifest"]["fidelity"]
    assert fidelity["top1_agreement"] == fidelity["probe_agreement"] == 1.0
    assert not fidelity["forced"] and fidelity["minimum"] == 1.0


def test_release_folder_must_not_escape(registry_cli: RegistryCli, tiny_release: Path,
                                        tmp_path: Path) -> None:
    release = tmp_path / "release"
    shutil.copytree(tiny_release, release)
    spec = json.loads((release / "tiered.json").read_text())
    for bad_center, message in [("/etc/passwd", "relative paths"),
                                ("../center.pt", "relative paths")]:
        (release / "tiered.json").write_text(json.dumps({**spec, "center": bad_center}))
        result = registry_cli("publish", release, "--name", "m", check=False)
        assert result.code == 2 and message in result.stderr
    (release / "link.pt").symlink_to(release / "center.pt")
    (release / "tiered.json").write_text(json.dumps({**spec, "center": "link.pt"}))
    result = registry_cli("publish", release, "--name", "m", check=False)
    assert result.code == 2 and "symlinks" in result.stderr
    (release / "tiered.json").write_text(json.dumps({**spec, "unknown": 1}))
    result = registry_cli("publish", release, "--name", "m", check=False)
    assert result.code == 2 and "unknown" in result.stderr
    assert_nothing_recorded(registry_cli)


def test_canary_promote_and_rollback(registry_cli: RegistryCli, tiny_release: Path) -> None:
    registry_cli("publish", tiny_release, "--name", "s")
    registry_cli("publish", tiny_release, "--name", "s", "--canary", "edge-a,edge-b")
    [model] = registry_cli("list", "--json").json()
    assert (model["production"], model["canary"]) == (1, 2)
    home = str(registry_cli.home)
    assert registry_cli("promote", "s", "--json").json() == {"model": "s", "production": 2,
                                                             "home": home}
    [model] = registry_cli("list", "--json").json()
    assert (model["production"], model["canary"]) == (2, None)
    assert registry_cli("rollback", "s", "--json").json() == {"model": "s", "from": 2,
                                                              "production": 1, "home": home}
    again = registry_cli("rollback", "s", check=False)
    assert again.code == 1 and "first version" in again.stderr
    registry_cli("rollback", "s", "--to", "2")
    assert registry_cli("rollback", "s", "--to", "9", check=False).code == 4
    actions = [r["action"] for r in registry_cli("audit", "--json").json()]
    assert actions == ["publish", "publish", "promote", "rollback", "rollback"]
    rollouts = registry_cli.catalog().rollouts("s")
    assert [(r["alias"], r["version"], json.loads(r["targets"])) for r in rollouts] == [
        ("production", 1, ["*"]), ("canary", 2, ["edge-a", "edge-b"]),
        ("production", 2, ["*"]), ("production", 1, ["*"]), ("production", 2, ["*"])]


def test_audit_verify_names_the_tampered_row(registry_cli: RegistryCli,
                                             tiny_release: Path) -> None:
    for _ in range(3):
        registry_cli("publish", tiny_release, "--name", "s")
    conn = sqlite3.connect(registry_cli.home / "registry.sqlite3")
    conn.execute("DROP TRIGGER audit_no_update")
    conn.execute("UPDATE audit SET actor = 'mallory' WHERE seq = 2")
    conn.commit()
    conn.close()
    result = registry_cli("audit", "--verify", check=False)
    assert result.code == 1
    assert "broken at record 2" in result.stdout
    data = registry_cli("audit", "--verify", "--json", check=False).json()
    assert data["ok"] is False and data["first_bad"]["seq"] == 2 and data["checked"] == 1


def test_pull_of_a_corrupted_blob_installs_nothing(registry_cli: RegistryCli, tiny_release: Path,
                                                   tmp_path: Path) -> None:
    manifest = registry_cli("publish", tiny_release, "--name", "s", "--json").json()["manifest"]
    blob = registry_cli.home / "blobs" / "sha256" / manifest["edge"]["sha256"][:2] / manifest[
        "edge"]["sha256"]
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))
    result = registry_cli("pull", "s", "--tier", "edge", "--store", tmp_path / "edge",
                          check=False)
    assert result.code == 5 and "corrupt" in result.stderr
    store = ModelStore(tmp_path / "edge")
    assert store.versions("s") == [] and store.current("s") is None
    assert [p.name for p in (tmp_path / "edge" / "s").iterdir()] == []  # no staging left
