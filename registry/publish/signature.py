"""What the release's model takes and what its clients send: the model's inputs (declared, or
read from a text model's ``forward`` signature) and the request input's kind, checked against
both models before any work, and the kind's codec (``serving.inputs``) that publish decodes
calibration rows with, exactly as the tiers will decode requests.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from registry.errors import InvalidRelease, brief
from registry.publish.source import PAIR, TEXT_INPUTS, ReleaseSource
from serving import inputs
from serving.errors import BadRequest
from serving.inputs.base import Bounds, Codec
from serving.release.manifest import ImageInput, RequestInput, TensorInput, TensorSpec, TextInput

TOKENIZER_FILE = "tokenizer.json"
LEGACY = ["input_ids", "attention_mask"]  # schema 1: what every node can serve
CALIBRATION_BOUNDS = Bounds(max_rows=1 << 20, max_text_bytes=1 << 20)


@dataclass(frozen=True)
class Signature:
    inputs: list[TensorSpec]  # the model's, in forward's order
    request: RequestInput
    codec: Codec

    @property
    def legacy(self) -> bool:
        """A text model with ids and mask: a schema-1 release, served by every node."""
        return (isinstance(self.request, TextInput) and self.request.pair is None
                and [i.name for i in self.inputs] == LEGACY)


def resolve(source: ReleaseSource, names: list[str], role: str) -> Signature:
    """The release's signature from the center model's ``forward`` argument ``names``."""
    declared = source.inputs
    if declared is None:
        if not names or names[:2] != LEGACY or not set(names) <= set(TEXT_INPUTS):
            raise InvalidRelease(
                f"{source.center}: wrong input signature for the {role} model: forward("
                f"{', '.join(names)}); a text model takes forward(input_ids, attention_mask[, "
                f"token_type_ids]). Declare "
                f"any other model's inputs: --input NAME:DATATYPE:SHAPE (e.g. "
                f"--input image:FP32:-1,1,28,28, with --image for decoding), or \"inputs\" "
                f"in tiered.json")
        declared = [TensorSpec(name, "INT64", [-1, -1]) for name in names]
    elif [i.name for i in declared] != names:
        raise InvalidRelease(f"{source.center}: the {role} model takes forward("
                             f"{', '.join(names)}), the release declares inputs "
                             f"{[i.name for i in declared]}")
    request = _paired(source, source.request or _derived(source, declared))
    if isinstance(request, TextInput):  # the tokenizer is stored under one name
        request = msgspec.structs.replace(
            request, tokenizer=TOKENIZER_FILE if source.tokenizer else None)
    tokenizer = source.tokenizer
    try:
        codec = inputs.codec([request], declared, CALIBRATION_BOUNDS,
                             lambda name: tokenizer if tokenizer else Path(name))
    except Exception as exc:  # a codec refusing the model, or a tokenizer file that does not load
        raise InvalidRelease(f"the release's request input does not fit its model: "
                             f"{exc}") from exc
    return Signature(declared, request, codec)


def _paired(source: ReleaseSource, request: RequestInput) -> RequestInput:
    """A text release takes sentence pairs when it says so (``"pair"`` in tiered.json's
    request, ``--pair``) or when its calibration rows carry ``text_pair``; then every row
    must."""
    if not isinstance(request, TextInput) or source.calibration is None:
        return request
    pairs = [isinstance(item, tuple) for item in source.calibration.items]
    if any(pairs) and request.pair is None:
        if source.request is not None:
            raise InvalidRelease(f"calibration rows carry {PAIR!r} but the release's text "
                                 f"input takes single texts: declare \"pair\": \"{PAIR}\" in "
                                 f"its request")
        request = msgspec.structs.replace(request, pair=PAIR)
    if request.pair is not None and not all(pairs):
        raise InvalidRelease(f"the release takes sentence pairs: every calibration row needs "
                             f"{PAIR!r} (row {pairs.index(False) + 1} has none)")
    return request


def _derived(source: ReleaseSource, declared: list[TensorSpec]) -> RequestInput:
    if source.kind == "text":
        return TextInput(tokenizer=TOKENIZER_FILE if source.tokenizer else None,
                         max_length=source.max_length)
    if len(declared) != 1:
        raise InvalidRelease(f"a model with inputs {[i.name for i in declared]} cannot be "
                             f"served as tensors: a release takes one request input, and a "
                             f"tensor one feeds a model with one input (a text model takes "
                             f"input_ids, attention_mask[, token_type_ids]; an image model "
                             f"one image)")
    return TensorInput(declared[0].name)


def calibration_rows(signature: Signature, items: list[Any]) -> list[Any]:
    """The calibration split's items as the model's rows, decoded by the request input's codec
    as requests are: a row the tiers would refuse (shape, datatype, range) is refused here."""
    try:
        return signature.codec.items(items)
    except (BadRequest, ValueError, TypeError, IndexError) as exc:
        raise InvalidRelease(f"the calibration split does not fit the release's request "
                             f"input: {brief(exc)}") from exc


def image_input(spec: TensorSpec, options: dict[str, str]) -> ImageInput:
    """``--image`` options (``scale=255,mean=0.5,std=0.5``; lists with ``/``) for an FP32
    input of shape ``[-1, C, H, W]`` (NCHW) or ``[-1, H, W, C]`` (``layout=NHWC``)."""
    layout = options.get("layout", "NCHW")
    if len(spec.shape) != 4 or spec.datatype != "FP32":
        raise InvalidRelease(f"--image needs an FP32 input of shape [-1, C, H, W]; "
                             f"{spec.name} is {spec.datatype} {spec.shape}")
    c, h, w = spec.shape[1:] if layout == "NCHW" else (spec.shape[3], *spec.shape[1:3])
    fields: dict[str, object] = {"name": spec.name, "height": h, "width": w, "channels": c,
                                 "layout": layout}
    for key, value in options.items():
        try:
            if key in ("mean", "std"):
                fields[key] = [float(v) for v in value.split("/")]
            elif key in ("scale",):
                fields[key] = float(value)
            elif key in ("resize", "max_pixels"):
                fields[key] = int(value)
        except ValueError:
            raise InvalidRelease(f"--image: {key}={value!r} is not a number (lists: "
                                 f"0.485/0.456/0.406)") from None
        if key not in ("mean", "std", "scale", "resize", "max_pixels", "layout"):
            raise InvalidRelease(f"--image: unknown option {key!r} (resize, scale, mean, std, "
                                 f"layout, max_pixels)")
    try:
        return msgspec.convert(fields, ImageInput)
    except msgspec.ValidationError as exc:
        raise InvalidRelease(f"--image: {exc}") from exc
