"""Models whose output holds the logits among other things (``serving.model.outputs``): a
Hugging Face export's ``(logits,)``, a dict, a tuple whose logits come second. The element a
user names (or the first; a dict's ``logits``) is found once at publish, recorded, and taken at
every call; a name or index that picks nothing is refused in one sentence naming what the model
returns. The manifest records it only where there is something to record."""

from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np
import pytest
import torch
from torch import Tensor, nn

from center.runtime import TorchScriptRuntime
from serving.errors import ModelFailed
from serving.model import torchscript
from serving.model.outputs import Selected, describe, resolve, select
from serving.model.runner import Inputs, output_of, run_torchscript
from serving.release.manifest import LOGITS_SCHEMA, SCHEMA, NewerSchema, decode, encode
from tests.unit.serving.test_store import manifest

LOGITS = torch.tensor([[1.0, 2.0, 3.0], [0.5, 0.0, -1.0]])
HIDDEN = torch.zeros(2, 4)


class HiddenThenLogits(nn.Module):
    """``(mask as floats, logits [ids sum, mask sum])``: the logits second."""

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor]:
        logits = torch.stack([input_ids.sum(1), attention_mask.sum(1)], 1).float()
        return attention_mask.float(), logits


class Named(nn.Module):
    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> dict[str, Tensor]:
        return {"hidden": attention_mask.float(),
                "scores": torch.stack([input_ids.sum(1), attention_mask.sum(1)], 1).float()}


def batch(rows: int = 3) -> Inputs:
    ids = np.arange(1, rows * 5 + 1, dtype=np.int64).reshape(rows, 5)
    return Inputs([{"input_ids": ids, "attention_mask": np.ones_like(ids)}], "calibration")


def test_what_a_model_returns_is_said_as_a_user_would_say_it() -> None:
    assert describe(LOGITS) == "a tensor"
    assert describe((LOGITS,)) == "a tuple of 1 tensor"
    assert describe([HIDDEN, LOGITS]) == "a list of 2 tensors"
    assert describe((LOGITS, (HIDDEN,))) == "a tuple of 2 elements"
    assert describe(()) == "an empty tuple"
    assert describe({"logits": LOGITS, "hidden": HIDDEN}) == "a dict with keys 'logits', 'hidden'"
    assert describe(None) == "NoneType"


def test_the_first_element_is_the_logits_unless_another_is_named() -> None:
    assert resolve(LOGITS, None, "center") is None  # the tensor itself: nothing to record
    assert resolve((LOGITS,), None, "center") == 0
    assert resolve((HIDDEN, LOGITS), 1, "center") == 1
    # a dict's "logits" wherever it is, else its first key; an index becomes the key
    assert resolve({"hidden": HIDDEN, "logits": LOGITS}, None, "center") == "logits"
    assert resolve({"scores": LOGITS, "hidden": HIDDEN}, None, "center") == "scores"
    assert resolve({"hidden": HIDDEN, "scores": LOGITS}, 1, "center") == "scores"
    assert resolve({"hidden": HIDDEN, "scores": LOGITS}, "scores", "center") == "scores"
    assert torch.equal(select((HIDDEN, LOGITS), 1), LOGITS)
    assert torch.equal(select({"hidden": HIDDEN, "scores": LOGITS}, "scores"), LOGITS)
    assert torch.equal(select(LOGITS, None), LOGITS)


@pytest.mark.parametrize(("out", "which", "message"), [
    ((HIDDEN, LOGITS), 2, "the center model returns a tuple of 2 tensors; --output 2 is out "
                          "of range"),
    ((HIDDEN, LOGITS), -1, "the center model returns a tuple of 2 tensors; --output -1 is out "
                           "of range"),
    ((HIDDEN, LOGITS), "logits", "the center model returns a tuple of 2 tensors; --output "
                                 "logits names no element (give an index, 0 to 1)"),
    ({"hidden": HIDDEN, "scores": LOGITS}, 2, "the center model returns a dict with keys "
                                              "'hidden', 'scores'; --output 2 is out of range"),
    ({"hidden": HIDDEN, "scores": LOGITS}, "logits", "the center model returns a dict with "
     "keys 'hidden', 'scores'; --output logits is not one of them"),
    ((LOGITS, (HIDDEN,)), 1, "the center model returns a tuple of 2 elements; its element 1 "
                             "is a tuple of 1 tensor, not a logits tensor (name another with "
                             "--output)"),
    ((), None, "the center model returns an empty tuple, expected a logits tensor, or a tuple "
               "or dict holding it"),
    (None, None, "the center model returns NoneType, expected a logits tensor, or a tuple or "
                 "dict holding it"),
])
def test_an_element_that_is_not_there_is_refused_naming_what_the_model_returns(
        out: object, which: str | int | None, message: str) -> None:
    with pytest.raises(ModelFailed) as refused:
        resolve(out, which, "center")
    assert str(refused.value) == message


