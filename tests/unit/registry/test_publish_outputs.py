"""An fp32 ONNX edge with several outputs (``registry.publish.export.one_output``): publish
keeps only the logits (named, indexed, else ``logits`` or the first), so the INT8 edge has the
one output every node reads; a name or index the model does not have is refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from registry.errors import InvalidRelease
from registry.publish.export import one_output
from serving.model.runner import onnx_session


def two_outputs(path: Path, names: tuple[str, ...] = ("hidden", "scores")) -> Path:
    """``x`` [rows, 2] in; ``names[0]`` = x + 1, ``names[1]`` = x * 10 out."""
    nodes = [helper.make_node("Add", ["x", "one"], [names[0]]),
             helper.make_node("Mul", ["x", "ten"], [names[1]])]
    graph = helper.make_graph(
        nodes, "two", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", 2])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["rows", 2]) for n in names],
        [helper.make_tensor("one", TensorProto.FLOAT, [], [1.0]),
         helper.make_tensor("ten", TensorProto.FLOAT, [], [10.0])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def answer(path: Path) -> list[list[float]]:
    session = onnx_session(path)
    assert len(session.get_outputs()) == 1
    x = np.array([[1.0, 2.0]], dtype=np.float32)
    return np.asarray(session.run(None, {"x": x})[0]).tolist()


@pytest.mark.parametrize(("which", "expected"), [(1, [[10.0, 20.0]]), ("scores", [[10.0, 20.0]]),
                                                 (0, [[2.0, 3.0]]), (None, [[2.0, 3.0]])])
def test_only_the_named_or_first_output_is_kept(tmp_path: Path, which: str | int | None,
                                                expected: list[list[float]]) -> None:
    kept, name = one_output(two_outputs(tmp_path / "edge.onnx"), tmp_path, which, "--output")
    assert answer(kept) == expected and name == ("scores" if expected[0][0] == 10 else "hidden")


def test_an_output_named_logits_is_the_default(tmp_path: Path) -> None:
    path = two_outputs(tmp_path / "edge.onnx", ("hidden", "logits"))
    kept, name = one_output(path, tmp_path, None, "--output")
    assert name == "logits" and answer(kept) == [[10.0, 20.0]]


@pytest.mark.parametrize(("which", "message"), [
    (2, "the edge model returns 2 outputs (hidden, scores); --output 2 is out of range"),
    ("logits", "the edge model returns 2 outputs (hidden, scores); --output logits is not one "
               "of them"),
])
def test_an_output_the_edge_does_not_have_is_refused(tmp_path: Path, which: str | int,
                                                     message: str) -> None:
    with pytest.raises(InvalidRelease) as refused:
        one_output(two_outputs(tmp_path / "edge.onnx"), tmp_path, which, "--output")
    assert str(refused.value) == message


def test_an_edge_with_one_output_is_used_as_it_is(tmp_path: Path) -> None:
    model = onnx.load(str(two_outputs(tmp_path / "full.onnx")))
    del model.graph.output[0]
    onnx.save(model, str(tmp_path / "one.onnx"))
    assert one_output(tmp_path / "one.onnx", tmp_path, 5, "--output") == (tmp_path / "one.onnx",
                                                                          None)
