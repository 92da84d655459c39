"""Load the release's models and run them on calibration (or generated) inputs.

Checks what would otherwise break a tier at serving time: a file that is not TorchScript/ONNX,
an edge whose inputs are not the center's, a tuple or dict output without the element named
as the logits (``serving.model.outputs``), outputs of the wrong shape, NaN or infinite outputs,
center and edge disagreeing on the number of labels (the signature itself:
``registry.publish.signature``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
import onnxruntime as ort
import torch

from registry.errors import InvalidRelease, brief
from serving.errors import ModelFailed
from serving.inputs.base import Codec
from serving.model import runner, torchscript
from serving.model.outputs import Selector
from serving.model.runner import BATCH, Inputs, forward_names, text_inputs

# the batches, the runs and the checks of their outputs are serving.model.runner's (the
# benchmarks run models with it too); this adds the release's own checks and InvalidRelease
__all__ = ["Inputs", "batched", "forward_names", "load_torchscript", "onnx_session",
           "output_of", "run_onnx", "run_torchscript", "text_inputs"]

GENERATED_ROWS = 256


def batched(codec: Codec, rows: list[np.ndarray] | None, seed: int = 0) -> Inputs:
    """``rows`` (calibration) or, without them, generated rows, in model calls of ``BATCH``."""
    kind: Literal["calibration", "generated"] = ("calibration" if rows is not None
                                                  else "generated")
    rows = rows if rows is not None else codec.sample(GENERATED_ROWS, seed)
    return Inputs([codec.collate(rows[i:i + BATCH]) for i in range(0, len(rows), BATCH)],
                  kind)


def load_torchscript(path: Path, role: str,
                     names: list[str] | None = None) -> torch.jit.ScriptModule:
    """The module at ``path``; with ``names``, its ``forward`` must take exactly those."""
    try:
        module = torchscript.load(path)
    except Exception as exc:  # torch raises RuntimeError/ValueError/zip errors alike
        raise InvalidRelease(f"{path}: the {role} model is not a TorchScript file "
                             f"({type(exc).__name__})") from exc
    found = forward_names(module)
    if names is not None and found != names:
        raise InvalidRelease(f"{path}: wrong input signature for the {role} model: forward("
                             f"{', '.join(found)}), expected forward({', '.join(names)})")
    return module.eval()


def onnx_session(path: Path, role: str, names: list[str]) -> ort.InferenceSession:
    """A session over the ONNX file at ``path``, whose inputs must be among ``names`` (the
    model's: a text edge may leave ``token_type_ids`` out)."""
    try:
        session = runner.onnx_session(path)
    except Exception as exc:
        raise InvalidRelease(f"{path}: the {role} model is not a loadable ONNX file") from exc
    found = [i.name for i in session.get_inputs()]
    if not found or not set(found) <= set(names):
        raise InvalidRelease(f"{path}: wrong input signature for the {role} model: inputs "
                             f"{found}, expected {names}")
    return session


def output_of(module: torch.jit.ScriptModule, inputs: Inputs, which: Selector | None,
              role: str, option: str) -> Selector | None:
    """Where the module's logits are in what it returns (None: it returns them); ``which``
    as the user gave it (``option`` says how, for the error)."""
    try:
        return runner.output_of(module, inputs, which, role, option)
    except ModelFailed as exc:
        raise InvalidRelease(brief(exc)) from exc
    except Exception as exc:  # the first call: the user's model refusing the declared inputs
        raise InvalidRelease(_failed(role, inputs, exc)) from exc


def run_torchscript(module: torch.jit.ScriptModule, inputs: Inputs, role: str,
                    output: Selector | None = None) -> np.ndarray:
    try:
        return runner.run_torchscript(module, inputs, role, output)
    except ModelFailed as exc:
        raise InvalidRelease(brief(exc)) from exc
    except Exception as exc:  # the user's model refusing the declared inputs (shape, dtype)
        raise InvalidRelease(_failed(role, inputs, exc)) from exc


def run_onnx(session: ort.InferenceSession, inputs: Inputs, role: str) -> np.ndarray:
    try:
        return runner.run_onnx(session, inputs, role)
    except ModelFailed as exc:
        raise InvalidRelease(brief(exc)) from exc
    except Exception as exc:  # onnxruntime's InvalidArgument, Fail...: the model's inputs
        raise InvalidRelease(_failed(role, inputs, exc)) from exc


def _failed(role: str, inputs: Inputs, exc: Exception) -> str:
    shapes = {name: list(array.shape) for name, array in inputs.batches[0].items()} \
        if inputs.batches else {}
    return (f"the {role} model fails on {inputs.kind} inputs {shapes} built from the declared "
            f"inputs (--input, or \"inputs\" in tiered.json): {brief(exc)}")
