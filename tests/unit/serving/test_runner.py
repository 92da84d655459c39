"""A classifier run over fixed token rows (``serving.model.runner``): texts in publish's batches,
TorchScript and ONNX models run over them, and every output no classifier may give refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace
from torch import Tensor, nn

from serving.errors import ModelFailed
from serving.model import torchscript
from serving.model.runner import (
    BATCH,
    Inputs,
    onnx_session,
    run_onnx,
    run_torchscript,
    text_inputs,
)

ROWS = 2 * BATCH + 6  # two full batches and a short one


class Counts(nn.Module):
    """Logits [real tokens, sum of the ids]: a different answer for every row."""

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        return torch.stack([attention_mask.sum(1), (input_ids * attention_mask).sum(1)], 1).float()


class NaNOutputs(nn.Module):
    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        return torch.full((input_ids.shape[0], 2), float("nan"))


class OneColumn(nn.Module):
    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        return input_ids.float()[:, :1]


class Pair(nn.Module):
    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor]:
        return input_ids.float(), attention_mask.float()


def inputs(rows: int = ROWS) -> Inputs:
    ids = np.arange(1, rows * 4 + 1, dtype=np.int64).reshape(rows, 4)
    mask = np.ones_like(ids)
    mask[::3, 3] = 0
    return Inputs([{"input_ids": ids[i:i + BATCH], "attention_mask": mask[i:i + BATCH]}
                   for i in range(0, rows, BATCH)], "calibration")


def test_texts_are_tokenized_in_publish_s_batches(tmp_path: Path) -> None:
    vocab = {"[PAD]": 0, "[UNK]": 1, "a": 2, "good": 3, "film": 4}
    tokenizer = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = Whitespace()
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    texts = [" ".join(["a good film"] * (1 + i % 3)) for i in range(ROWS)]
    found = text_inputs(tmp_path / "tokenizer.json", 5, texts)
    assert [len(b["input_ids"]) for b in found.batches] == [BATCH, BATCH, 6]
    assert found.rows == ROWS and found.kind == "calibration"
    assert all(b["input_ids"].shape[1] <= 5 for b in found.batches)  # truncated to max_length


def test_a_torchscript_model_s_logits_are_joined_across_batches() -> None:
    given = inputs()
    logits = run_torchscript(torchscript.script(Counts()), given, "center")
    assert logits.shape == (ROWS, 2) and logits.dtype == np.float32
    mask = np.concatenate([b["attention_mask"] for b in given.batches])
    ids = np.concatenate([b["input_ids"] for b in given.batches])
    assert np.array_equal(logits[:, 0], mask.sum(1))
    assert np.array_equal(logits[:, 1], (ids * mask).sum(1))


@pytest.mark.parametrize(("module", "message"), [
    (NaNOutputs(), "the edge model returned NaN or infinite outputs on calibration inputs"),
    (OneColumn(), f"the edge model returned shape [{BATCH}, 1] for {BATCH} rows; "
                  f"expected [{BATCH}, labels>=2]"),
    (Pair(), "the edge model returns a tuple of 2 tensors, expected a logits tensor"),
])
def test_outputs_no_classifier_may_give_are_refused(module: nn.Module, message: str) -> None:
    with pytest.raises(ModelFailed) as refused:
        run_torchscript(torchscript.script(module), inputs(), "edge")
    assert str(refused.value) == message


def counts_onnx(path: Path) -> Path:
    """The ``Counts`` model as an ONNX graph (floats: the sums of the mask and of the ids)."""
    shape = ["batch", "sequence"]
    nodes = [helper.make_node("Mul", ["input_ids", "attention_mask"], ["kept"]),
             helper.make_node("Constant", [], ["axis"], value=helper.make_tensor(
                 "axis", TensorProto.INT64, [1], [1])),
             helper.make_node("ReduceSum", ["attention_mask", "axis"], ["real"]),
             helper.make_node("ReduceSum", ["kept", "axis"], ["total"]),
             helper.make_node("Concat", ["real", "total"], ["both"], axis=1),
             helper.make_node("Cast", ["both"], ["logits"], to=TensorProto.FLOAT)]
    graph = helper.make_graph(
        nodes, "counts",
        [helper.make_tensor_value_info(n, TensorProto.INT64, shape)
         for n in ("input_ids", "attention_mask")],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 2])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_an_onnx_model_gives_what_the_torchscript_one_gives(tmp_path: Path) -> None:
    given = inputs()
    session = onnx_session(counts_onnx(tmp_path / "counts.onnx"))
    assert np.array_equal(run_onnx(session, given, "edge"),
                          run_torchscript(torchscript.script(Counts()), given, "center"))


def test_an_onnx_model_that_fails_on_the_rows_is_refused_with_its_error(tmp_path: Path) -> None:
    session = onnx_session(counts_onnx(tmp_path / "counts.onnx"))
    wrong = Inputs([{"input_ids": np.ones((2, 3), np.int64),
                     "attention_mask": np.ones((2, 4), np.int64)}],
                   "generated")  # ids and mask of different lengths
    with pytest.raises(ModelFailed, match="the edge INT8 model failed on calibration inputs: "):
        run_onnx(session, wrong, "edge INT8")