def test_a_recorded_element_the_module_no_longer_returns_fails_the_call() -> None:
    with pytest.raises(ModelFailed, match="returns a tensor, expected logits at 0"):
        select(LOGITS, 0)  # row 0 of a tensor is not its logits
    with pytest.raises(ModelFailed, match=r"returns a tuple of 2 tensors, expected logits at 2"):
        select((HIDDEN, LOGITS), 2)
    with pytest.raises(ModelFailed, match=r"returns a tuple of 2 tensors, expected a logits"):
        select((HIDDEN, LOGITS), None)


def test_publish_finds_the_element_once_and_runs_every_batch_with_it() -> None:
    second = torchscript.script(HiddenThenLogits())
    assert output_of(second, batch(), 1, "center") == 1
    logits = run_torchscript(second, batch(), "center", 1)
    assert logits.tolist() == [[15.0, 5.0], [40.0, 5.0], [65.0, 5.0]]
    named = torchscript.script(Named())
    assert output_of(named, batch(), None, "center") == "hidden"  # no "logits": the first
    assert run_torchscript(named, batch(), "center", "scores").tolist() == logits.tolist()
    with pytest.raises(ModelFailed, match="returns a tuple of 2 tensors; --output 2 is out"):
        output_of(second, batch(), 2, "center")


def test_the_wrapped_module_answers_only_its_logits() -> None:
    wrapped = Selected(torchscript.script(HiddenThenLogits()), 1)
    ids = torch.tensor([[1, 2], [3, 4]])
    assert wrapped(ids, torch.ones_like(ids)).tolist() == [[3.0, 2.0], [7.0, 2.0]]


def test_the_center_takes_the_element_its_manifest_records(tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    torchscript.save(torchscript.script(HiddenThenLogits()), path)
    feeds = batch().batches[0]
    runtime = TorchScriptRuntime(path, torch.device("cpu"), "fp32", 0,
                                 ["input_ids", "attention_mask"], logits=1)
    assert runtime.predict(feeds).tolist() == [[15.0, 5.0], [40.0, 5.0], [65.0, 5.0]]
    unaware = TorchScriptRuntime(path, torch.device("cpu"), "fp32", 0,
                                 ["input_ids", "attention_mask"])
    with pytest.raises(ModelFailed, match="returns a tuple of 2 tensors"):
        unaware.predict(feeds)


def test_a_release_without_the_field_keeps_its_bytes_and_one_with_it_needs_schema_4() -> None:
    old = manifest()
    data = encode(old)
    assert b'"logits"' not in data and decode(data) == old
    # byte for byte what the encoder wrote before the field existed
    builtins = msgspec.to_builtins(old)
    for absent in ("request", "input_reference", "logits", "cost"):
        del builtins[absent]
    del builtins["fidelity"]["candidates"]
    assert data == msgspec.json.format(msgspec.json.encode(builtins), indent=2) + b"\n"
    for which in (0, "logits"):
        new = msgspec.structs.replace(old, schema=LOGITS_SCHEMA, logits=which)
        assert f'"logits": {msgspec.json.encode(which).decode()}'.encode() in encode(new)
        assert decode(encode(new)).logits == which
    assert SCHEMA == LOGITS_SCHEMA == 4
    newer = msgspec.json.encode({**msgspec.to_builtins(old), "schema": SCHEMA + 1})
    with pytest.raises(NewerSchema, match=f"schema {SCHEMA + 1}: this node reads up to "
                                          f"schema {SCHEMA}"):
        decode(newer)
