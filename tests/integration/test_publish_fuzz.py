"""``registry publish`` never answers a user's mistake with a traceback: hypothesis draws
``--input``, ``--image``, ``--labels``, ``tiered.json`` fields (inputs, request, labels, the
calibration file's name) and calibration files (``.npz`` and JSON Lines: wrong array names,
widths, datatypes, labels, empty, a few thousand rows) around a real 30-feature MLP (trained on
``load_breast_cancer``), and each run either publishes (exit 0) or refuses in one ``error:``
line (exit 2), the home line and finished steps being the only other lines on stderr.

The command runs in this process (``registry.cli.main.main``, exactly what the console script
calls): an exception escaping it is the traceback the user would see.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from registry.cli.main import main
from tests.models import save_script

pytestmark = pytest.mark.integration

WIDTH = 30
NAMES = st.sampled_from(["features", "feats", "x", "1bad", ""])
DATATYPES = st.sampled_from(["FP32", "FP64", "INT64", "UINT8", "BYTES", "fp32"])
DIMS = st.lists(st.sampled_from([-1, 0, -2, 1, 3, 29, 30, 31]), min_size=1, max_size=4)
NUMBER = st.sampled_from(["-5", "5", "0", "-0.5", "nan", "inf", "x", "", "1e9"])


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(WIDTH, 16), torch.nn.ReLU(),
                                       torch.nn.Linear(16, 2))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.net(features)


def data() -> tuple[np.ndarray, np.ndarray]:
    """Standardized tabular rows with two classes: breast cancer when sklearn is there."""
    try:
        from sklearn.datasets import load_breast_cancer
        x, y = load_breast_cancer(return_X_y=True)
    except ImportError:
        rng = np.random.default_rng(0)
        x = rng.normal(size=(569, WIDTH))
        y = (x[:, :3].sum(axis=1) > 0).astype(np.int64)
    x = (x - x.mean(axis=0)) / x.std(axis=0)
    return x.astype(np.float32), y.astype(np.int64)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("fuzz")
    x, y = data()
    torch.manual_seed(0)
    model = MLP()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(100):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(x)),
                                                 torch.from_numpy(y))
        loss.backward()
        optimizer.step()
    save_script(model.eval(), root / "mlp.pt")
    np.save(root / "x.npy", x)
    np.save(root / "y.npy", y)
    code, _, err = registry(root / "home", "init")
    assert code == 0, err
    return {"root": root, "home": root / "home", "model": root / "mlp.pt"}


def registry(home: Path, *args: str) -> tuple[int, str, str]:
    """Run ``registry --home HOME ARGS`` here: exit code, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    umask = os.umask(0o077)
    code = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main(["--home", str(home), *args])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        os.umask(umask)
    return code, out.getvalue(), err.getvalue()


@st.composite
def input_flag(draw: st.DrawFn) -> str:
    shape = ",".join(map(str, draw(DIMS)))
    text = f"{draw(NAMES)}:{draw(DATATYPES)}:{shape}"
    if draw(st.booleans()):
        text += f":{draw(NUMBER)},{draw(NUMBER)}"
    return draw(st.sampled_from([text, text, "features:FP32:-1,30", "features:FP32:-1,30",
                                 "features:FP32:-1,30:-5,5", "features:FP64:-1,30",
                                 "features:FP32", "a:b:c:d:e"]))


@st.composite
def calibration(draw: st.DrawFn, folder: Path, x: np.ndarray, y: np.ndarray) -> Path | None:
    """A calibration file: ``.npz`` (its array's name, width, rows, datatype and labels
    drawn) or JSON Lines; None for none."""
    form = draw(st.sampled_from(["none", "none", "npz", "npz", "npz", "npz", "jsonl",
                                 "garbage"]))
    if form == "none":
        return None
    if form == "garbage":
        path = folder / "calibration.npz"
        path.write_bytes(draw(st.binary(max_size=64)))
        return path
    rows = draw(st.sampled_from([0, 5, 10, 60, 60, 3000]))
    width = draw(st.sampled_from([29, 30, 30, 30, 31]))
    take = np.resize(x, (rows, WIDTH))
    features = np.resize(take, (rows, width)) if width != WIDTH else take
    labels: Any = np.resize(y, rows)
    labels = draw(st.sampled_from([labels, labels, labels, labels + 2, labels.astype(str),
                                   labels.astype(np.float32), labels[:-1] if rows else labels,
                                   np.array(["benign"] * rows), labels == 1]))
    if form == "jsonl":
        path = folder / "calibration.jsonl"
        key = draw(st.sampled_from(["features", "text", "image"]))
        path.write_text("".join(json.dumps({key: row.tolist(), "label": label})
                                + "\n" for row, label in zip(features, labels.tolist(),
                                                             strict=False)))
        return path
    dtype = draw(st.sampled_from([np.float32] * 3 + [np.float64, np.int64, np.float16, str]))
    name = draw(st.sampled_from(["features"] * 4 + ["feats", "x"]))
    arrays = {name: features.astype(dtype)}
    if draw(st.integers(0, 4)):
        arrays["labels"] = labels
    if not draw(st.integers(0, 6)):
        arrays["extra"] = features
    path = folder / "calibration.npz"
    np.savez(path, **arrays)  # type: ignore[arg-type]
    return path


