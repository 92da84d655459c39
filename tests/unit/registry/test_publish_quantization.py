"""Publish's INT8 choice: of dynamic and (for a convolutional model) static quantization, the
one whose answers agree best with the fp32 edge's is kept. The quantizers and onnxruntime are
replaced by stand-ins whose agreements are set, so the choice is seen on both sides."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from registry.publish import pipeline
from serving.model.runner import Inputs

ROWS = 200
REFERENCE = np.tile([[1.0, 0.0]], (ROWS, 1))  # the fp32 edge: class 0 for every row


def logits(agreeing: int) -> np.ndarray:
    """Answers agreeing with ``REFERENCE`` on the first ``agreeing`` rows."""
    out = np.tile([[0.0, 1.0]], (ROWS, 1))
    out[:agreeing] = [1.0, 0.0]
    return out


def choose(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, agreeing: dict[str, int],
           conv: bool = True) -> tuple[str, str, np.ndarray, list[str]]:
    """``_quantize`` with each method's model agreeing on ``agreeing[method]`` rows: the
    method kept, the edge file's content, the logits returned, the methods tried (each with
    its agreement recorded)."""
    tried: list[str] = []

    def quantize(fp32: Path, int8: Path, q: object, calibration: object = None) -> None:
        method = q.method  # type: ignore[attr-defined]
        tried.append(method)
        int8.write_text(method)

    monkeypatch.setattr(pipeline, "convolutional", lambda path: conv)
    monkeypatch.setattr(pipeline, "quantize_int8", quantize)
    monkeypatch.setattr(pipeline, "onnx_session", lambda path, role, names: path.read_text())
    monkeypatch.setattr(pipeline, "run_onnx",
                        lambda session, inputs, role: logits(agreeing[session]))
    fp32 = tmp_path / "edge-fp32.onnx"
    fp32.write_text("fp32")
    q, final, session, out, scores = pipeline._quantize(
        fp32, tmp_path, Inputs([], "calibration"), REFERENCE, ["x"])
    assert final == tmp_path / pipeline.EDGE_FILE and session == q.method
    assert scores == {method: agreeing[method] / ROWS for method in tried}
    return q.method, final.read_text(), out, tried


@pytest.mark.parametrize(("dynamic", "static", "kept"), [
    (180, 190, "static"),  # 90% vs 95%: static is better
    (190, 180, "dynamic"),  # the other way round
    (189, 190, "static"),  # by one row
    (190, 189, "dynamic"),
    (186, 186, "dynamic"),  # a tie: dynamic needs no calibration
])
def test_the_int8_model_agreeing_best_with_the_fp32_edge_is_kept(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, dynamic: int, static: int,
        kept: str) -> None:
    agreeing = {"dynamic": dynamic, "static": static}
    method, stored, out, tried = choose(monkeypatch, tmp_path, agreeing)
    assert tried == ["dynamic", "static"]
    assert method == stored == kept  # the kept file is the chosen model
    np.testing.assert_array_equal(out, logits(agreeing[kept]))


def test_a_model_without_convolutions_is_quantized_dynamically_only(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    method, stored, _, tried = choose(monkeypatch, tmp_path, {"dynamic": 150, "static": 200},
                                      conv=False)
    assert tried == ["dynamic"] and method == stored == "dynamic"
