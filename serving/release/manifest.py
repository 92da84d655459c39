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
    """How the edge model was quantized (onnxruntime ``quantize_dynamic``)."""

    method: Literal["dynamic"] = "dynamic"
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


class Preprocessing(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    tokenizer: str | None  # file name inside the version folder; None: raw tensors only
    max_length: int


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


def encode(manifest: Manifest) -> bytes:
    return msgspec.json.format(msgspec.json.encode(manifest), indent=2) + b"\n"


def decode(data: bytes | str) -> Manifest:
    return msgspec.json.decode(data, type=Manifest)