@st.composite
def single_file(draw: st.DrawFn, world: dict[str, Path], x: np.ndarray,
                y: np.ndarray) -> list[str]:
    folder = world["root"] / "single"
    folder.mkdir(exist_ok=True)
    argv = [str(world["model"])]
    for flag in draw(st.lists(input_flag(), min_size=draw(st.sampled_from([0, 1, 1, 1])),
                              max_size=2)):
        argv += ["--input", flag]
    if not draw(st.integers(0, 3)):
        argv += ["--image", draw(st.sampled_from(["", "scale=255", "scale=x", "mean=0.5/y",
                                                  "resize=0", "layout=NHWC", "nope=1", "a"]))]
    if draw(st.booleans()):
        argv += ["--labels", draw(st.sampled_from(["benign,malignant", "a", "a,a",
                                                   "a,b,c", ","]))]
    path = draw(calibration(folder, x, y))
    if path is not None:
        argv += ["--calibration", str(path)]
    return argv


@st.composite
def release_folder(draw: st.DrawFn, world: dict[str, Path], x: np.ndarray,
                   y: np.ndarray) -> list[str]:
    folder = world["root"] / "folder"
    folder.mkdir(exist_ok=True)
    (folder / "center.pt").write_bytes(world["model"].read_bytes())
    spec: dict[str, Any] = {"center": "center.pt", "edge": "center.pt",
                            "labels": draw(st.sampled_from([["benign", "malignant"]] * 4 + [
                                ["a"], ["a", "b", "c"], []]))}
    spec["inputs"] = draw(st.sampled_from([
        None, *[[{"name": "features", "datatype": "FP32", "shape": [-1, 30]}]] * 4,
        [{"name": "features", "datatype": "FP32", "shape": [-1, 31]}],
        [{"name": "features", "datatype": "FP32", "shape": [-1, 30]},
         {"name": "mask", "datatype": "FP32", "shape": [-1, 30]}],
        [{"name": "features", "datatype": "FP32"}]]))
    spec["request"] = draw(st.sampled_from([
        None, None, [], [{"kind": "tensor", "name": "features"}],
        [{"kind": "tensor", "name": "features", "minimum": -5, "maximum": 5}],
        [{"kind": "tensor", "name": "mask"}],
        [{"kind": "tensor", "name": "features"}, {"kind": "tensor", "name": "mask"}],
        [{"kind": "image", "name": "features", "height": 5, "width": 6, "channels": 1}]]))
    path = draw(calibration(folder, x, y))
    spec["calibration"] = draw(st.sampled_from(
        [path.name if path else None] * 5 + ["missing.npz", "../x.npz", "/etc/passwd"]))
    spec = {k: v for k, v in spec.items() if v is not None}
    (folder / "tiered.json").write_text(json.dumps(spec))
    return [str(folder)]


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(st.data())
def test_a_publish_mistake_is_one_error_line_and_exit_2_never_a_traceback(
        world: dict[str, Path], data_: st.DataObject) -> None:
    x, y = np.load(world["root"] / "x.npy"), np.load(world["root"] / "y.npy")
    how = data_.draw(st.sampled_from([single_file, release_folder]))
    argv = data_.draw(how(world, x, y))
    code, _, err = registry(world["home"], "publish", *argv, "--name", "fuzzed",
                            "--min-fidelity", "0")
    lines = [line for line in err.splitlines() if line.strip()]
    event(f"exit {code}: {lines[-1][:160] if lines else ''}")  # --hypothesis-show-statistics
    assert "Traceback" not in err
    assert code in (0, 2), (code, argv, err)
    if code == 2:
        errors = [line for line in lines if line.startswith("error:")]
        assert len(errors) == 1 and lines[-1] == errors[0], (argv, err)
        assert all(line.startswith("✓") for line in lines[:-1]), err  # steps done before it


def test_the_fuzzed_model_publishes_with_its_calibration_and_a_declared_range(
        world: dict[str, Path], tmp_path: Path) -> None:
    """The fuzz's model is publishable: a refusal above is about the mistake, not the model."""
    x, y = np.load(world["root"] / "x.npy"), np.load(world["root"] / "y.npy")
    np.savez(tmp_path / "calibration.npz", features=x, labels=y)
    code, out, err = registry(world["home"], "publish", str(world["model"]), "--name", "good",
                              "--input", "features:FP32:-1,30:-20,20", "--calibration",
                              str(tmp_path / "calibration.npz"), "--json")
    assert code == 0, err
    published = json.loads(out)
    assert published["manifest"]["request"] == [
        {"kind": "tensor", "name": "features", "minimum": -20.0, "maximum": 20.0}]
    assert published["home"] == str(world["home"])
    assert f"registry home: {world['home']} (--home)" in err
