"""TorchScript runtime: eval, ``torch.inference_mode``, device and precision chosen at run time."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from serving.inputs.base import Feeds
from serving.model import outputs, torchscript
from serving.model.outputs import Selector

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def pick_device(setting: str) -> torch.device:
    if setting == "cuda" or (setting == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise RuntimeError("CENTER_DEVICE=cuda but no CUDA device is available")
        return torch.device("cuda")
    return torch.device("cpu")


class TorchScriptRuntime:
    def __init__(self, path: Path, device: torch.device, precision: str, threads: int,
                 inputs: list[str], logits: Selector | None = None) -> None:
        """``inputs``: the model's input names in ``forward``'s order (the manifest's);
        ``logits``: where the logits are in what the module returns (the manifest's: an index
        or key of a tuple or dict; None, the module returns them)."""
        self.inputs = inputs
        self.logits = logits
        if threads:
            torch.set_num_threads(threads)
        self.device = device
        # half precision only where it pays (CUDA); CPU fp16 matmuls are slow or missing
        self.dtype = DTYPES[precision] if device.type == "cuda" else torch.float32
        module = torchscript.load(path, str(device)).eval()
        self.module = module.to(self.dtype) if self.dtype != torch.float32 else module
        self.description = (f"torch {torch.__version__} TorchScript on {device} "
                            f"({str(self.dtype).removeprefix('torch.')})")

    def predict(self, feeds: Feeds) -> np.ndarray:
        args = [self._tensor(feeds[name]) for name in self.inputs]
        with torch.inference_mode():
            logits = outputs.select(self.module(*args), self.logits)
        return np.asarray(logits.float().cpu().numpy())

    def _tensor(self, values: np.ndarray) -> torch.Tensor:
        tensor = torch.from_numpy(values).to(self.device, non_blocking=True)
        # floating inputs (images, features) in the module's precision; token ids stay integers
        return tensor.to(self.dtype) if tensor.is_floating_point() else tensor
