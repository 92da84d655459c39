"""A Hugging Face export as it comes: a ``BertForSequenceClassification`` made here from a small
random config, traced with ``torchscript=True, return_dict=False`` (it returns ``(logits,)``),
published unchanged with ``registry publish model.pt --tokenizer ... --calibration ...`` and
served by real center and edge processes; modules that return a dict or put their logits second
publish with ``--output`` (or ``"output"`` in ``tiered.json``, beside an ONNX edge with two
outputs); an ``--output`` that picks nothing is one line on stderr, exit 2."""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnxruntime as ort
import pytest
import torch

from center.runtime import TorchScriptRuntime
from examples.sentiment.encoder import tokenizer_path
from harness.processes import code_path
from serving.model import torchscript
from serving.model.text import encode, load_tokenizer
from serving.release.manifest import decode
from tests.conftest import TEST_FLOOR, RegistryCli
from tests.hf_models import (
    DictOutput,
    LogitsSecond,
    bert,
    bert_export,
    calibration,
    sentences,
    variant,
)
from tests.models import confident_classifier, save_script
from tests.servers import Server, start

pytestmark = pytest.mark.integration
TEXTS = sentences(40, seed=11)


@dataclass
class Served:
    cli: RegistryCli
    model: Path
    tokenizer: Path
    manifest: dict[str, Any]
    center: Server
    edge: Server

    def infer(self, server: Server, texts: list[str], threshold: float) -> dict[str, Any]:
        body = {"inputs": [{"name": "text", "shape": [len(texts)], "datatype": "BYTES",
                            "data": texts}], "parameters": {"threshold": threshold}}
        answer = httpx.post(f"{server.url}/v2/models/hf/infer", json=body, timeout=30)
        assert answer.status_code == 200, answer.text
        return {o["name"]: o["data"] for o in answer.json()["outputs"]}


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(1, keepdims=True))
    return np.asarray(shifted / shifted.sum(1, keepdims=True))


def own_logits(model: Path, tokenizer: Path, texts: list[str], element: int | str = 0,
               ) -> np.ndarray:
    """What the export itself answers, one text at a time (no padding), segment 0."""
    module = torchscript.load(model).eval()
    rows = []
    for text in texts:
        tokens = encode(load_tokenizer(tokenizer, 128), [text])
        ids = torch.from_numpy(tokens.input_ids)
        with torch.inference_mode():
            out = module(ids, torch.from_numpy(tokens.attention_mask), torch.zeros_like(ids))
        rows.append(out[element].numpy())
    return np.concatenate(rows)


def publish(cli: RegistryCli, model: Path, tokenizer: Path, *extra: str, name: str = "hf",
            check: bool = True) -> Any:
    result = cli("publish", model, "--name", name, "--tokenizer", tokenizer, "--calibration",
                 calibration(model.parent / "calibration.jsonl"), *extra, "--json",
                 check=check, timeout=300)
    return result if not check else result.json()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("hf")
    model, tokenizer = bert_export(root / "export")
    cli = RegistryCli(root / "registry")
    published = publish(cli, model, tokenizer)
    for tier in ("center", "edge"):
        cli("pull", "hf", "--tier", tier, "--store", root / tier)
    # the tiers run the code under test (a worktree ahead of the installed copy included)
    center = start("center", root / "center", root, env=code_path())
    edge = start("edge", root / "edge", root, "--center-url", center.url, "--cache-size", "0",
                 env=code_path())
    try:
        yield Served(cli, model, tokenizer, published["manifest"], center, edge)
    finally:
        edge.stop()
        center.stop()


def test_the_export_is_stored_unchanged_and_its_manifest_says_the_logits_come_first(
        served: Served) -> None:
    manifest = served.manifest
    assert manifest["logits"] == 0 and manifest["schema"] == 4  # nodes before 4 refuse it
    assert manifest["center"]["sha256"] == hashlib.sha256(served.model.read_bytes()).hexdigest()
    assert manifest["labels"] == ["0", "1", "2"]
    assert [i["name"] for i in manifest["inputs"]] == ["input_ids", "attention_mask",
                                                       "token_type_ids"]
    assert manifest["outputs"] == [{"name": "logits", "datatype": "FP32", "shape": [-1, 3]}]
    assert manifest["fidelity"]["top1_agreement"] >= TEST_FLOOR


