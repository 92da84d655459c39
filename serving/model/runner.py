"""A classifier run over a fixed set of rows, outside any server: the rows in batches of
``BATCH`` (each the model's feeds by input name: tokenized texts, images, features), a
TorchScript module or an ONNX session run over each batch (the logits taken from what the
module returns: ``serving.model.outputs``), and the logits checked
(``[rows, labels >= 2]``, finite) and joined. ``registry publish``
validates a release's models with it (``registry.publish.validate``); the benchmarks measure models
with it, on the batches publish uses.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import onnxruntime as ort
import torch

from serving.errors import ModelFailed
from serving.model import outputs
from serving.model.outputs import Selector
from serving.model.text import encode, load_tokenizer

BATCH = 32
Feeds = dict[str, np.ndarray]


@dataclass(frozen=True)
class Inputs:
    batches: list[Feeds]
    kind: Literal["calibration", "generated"]

    @property
    def rows(self) -> int:
        return sum(rows(b) for b in self.batches)


def rows(feeds: Feeds) -> int:
    return len(next(iter(feeds.values())))


def text_inputs(tokenizer: Path, max_length: int, texts: list[str]) -> Inputs:
    tok = load_tokenizer(tokenizer, max_length)
    return Inputs([encode(tok, texts[i:i + BATCH]).feeds()
                   for i in range(0, len(texts), BATCH)], "calibration")


def forward_names(module: torch.jit.ScriptModule) -> list[str]:
    """The names of ``forward``'s arguments, in order (``self`` left out)."""
    schema = getattr(module.forward, "schema", None)
    return [arg.name for arg in schema.arguments][1:] if schema is not None else []


def onnx_session(path: Path) -> ort.InferenceSession:
    """A CPU session over the ONNX file at ``path``, onnxruntime's default options."""
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def output_of(module: torch.jit.ScriptModule, inputs: Inputs, which: Selector | None,
              role: str, option: str = "--output") -> Selector | None:
    """Where ``module``'s logits are in what it returns (``serving.model.outputs.resolve``),
    from a call on the first batch: None for a tensor, else the index or key to take."""
    names = forward_names(module)
    with torch.inference_mode():
        out = module(*[torch.from_numpy(inputs.batches[0][name]) for name in names])
    return outputs.resolve(out, which, role, option)


def run_torchscript(module: torch.jit.ScriptModule, inputs: Inputs, role: str,
                    output: Selector | None = None) -> np.ndarray:
    """The logits on every batch: what the module returns, or its element ``output``."""
    names = forward_names(module)

    def run(batch: Feeds) -> np.ndarray:
        with torch.inference_mode():
            out = module(*[torch.from_numpy(batch[name]) for name in names])
        return outputs.select(out, output, role).float().numpy()

    return _collect((run(b) for b in inputs.batches), inputs, role)


def run_onnx(session: ort.InferenceSession, inputs: Inputs, role: str) -> np.ndarray:
    names = [i.name for i in session.get_inputs()]

    def run(batch: Feeds) -> np.ndarray:
        try:
            return np.asarray(session.run(None, {n: batch[n] for n in names})[0],
                              dtype=np.float32)
        except Exception as exc:
            raise ModelFailed(f"the {role} model failed on calibration inputs: {exc}") from exc

    return _collect((run(b) for b in inputs.batches), inputs, role)


def _collect(outputs: Iterator[np.ndarray], inputs: Inputs, role: str) -> np.ndarray:
    parts = []
    for batch, out in zip(inputs.batches, outputs, strict=True):
        count = rows(batch)
        if out.ndim != 2 or out.shape[0] != count or out.shape[1] < 2:
            raise ModelFailed(f"the {role} model returned shape {list(out.shape)} for "
                              f"{count} rows; expected [{count}, labels>=2]")
        if not np.isfinite(out).all():
            raise ModelFailed(f"the {role} model returned NaN or infinite outputs on "
                              f"{inputs.kind} inputs")
        parts.append(out)
    return np.concatenate(parts)
