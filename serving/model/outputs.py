"""Which part of a model's output is the logits.

Exports return more than a tensor: a Hugging Face model traced with ``torchscript=True,
return_dict=False`` returns the tuple ``(logits,)``, other modules a dict (``{"logits": ...,
"hidden": ...}``) or a tuple whose logits come second. The logits are the element the user
names (an index, or a key of a dict), else the first element (a dict's ``logits`` when it has
one). Publish resolves that once (:func:`resolve`) and records the index or key in the
manifest; the center takes the same element at every call (:func:`select`).
"""

from __future__ import annotations

from typing import Any

import torch

from serving.errors import ModelFailed

Selector = str | int
"""An element of a tuple or list (its index) or of a dict (its key)."""


def describe(out: object) -> str:
    """What a model returned, as a user would say it: ``a tensor``, ``a tuple of 2 tensors``,
    ``a dict with keys 'logits', 'hidden'``."""
    if isinstance(out, torch.Tensor):
        return "a tensor"
    if isinstance(out, tuple | list):
        kind = type(out).__name__ if type(out) in (tuple, list) else "tuple"
        what = "tensor" if all(isinstance(v, torch.Tensor) for v in out) else "element"
        plural = "" if len(out) == 1 else "s"
        return f"an empty {kind}" if not out else f"a {kind} of {len(out)} {what}{plural}"
    if isinstance(out, dict):
        return f"a dict with keys {', '.join(repr(k) for k in out)}"
    return type(out).__name__


def resolve(out: object, which: Selector | None, role: str, option: str = "--output",
            ) -> Selector | None:
    """The index or key of the logits in ``out`` (None: ``out`` is the logits tensor itself);
    :class:`ModelFailed`, naming what the model returns, when ``which`` picks nothing."""
    if isinstance(out, torch.Tensor):
        return None
    returns = f"the {role} model returns {describe(out)}"
    if isinstance(out, dict):
        keys = list(out)
        if which is None:
            which = "logits" if "logits" in keys else 0
        if isinstance(which, int):
            if which >= len(keys):
                raise ModelFailed(f"{returns}; {option} {which} is out of range")
            which = keys[which]
        if which not in out:
            raise ModelFailed(f"{returns}; {option} {which} is not one of them")
    elif isinstance(out, tuple | list) and out:
        which = 0 if which is None else which
        if isinstance(which, str):
            raise ModelFailed(f"{returns}; {option} {which} names no element (give an index, "
                              f"0 to {len(out) - 1})")
        if not 0 <= which < len(out):
            raise ModelFailed(f"{returns}; {option} {which} is out of range")
    else:
        raise ModelFailed(f"{returns}, expected a logits tensor, or a tuple or dict holding it")
    element = out[which]  # type: ignore[index]
    if not isinstance(element, torch.Tensor):
        raise ModelFailed(f"{returns}; its element {which!r} is {describe(element)}, not a "
                          f"logits tensor (name another with {option})")
    return which


def select(out: Any, which: Selector | None, role: str = "center") -> torch.Tensor:
    """The logits in ``out``: ``out`` itself (``which`` None), or its element ``which``."""
    logits = out
    if which is not None and isinstance(out, tuple | list | dict):
        try:
            logits = out[which]  # type: ignore[index]  # a key of a list: TypeError
        except (IndexError, KeyError, TypeError):
            logits = None
    if not isinstance(logits, torch.Tensor) or (which is not None and logits is out):
        expected = "a logits tensor" if which is None else f"logits at {which!r}"
        raise ModelFailed(f"the {role} model returns {describe(out)}, expected {expected}")
    return logits


class Selected(torch.nn.Module):
    """``module`` answering only its element ``which``: what is exported to ONNX, whose one
    output is then the logits."""

    def __init__(self, module: torch.nn.Module, which: Selector) -> None:
        super().__init__()
        self.module = module
        self.which = which

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        return select(self.module(*args), self.which)
