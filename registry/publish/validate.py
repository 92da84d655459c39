"""Load the release's models and run them on calibration (or generated) inputs.

Checks what would otherwise break a tier at serving time: a file that is not TorchScript/ONNX,
a forward signature other than ``(input_ids, attention_mask)``, outputs of the wrong shape,
NaN or infinite outputs, center and edge disagreeing on the number of labels.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from registry.errors import InvalidRelease
from registry.publish.export import INPUT_NAMES
from serving.errors import ModelFailed
from serving.model import runner, torchscript
from serving.model.runner import BATCH, Inputs, text_inputs
from serving.model.text import Encoded

# the batches, the runs and the checks of their outputs are serving.model.runner's (the
# benchmarks run models with it too); this adds the release's own checks and InvalidRelease
__all__ = ["Inputs", "generated_inputs", "load_torchscript", "onnx_session", "run_onnx",
           "run_torchscript", "text_inputs"]

GENERATED_ROWS = 256
GENERATED_VOCAB = 100  # generated token ids stay below this, so any real vocabulary fits


def generated_inputs(seed: int = 0) -> Inputs:
    """Random token ids with varied lengths and padding, for releases without labelled data."""
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(GENERATED_ROWS // BATCH):
        seq = int(rng.integers(4, 48))
        ids = rng.integers(1, GENERATED_VOCAB, size=(BATCH, seq), dtype=np.int64)
        lengths = rng.integers(1, seq + 1, size=BATCH)
        mask = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int64)
        batches.append(Encoded(ids * mask, mask))
    return Inputs(batches, "generated")


def load_torchscript(path: Path, role: str) -> torch.jit.ScriptModule:
    try:
        module = torchscript.load(path)
    except Exception as exc:  # torch raises RuntimeError/ValueError/zip errors alike
        raise InvalidRelease(f"{path}: the {role} model is not a TorchScript file "
                             f"({type(exc).__name__})") from exc
    schema = getattr(module.forward, "schema", None)
    names = [arg.name for arg in schema.arguments][1:] if schema is not None else []
    if names != INPUT_NAMES:
        raise InvalidRelease(f"{path}: wrong input signature for the {role} model: forward("
                             f"{', '.join(names)}), expected forward(input_ids, attention_mask)")
    return module.eval()


def onnx_session(path: Path, role: str) -> ort.InferenceSession:
    try:
        session = runner.onnx_session(path)
    except Exception as exc:
        raise InvalidRelease(f"{path}: the {role} model is not a loadable ONNX file") from exc
    names = [i.name for i in session.get_inputs()]
    if sorted(names) != sorted(INPUT_NAMES):
        raise InvalidRelease(f"{path}: wrong input signature for the {role} model: inputs "
                             f"{names}, expected {INPUT_NAMES}")
    return session


def run_torchscript(module: torch.jit.ScriptModule, inputs: Inputs, role: str) -> np.ndarray:
    try:
        return runner.run_torchscript(module, inputs, role)
    except ModelFailed as exc:
        raise InvalidRelease(str(exc)) from exc


def run_onnx(session: ort.InferenceSession, inputs: Inputs, role: str) -> np.ndarray:
    try:
        return runner.run_onnx(session, inputs, role)
    except ModelFailed as exc:
        raise InvalidRelease(str(exc)) from exc
