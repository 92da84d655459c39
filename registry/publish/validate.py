"""Load the release's models and run them on calibration (or generated) inputs.

Checks what would otherwise break a tier at serving time: a file that is not TorchScript/ONNX,
a forward signature other than ``(input_ids, attention_mask)``, outputs of the wrong shape,
NaN or infinite outputs, center and edge disagreeing on the number of labels.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import onnxruntime as ort
import torch

from registry.errors import InvalidRelease
from registry.publish.export import INPUT_NAMES
from serving.model import torchscript
from serving.model.text import Encoded, encode, load_tokenizer

BATCH = 32
GENERATED_ROWS = 256
GENERATED_VOCAB = 100  # generated token ids stay below this, so any real vocabulary fits


@dataclass(frozen=True)
class Inputs:
    batches: list[Encoded]
    kind: Literal["calibration", "generated"]

    @property
    def rows(self) -> int:
        return sum(len(b.input_ids) for b in self.batches)


def text_inputs(tokenizer: Path, max_length: int, texts: list[str]) -> Inputs:
    tok = load_tokenizer(tokenizer, max_length)
    return Inputs([encode(tok, texts[i:i + BATCH]) for i in range(0, len(texts), BATCH)],
                  "calibration")


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
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise InvalidRelease(f"{path}: the {role} model is not a loadable ONNX file") from exc
    names = [i.name for i in session.get_inputs()]
    if sorted(names) != sorted(INPUT_NAMES):
        raise InvalidRelease(f"{path}: wrong input signature for the {role} model: inputs "
                             f"{names}, expected {INPUT_NAMES}")
    return session


def run_torchscript(module: torch.jit.ScriptModule, inputs: Inputs, role: str) -> np.ndarray:
    def run(batch: Encoded) -> np.ndarray:
        with torch.inference_mode():
            out = module(torch.from_numpy(batch.input_ids), torch.from_numpy(batch.attention_mask))
        if not isinstance(out, torch.Tensor):
            raise InvalidRelease(f"the {role} model returns {type(out).__name__}, expected a "
                                 f"logits tensor")
        return out.float().numpy()

    return _collect((run(b) for b in inputs.batches), inputs, role)


def run_onnx(session: ort.InferenceSession, inputs: Inputs, role: str) -> np.ndarray:
    def run(batch: Encoded) -> np.ndarray:
        try:
            return np.asarray(session.run(None, batch.feeds())[0], dtype=np.float32)
        except Exception as exc:
            raise InvalidRelease(f"the {role} model failed on calibration inputs: {exc}") from exc

    return _collect((run(b) for b in inputs.batches), inputs, role)


def _collect(outputs: Iterator[np.ndarray], inputs: Inputs, role: str) -> np.ndarray:
    parts = []
    for batch, out in zip(inputs.batches, outputs, strict=True):
        rows = len(batch.input_ids)
        if out.ndim != 2 or out.shape[0] != rows or out.shape[1] < 2:
            raise InvalidRelease(f"the {role} model returned shape {list(out.shape)} for "
                                 f"{rows} rows; expected [{rows}, labels>=2]")
        if not np.isfinite(out).all():
            raise InvalidRelease(f"the {role} model returned NaN or infinite outputs on "
                                 f"{inputs.kind} inputs")
        parts.append(out)
    return np.concatenate(parts)
