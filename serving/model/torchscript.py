"""TorchScript in and out, in one place.

TorchScript is the center's artifact format (the contract in DESIGN.md). torch 2.13 marks
``torch.jit.script/save/load`` deprecated in favour of ``torch.export``; the notice is
silenced here, and only here, so that every other warning still counts.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch


@contextmanager
def _quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*torch\.jit\..*deprecated",
                                category=DeprecationWarning)
        yield


def script(module: torch.nn.Module) -> torch.jit.ScriptModule:
    with _quiet():
        return torch.jit.script(module.eval())


def save(module: torch.jit.ScriptModule, path: Path) -> None:
    with _quiet():
        torch.jit.save(module, str(path))


def load(path: Path, device: str = "cpu") -> torch.jit.ScriptModule:
    with _quiet():
        return torch.jit.load(str(path), map_location=device)
