"""A cascade from one command: ``registry publish CENTER.pt --edge EDGE.pt`` (TorchScript or
fp32 ONNX edge), on models trained in the test on data scikit-learn ships; one file alone
says that its edge is an INT8 copy; publish records and prints each tier's cost per row and
each INT8 candidate's agreement; an image model's probe is no larger than its edge and still
checks it."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from registry.cli import tables
from registry.publish.export import export_onnx
from serving.model import torchscript
from serving.release import probe
from serving.release.manifest import TensorSpec
from tests.cascades import digits, photo_patches
from tests.conftest import RegistryCli

pytestmark = pytest.mark.integration
DIGITS = ["--input", "features:FP32:-1,64", "--labels", ",".join(map(str, range(10)))]
PATCHES = ["--input", "image:FP32:-1,3,32,32", "--image", "", "--labels", "china,flower"]


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory) -> RegistryCli:
    return RegistryCli(tmp_path_factory.mktemp("cascade") / "registry")


@pytest.fixture(scope="module")
def tabular(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    return digits(tmp_path_factory.mktemp("digits"))


def publish(cli: RegistryCli, *args: str | Path) -> dict[str, Any]:
    return cli("publish", *args, "--json", timeout=300).json()


def test_a_smaller_edge_makes_a_real_cascade_and_its_saving_is_recorded(
        cli: RegistryCli, tabular: tuple[Path, Path, Path]) -> None:
    center, edge, calibration = tabular
    result = publish(cli, center, "--edge", edge, "--name", "digits", *DIGITS,
                     "--calibration", calibration)
    assert result["cascade"] is True
    m = result["manifest"]
    c = m["calibration"]
    assert 0 < c["threshold"] < 1 and 0 < c["escalation_rate"] < 1
    assert c["edge_accuracy"] < c["center_accuracy"]  # the smaller edge is the weaker one
    assert c["cascade_accuracy"] >= c["center_accuracy"] - c["tolerance"] - 1e-9
    assert m["fidelity"]["candidates"] == {"dynamic": m["fidelity"]["top1_agreement"]}
    cost = m["cost"]
    assert cost["edge_ms"] > 0 and cost["center_ms"] > cost["edge_ms"]  # ~130x the FLOPs
    assert cost["batch"] == 32 and cost["rows"] == 96 and cost["platform"]["cpu"]
    shown = cli("show", "digits@1")
    text = " ".join(shown.stdout.split())
    assert "center TorchScript fp32" in text and "x cheaper" in text
    assert tables.threshold(c["threshold"]) in text


def test_one_file_says_it_is_an_int8_copy_and_names_edge(
        cli: RegistryCli, tabular: tuple[Path, Path, Path]) -> None:
    center, _, calibration = tabular
    printed = cli("publish", center, "--name", "digits-one", *DIGITS, "--calibration",
                  calibration, timeout=300)
    m = cli("show", "digits-one@1", "--json").json()["manifest"]
    c = m["calibration"]
    note = " ".join(printed.stdout.split())
    assert "the edge is an INT8 copy of the center" in note
    assert (f"the calibrated threshold is {tables.threshold(c['threshold'])} and "
            f"{tables.pct(c['escalation_rate'])} of rows escalate") in note
    assert c["escalation_rate"] < 0.05  # the INT8 copy rarely disagrees with its center
    assert "--edge EDGE.pt" in note
    again = publish(cli, center, "--name", "digits-one", *DIGITS, "--calibration", calibration)
    assert again["cascade"] is False and again["manifest"]["cost"]["center_ms"] > 0


def test_an_fp32_onnx_edge_is_quantized_and_cascades(
        cli: RegistryCli, tabular: tuple[Path, Path, Path], tmp_path: Path) -> None:
    center, edge, calibration = tabular
    onnx = tmp_path / "edge.onnx"
    export_onnx(torchscript.load(edge), onnx, [TensorSpec("features", "FP32", [-1, 64])],
                {"features": np.zeros((2, 64), np.float32)})
    m = publish(cli, center, "--edge", onnx, "--name", "digits-onnx", *DIGITS,
                "--calibration", calibration)["manifest"]
    assert m["edge"]["format"] == "onnx" and m["edge"]["precision"].startswith("int8")
    assert 0 < m["calibration"]["escalation_rate"] < 1


def test_the_source_digest_covers_both_files(
        cli: RegistryCli, tabular: tuple[Path, Path, Path]) -> None:
    center, edge, calibration = tabular
    args: list[str | Path] = [*DIGITS, "--calibration", calibration, "--skip-existing"]
    first = publish(cli, center, "--edge", edge, "--name", "digest", *args)
    same = publish(cli, center, "--edge", edge, "--name", "digest", *args)
    assert first["created"] and not same["created"]
    alone = publish(cli, center, "--name", "digest", *args)  # another edge: another source
    assert alone["created"] and alone["manifest"]["version"] == 2


def test_edge_on_a_folder_or_a_missing_edge_is_refused_in_one_line(
        cli: RegistryCli, tabular: tuple[Path, Path, Path], tmp_path: Path) -> None:
    center, edge, _ = tabular
    for args, message in [((tmp_path, "--edge", edge), "--edge goes with a single center file"),
                          ((center, "--edge", tmp_path / "nope.pt"), "nope.pt: no such file")]:
        result = cli("publish", *args, "--name", "refused", *DIGITS, check=False)
        assert result.code == 2, result.stderr
        assert message in result.stderr and "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert cli("show", "refused", "--json", check=False).code != 0


def test_a_conv_model_records_both_candidates_and_a_probe_no_larger_than_its_edge(
        cli: RegistryCli, tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> None:
    model, calibration = photo_patches(tmp_path_factory.mktemp("patches"))
    m = publish(cli, model, "--name", "patches", *PATCHES, "--calibration",
                calibration)["manifest"]
    candidates = m["fidelity"]["candidates"]
    assert sorted(candidates) == ["dynamic", "static"]
    assert all(0 <= v <= 1 for v in candidates.values())
    assert candidates[m["quantization"]["method"]] == max(candidates.values())
    assert 0 < m["probe"]["size"] <= m["edge"]["size"]
    # 256 rows of fp32 pixels would not fit: they are kept as codes (fewer rows only if need be)
    with zipfile.ZipFile(cli.home / "blobs" / "sha256" / m["probe"]["sha256"][:2]
                         / m["probe"]["sha256"]) as archive:
        assert "image.scale.npy" in archive.namelist()
    shown = " ".join(cli("show", "patches@1").stdout.split())
    assert f"dynamic {tables.pct(candidates['dynamic'])}" in shown
    assert f"static {tables.pct(candidates['static'])}" in shown
    # the nodes' check still works on the compact probe: the INT8 edge re-run on it agrees
    cli("pull", "patches@1", "--tier", "edge", "--store", tmp_path)
    folder = tmp_path / "patches" / "1"
    loaded = probe.load(folder / "probe.npz", [TensorSpec("image", "FP32", [-1, 3, 32, 32])])
    assert loaded.rows >= probe.MIN_ROWS
    session = ort.InferenceSession(str(folder / "model.onnx"),
                                   providers=["CPUExecutionProvider"])
    measured = probe.measure(lambda feeds: session.run(None, feeds)[0], loaded, "edge")
    assert measured.agreement == m["fidelity"]["probe_agreement"]