def test_the_center_answers_softmax_of_the_export_s_own_logits(served: Served) -> None:
    expected = softmax(own_logits(served.model, served.tokenizer, TEXTS))
    assert len(set(expected.argmax(1).tolist())) >= 2  # the texts get different answers
    answer = served.infer(served.center, TEXTS, threshold=0)
    probabilities = np.asarray(answer["probabilities"]).reshape(len(TEXTS), 3)
    assert np.allclose(probabilities, expected, atol=1e-5)
    assert answer["label"] == [str(i) for i in expected.argmax(1)]
    escalated = served.infer(served.edge, TEXTS[:5], threshold=1.0)  # every row to the center
    assert escalated["tier"] == ["center"] * 5
    assert np.allclose(np.asarray(escalated["probabilities"]).reshape(5, 3), expected[:5],
                       atol=1e-5)


def test_the_int8_edge_agrees_with_the_export(served: Served) -> None:
    expected = own_logits(served.model, served.tokenizer, TEXTS).argmax(1)
    answer = served.infer(served.edge, TEXTS, threshold=0)  # the edge answers every row
    assert answer["tier"] == ["edge"] * len(TEXTS)
    agreement = np.mean([label == str(i) for label, i in zip(answer["label"], expected,
                                                             strict=True)])
    assert agreement >= TEST_FLOOR


@pytest.mark.parametrize(("wrapper", "flags", "element"), [
    (DictOutput, ["--output", "logits"], "logits"),
    (DictOutput, [], "logits"),  # a dict's "logits" wherever it is
    (LogitsSecond, ["--output", "1"], 1),
])
def test_a_module_whose_logits_are_not_first_publishes_with_output(
        tmp_path: Path, wrapper: type[DictOutput], flags: list[str], element: int | str) -> None:
    model, tokenizer = variant(tmp_path / "export", wrapper)
    cli = RegistryCli(tmp_path / "registry")
    manifest = publish(cli, model, tokenizer, *flags)["manifest"]
    assert manifest["logits"] == element and manifest["schema"] == 4
    expected = own_logits(model, tokenizer, TEXTS, element)
    for tier in ("center", "edge"):
        cli("pull", "hf", "--tier", tier, "--store", tmp_path / tier)
    release = decode((tmp_path / "center" / "hf" / "1" / "release.json").read_bytes())
    center = TorchScriptRuntime(tmp_path / "center" / "hf" / "1" / "model.pt",
                                torch.device("cpu"), "fp32", 0, ["input_ids", "attention_mask",
                                                                 "token_type_ids"],
                                release.logits)
    tokens = encode(load_tokenizer(tokenizer, 128), TEXTS)
    feeds = {**tokens.feeds(), "token_type_ids": np.zeros_like(tokens.input_ids)}
    assert np.allclose(center.predict(feeds), expected, atol=1e-5)
    edge = ort.InferenceSession(str(tmp_path / "edge" / "hf" / "1" / "model.onnx"),
                                providers=["CPUExecutionProvider"])
    assert [o.name for o in edge.get_outputs()] == ["logits"]  # the hidden part left out
    int8 = edge.run(None, feeds)[0]
    assert int8.shape == (len(TEXTS), 3)
    assert np.mean(int8.argmax(1) == expected.argmax(1)) >= TEST_FLOOR


