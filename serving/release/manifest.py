"""The release manifest (``release.json``): the contract between registry, sync and the tiers."""

from __future__ import annotations

import re
from typing import Literal

import msgspec

from serving.release.hardware import Platform

NAME_PATTERN = re.compile(r"[a-z0-9][a-z0-9._-]*")
MAX_NAME_LENGTH = 128


def is_valid_name(name: str) -> bool:
    """Model names are path components in every store: ASCII lowercase letters, digits, ``.``,
    ``_``, ``-``; no slashes, no ``..``, no leading dot, at most 128 characters."""
    return (isinstance(name, str) and name.isascii() and len(name) <= MAX_NAME_LENGTH
            and NAME_PATTERN.fullmatch(name) is not None and ".." not in name)


class TensorSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: str
    datatype: str  # V2 datatype: INT64, FP32, BYTES, ...
    shape: list[int]  # -1 for a variable dimension


class Chunking(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """How an artifact is cut into content-defined chunks (serving.release.chunks): the sha256
    of its chunk index (each chunk's sha256 and length), which nodes fetch to download only the
    chunks they do not hold, and the parameters that reproduce the cuts."""

    index_sha256: str
    count: int
    min_size: int
    avg_size: int
    max_size: int
    algorithm: Literal["fastcdc-2020"] = "fastcdc-2020"
    compression: Literal["zstd"] = "zstd"


class Artifact(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    file: str  # file name inside the version folder
    sha256: str
    size: int
    format: Literal["torchscript", "onnx", "tokenizer", "probe"]
    precision: str = ""  # fp32, int8-dynamic-per-channel, ...
    chunks: Chunking | None = None  # None: fetched whole (published before chunking)


class CurvePoint(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    threshold: float
    escalation_rate: float
    cascade_accuracy: float


class AgreementBin(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Calibration rows whose edge confidence is at most ``le`` (and above the previous bin's):
    how often the center gives the same answer, and on the rows where it does not, how much
    more often the center is right than the edge (center correct - edge correct, -1..1)."""

    le: float
    rows: int
    agreement: float
    gain: float


class Calibration(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    source: Literal["labelled", "default"]  # default: no labelled data, documented threshold
    threshold: float
    escalation_rate: float | None = None
    center_accuracy: float | None = None
    edge_accuracy: float | None = None
    cascade_accuracy: float | None = None
    tolerance: float | None = None
    confidence: float | None = None  # bootstrap share required (see registry.publish.calibrate)
    rows: int = 0
    curve: list[CurvePoint] = []
    # edge-center agreement by edge confidence: the baseline the nodes' live audit is held to
    # (empty in releases published before it existed: no drift alarm, no accuracy estimate)
    agreement: list[AgreementBin] = []


class Quantization(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """How the edge model was quantized: onnxruntime ``quantize_dynamic`` (weights INT8,
    activations quantized per batch: transformers), or ``quantize_static`` (QDQ, activations
    calibrated on the release's calibration rows: convolutional models); publish picks the one
    with the better fidelity."""

    method: Literal["dynamic", "static"] = "dynamic"
    weight_type: Literal["int8"] = "int8"
    per_channel: bool = True
    reduce_range: bool = True  # 7-bit weights: no u8s8 saturation on x86 without VNNI


class Fidelity(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    top1_agreement: float  # INT8 edge vs its fp32 source, on the publisher's CPU
    rows: int
    minimum: float  # the release's floor: publish refuses below it, and so does every node
    inputs: Literal["calibration", "generated"]
    forced: bool = False
    platform: Platform | None = None  # where top1_agreement was measured
    probe_agreement: float | None = None  # on the probe the nodes re-run, same CPU
    # each INT8 candidate's top1_agreement by method (dynamic, and static for a convolutional
    # model): the kept one is ``Quantization.method`` (None: published before it was recorded)
    candidates: dict[str, float] | None = None


class Cost(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What a row costs each tier on the publisher's CPU, in process: the center's TorchScript
    fp32 and the edge's INT8 ONNX, milliseconds per row at ``batch`` rows a call (the median
    over ``repeats`` passes of the batches of ``rows`` calibration rows). A figure of the
    publisher's machine: a GPU center, or another CPU, costs otherwise."""

    center_ms: float
    edge_ms: float
    batch: int
    rows: int
    repeats: int
    platform: Platform | None = None

    @property
    def ratio(self) -> float:
        """How many times cheaper a row is on the edge."""
        return self.center_ms / self.edge_ms if self.edge_ms > 0 else float("inf")


class Preprocessing(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    tokenizer: str | None  # file name inside the version folder; None: raw tensors only
    max_length: int


class TextInput(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag="text",
                tag_field="kind"):
    """Strings (``BYTES``) tokenized with the release's tokenizer, or token tensors
    (``input_ids`` + ``attention_mask`` [+ ``token_type_ids``], ``INT64``); feeds the model's
    ``input_ids``, ``attention_mask`` and, where it takes one, ``token_type_ids``. With
    ``pair``, each row is a sentence pair: ``name`` and the ``BYTES`` input ``pair`` names,
    encoded as the tokenizer encodes pairs (its segment ids feed ``token_type_ids``)."""

    name: str = "text"
    tokenizer: str | None = "tokenizer.json"  # file in the version folder; None: tokens only
    max_length: int = 128
    pair: str | None = None  # the second text's input (sentence pairs); None: single texts


class ImageInput(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag="image",
                 tag_field="kind"):
    """An image per row, feeding the model input of the same name: encoded JPEG/PNG
    (``BYTES``) or a ``UINT8`` HWC tensor, decoded, resized, centre-cropped to ``height`` x
    ``width``, scaled and normalised as declared here; or an ``FP32`` tensor already in the
    model's layout, passed through."""

    height: int
    width: int
    name: str = "image"
    channels: Literal[1, 3] = 3
    resize: int = 0  # shorter side resized to this before the centre crop; 0: straight to size
    scale: float = 255.0  # the pixel value that becomes 1.0
    mean: list[float] = []  # per channel, subtracted after scaling (empty: 0)
    std: list[float] = []  # per channel, divided by after the mean (empty: 1)
    layout: Literal["NCHW", "NHWC"] = "NCHW"
    max_pixels: int = 4096 * 4096  # larger images are refused from their header, not decoded


class TensorInput(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag="tensor",
                  tag_field="kind"):
    """A tensor passed through to the model input of the same name (tabular features, any
    other classifier): datatype and shape checked against the model's, values against the
    range (FP32/FP64 must be finite)."""

    name: str
    minimum: float | None = None
    maximum: float | None = None


RequestInput = TextInput | ImageInput | TensorInput


class InputReference(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Per-row input statistics of the release's calibration rows (``serving.inputs.drift``):
    what a node's ``input_shift`` and ``input_outliers`` are measured against. ``statistics``
    names them in the order the input kind's codec computes them; a node whose codec names
    others (a newer statistic set) measures nothing rather than compare unlike numbers."""

    kind: Literal["text", "image", "tensor"]
    statistics: list[str]
    mean: list[float]
    std: list[float]  # floored (``serving.inputs.drift.STD_FLOOR``): never 0
    rows: int
    outliers: float  # share of the calibration rows with a statistic beyond 4 std of its mean
SCHEMA = 4
"""The newest manifest schema this code reads: 1, a text model with ``input_ids`` and
``attention_mask``; 2, ``request`` declares the inputs' kinds (text, image, tensor) and the
edge may be statically quantized; 3, a text input may take sentence pairs (``pair``); 4, the
center's logits are an element of what it returns (``logits``). A node refuses a release of a
newer schema by name. Publish writes the oldest schema a release needs, so that the nodes that
can serve it read it."""
KINDS_SCHEMA = 2  # what a release needs unless it takes sentence pairs or names its logits
PAIRS_SCHEMA = 3  # the first schema with a text input's ``pair``
LOGITS_SCHEMA = 4  # the first schema with ``logits``


class Manifest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: str
    version: int
    labels: list[str]
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    preprocessing: Preprocessing
    center: Artifact
    edge: Artifact
    tokenizer: Artifact | None
    calibration: Calibration
    fidelity: Fidelity
    publisher: str
    published_at: str
    source_sha256: str
    schema: int = 1
    probe: Artifact | None = None  # rows + reference logits every node checks itself on
    quantization: Quantization | None = None  # None: published before it was recorded
    # what clients send and how it becomes the model's inputs (empty: schema 1, text, from
    # ``preprocessing``)
    request: list[RequestInput] = []
    # the calibration rows' input statistics (None: published without calibration rows, or
    # before they were recorded: no input drift is measured)
    input_reference: InputReference | None = None
    cost: Cost | None = None  # each tier's cost per row at publish (None: not measured)
    # where the center's logits are in what its TorchScript module returns: the index of a
    # tuple's element or the key of a dict's (schema 4); None: the module returns the logits
    # tensor itself. The edge's ONNX always has the one output, the logits.
    logits: str | int | None = None

    def request_inputs(self) -> list[RequestInput]:
        """The request inputs, schema 1's derived from its preprocessing."""
        if self.request:
            return list(self.request)
        return [TextInput(tokenizer=self.preprocessing.tokenizer,
                          max_length=self.preprocessing.max_length)]

    def by_role(self) -> dict[str, Artifact]:
        """Every stored file of the release: center, edge and, where there are, tokenizer and
        probe."""
        roles = {"center": self.center, "edge": self.edge}
        return roles | {role: artifact for role, artifact in
                        (("tokenizer", self.tokenizer), ("probe", self.probe)) if artifact}

    def model(self, tier: Literal["edge", "center"]) -> Artifact:
        """The model file a tier serves."""
        return self.edge if tier == "edge" else self.center

    def artifacts(self, tier: Literal["edge", "center"]) -> list[Artifact]:
        """What a tier needs on disk: its model and, where there are, tokenizer and probe."""
        return [self.model(tier)] + [a for a in (self.tokenizer, self.probe) if a is not None]


class _Schema(msgspec.Struct):
    schema: int = 1


class NewerSchema(ValueError):
    """A release written for newer nodes than this one."""


def encode(manifest: Manifest) -> bytes:
    """The manifest's JSON; a schema-1 release leaves ``request`` out, so nodes that predate it
    keep reading the releases they can serve, and a release without an input reference leaves
    ``input_reference`` out (its bytes, and so its signature, stay what they were); so do a
    single-text input its ``pair``, a release without a measured cost (``cost``) or INT8
    candidates (``fidelity.candidates``), and one whose center returns its logits as a tensor
    its ``logits``."""
    data = msgspec.to_builtins(manifest)
    if not data["request"]:
        del data["request"]
    for request in data.get("request", []):  # single texts: as written before pairs existed
        if request.get("kind") == "text" and request.get("pair") is None:
            del request["pair"]
    for optional in ("input_reference", "logits", "cost"):
        if data[optional] is None:
            del data[optional]
    if data["fidelity"]["candidates"] is None:
        del data["fidelity"]["candidates"]
    return msgspec.json.format(msgspec.json.encode(data), indent=2) + b"\n"


def decode(data: bytes | str) -> Manifest:
    """The manifest; :class:`NewerSchema` (before anything else is read) for a schema this code
    does not know."""
    try:
        schema = msgspec.json.decode(data, type=_Schema).schema
    except (msgspec.DecodeError, msgspec.ValidationError):
        schema = 1  # the full decode below says what is wrong
    if schema > SCHEMA:
        raise NewerSchema(f"release manifest schema {schema}: this node reads up to schema "
                          f"{SCHEMA}; upgrade it to serve this release")
    return msgspec.json.decode(data, type=Manifest)
