"""Request input kinds: what clients send, and how it becomes the model's inputs.

A release declares each request input's kind (``serving.release.manifest.RequestInput``):
``text`` (strings, tokenized), ``image`` (encoded JPEG/PNG or pixel tensors, decoded and
normalised as declared) or ``tensor`` (passed through, checked). Each kind is one module with
one codec class (:class:`serving.inputs.base.Codec`): it parses and bounds the V2 inputs,
makes the model's feeds from rows, gives the batcher each row's cost, makes rows for warm-up
and generated calibration, and gives the form rows are forwarded to the center in. The
protocol, the batcher, the data plane, the edge's escalation and audit and the publish
pipeline only ever talk to a codec. A new kind is a module here and a line in ``KINDS``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from serving.inputs.base import Bounds, Codec
from serving.inputs.image import ImageCodec
from serving.inputs.tensor import TensorCodec
from serving.inputs.text import TextCodec
from serving.release.manifest import ImageInput, Manifest, RequestInput, TensorInput, TensorSpec
from serving.release.manifest import TextInput as TextSpec

__all__ = ["KINDS", "Bounds", "Codec", "codec", "for_manifest"]

KINDS: dict[type, type[Codec]] = {TextSpec: TextCodec, ImageInput: ImageCodec,
                                  TensorInput: TensorCodec}


def codec(request: list[RequestInput], inputs: list[TensorSpec], bounds: Bounds,
          files: Callable[[str], Path]) -> Codec:
    """The codec of a release's request inputs over the model's ``inputs``; ``files``: where a
    file the release names lies (a tokenizer)."""
    if len(request) != 1:
        raise ValueError(f"a release declares {len(request)} request inputs; this version "
                         f"serves exactly one (its kind feeds every model input)")
    spec = request[0]
    return KINDS[type(spec)](spec, inputs, bounds, files)


def for_manifest(manifest: Manifest, folder: Path, bounds: Bounds) -> Codec:
    """The codec of a stored release (its files in ``folder``)."""
    return codec(manifest.request_inputs(), manifest.inputs, bounds, lambda name: folder / name)