@pytest.mark.parametrize(("wrapper", "output", "message"), [
    (None, "1", "the center model returns a tuple of 1 tensor; --output 1 is out of range"),
    (None, "logits", "the center model returns a tuple of 1 tensor; --output logits names no "
                     "element (give an index, 0 to 0)"),
    (LogitsSecond, "2", "the center model returns a tuple of 2 tensors; --output 2 is out of "
                        "range"),
    (DictOutput, "scores", "the center model returns a dict with keys 'hidden', 'logits'; "
                           "--output scores is not one of them"),
    (DictOutput, "2", "the center model returns a dict with keys 'hidden', 'logits'; --output "
                      "2 is out of range"),
])
def test_an_output_the_model_does_not_return_is_one_line_and_exit_2(
        tmp_path: Path, wrapper: type[DictOutput] | None, output: str, message: str) -> None:
    model, tokenizer = (bert_export(tmp_path / "export") if wrapper is None
                        else variant(tmp_path / "export", wrapper))
    cli = RegistryCli(tmp_path / "registry")
    result = publish(cli, model, tokenizer, "--output", output, check=False)
    assert result.code == 2 and result.stderr.strip() == f"error: {message}"  # one line
    assert cli("list", "--json").json() == []


def test_output_on_a_model_that_returns_a_tensor_is_refused(tmp_path: Path) -> None:
    model = save_script(confident_classifier(), tmp_path / "model.pt")
    cli = RegistryCli(tmp_path / "registry")
    result = publish(cli, model, tokenizer_path(), "--output", "0", check=False)
    assert result.code == 2 and result.stderr.strip() == (
        "error: the center model returns a tensor; --output 0 picks nothing (leave it out)")
    assert publish(cli, model, tokenizer_path())["manifest"].get("logits") is None
    # a tensor model's release is what it was before the field existed: schema 1, no "logits"
    cli("pull", "hf", "--tier", "center", "--store", tmp_path / "center")
    stored = json.loads((tmp_path / "center" / "hf" / "1" / "release.json").read_bytes())
    assert stored["schema"] == 1 and "logits" not in stored


def two_output_onnx(module: torch.nn.Module, path: Path) -> Path:
    """``module`` (answering ``(hidden, logits)``) as an fp32 ONNX file with both outputs."""
    ids = torch.ones(2, 8, dtype=torch.long)
    names = ["input_ids", "attention_mask", "token_type_ids"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's and the tracer's notices
        torch.onnx.export(module, (ids, ids, torch.zeros_like(ids)), str(path), dynamo=False,
                          opset_version=17, input_names=names, output_names=["hidden", "logits"],
                          dynamic_axes={**{n: {0: "rows", 1: "tokens"} for n in names},
                                        "hidden": {0: "rows"}, "logits": {0: "rows"}})
    return path


@pytest.mark.parametrize(("output", "refusal"), [
    (1, None),
    (7, 'the center model returns a tuple of 2 tensors; tiered.json "output": 7 is out of '
        'range'),
])
def test_a_folder_names_the_output_for_its_center_and_its_two_output_onnx_edge(
        tmp_path: Path, output: int, refusal: str | None) -> None:
    folder = tmp_path / "release"
    model, tokenizer = variant(folder, LogitsSecond)
    two_output_onnx(LogitsSecond(bert()).eval(), folder / "edge.onnx")
    calibration(folder / "calibration.jsonl")
    (folder / "tiered.json").write_text(json.dumps({
        "labels": ["a", "b", "c"], "center": model.name, "edge": "edge.onnx",
        "tokenizer": tokenizer.name, "calibration": "calibration.jsonl", "output": output}))
    cli = RegistryCli(tmp_path / "registry")
    result = cli("publish", folder, "--name", "hf", "--json", check=False, timeout=300)
    if refusal is not None:
        assert result.code == 2 and result.stderr.strip() == f"error: {refusal}"
        return
    assert result.code == 0, result.stderr
    manifest = result.json()["manifest"]
    assert manifest["logits"] == 1 and manifest["fidelity"]["top1_agreement"] >= TEST_FLOOR
    cli("pull", "hf", "--tier", "edge", "--store", tmp_path / "edge")
    edge = ort.InferenceSession(str(tmp_path / "edge" / "hf" / "1" / "model.onnx"),
                                providers=["CPUExecutionProvider"])
    assert [(o.name, o.shape[1]) for o in edge.get_outputs()] == [("logits", 3)]
