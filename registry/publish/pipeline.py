"""``registry publish``: validate, export, quantize, check fidelity, calibrate, store, sign, record.

Nothing is written to the catalog until every check has passed; the version, its aliases, its
rollout, its signature and its audit record are then committed in one transaction.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime as ort

from registry.errors import FidelityTooLow, InvalidRelease
from registry.publish import cost
from registry.publish.calibrate import agreement, calibrate, default_calibration
from registry.publish.export import (
    QUANTIZATION,
    STATIC,
    convolutional,
    export_onnx,
    one_output,
    precision,
    quantize_int8,
)
from registry.publish.signature import TOKENIZER_FILE, Signature, calibration_rows, resolve
from registry.publish.source import ReleaseSource
from registry.publish.validate import (
    Inputs,
    batched,
    forward_names,
    load_torchscript,
    onnx_session,
    output_of,
    run_onnx,
    run_torchscript,
)
from registry.releases.catalog import Catalog
from registry.releases.names import check_name
from registry.releases.waves import WavePolicy
from registry.settings import RegistrySettings
from registry.store.blobs import BlobStore
from registry.store.chunkstore import ChunkStore
from registry.store.clock import now
from registry.trust import keys, tuf
from serving.inputs import drift
from serving.model.outputs import Selector
from serving.release import compact, hardware, probe
from serving.release.manifest import (
    KINDS_SCHEMA,
    LOGITS_SCHEMA,
    PAIRS_SCHEMA,
    Artifact,
    Calibration,
    Cost,
    Fidelity,
    InputReference,
    Manifest,
    Preprocessing,
    Quantization,
    TensorSpec,
    TextInput,
)

Step = Callable[[str], AbstractContextManager[None]]

CENTER_FILE, EDGE_FILE = "model.pt", "model.onnx"
PROBE_FILE = probe.FILE


@contextmanager
def quiet_step(_: str) -> Iterator[None]:
    yield


@dataclass(frozen=True)
class PublishOptions:
    name: str
    min_fidelity: float
    tolerance: float
    confidence: float
    force: bool = False
    canary: list[str] = field(default_factory=list)
    skip_existing: bool = False
    rollout: WavePolicy | None = None  # in waves (registry.releases.waves) instead of to every node


@dataclass(frozen=True)
class PublishResult:
    manifest: Manifest
    created: bool  # False when skip_existing found this source already published
    edge_fp32_size: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    cascade: bool = True  # False: the edge is the center quantized (one file, no --edge)


@dataclass
class _Built:
    signature: Signature
    quantization: Quantization
    candidates: dict[str, float]  # each INT8 method tried: its agreement with the fp32 edge
    cost: Cost
    inputs: Inputs
    center_logits: np.ndarray
    edge_fp32_logits: np.ndarray
    edge_int8_logits: np.ndarray
    edge_fp32_size: int
    edge_int8: Path
    probe: Path  # probe.npz: rows and the fp32 references every node checks itself on
    probe_agreement: float  # INT8 vs fp32 edge on the probe, on this CPU
    probe_rows: int
    reference: InputReference | None  # the calibration rows' input statistics (none: none)
    center_output: Selector | None  # where the center's logits are in what it returns


def publish(settings: RegistrySettings, catalog: Catalog, source: ReleaseSource,
            options: PublishOptions, step: Step = quiet_step) -> PublishResult:
    check_name(options.name)
    signer = keys.signer(settings)  # before the work: a missing or bad key fails at once
    tuf.ensure(catalog.db, signer, keys.online_signer(settings).key.public_key())
    tuf.check_publisher(catalog.db, signer)  # a key root does not trust: before the work
    if options.skip_existing:
        existing = _same_source(catalog, options.name, source.digest)
        if existing is not None:
            return PublishResult(existing, created=False)
    timings: dict[str, float] = {}

    @contextmanager
    def timed(name: str) -> Iterator[None]:
        start = time.perf_counter()
        with step(name):
            yield
        timings[name] = time.perf_counter() - start

    with tempfile.TemporaryDirectory(prefix="tiered-publish-") as work:
        built = _build(source, Path(work), timed)
        labels = source.labels or [str(i) for i in range(built.center_logits.shape[1])]
        if len(labels) != built.center_logits.shape[1]:
            raise InvalidRelease(f"{len(labels)} labels but the models output "
                                 f"{built.center_logits.shape[1]} classes")
        fidelity = _fidelity(built, options)
        with timed("calibrate threshold"):
            calibration = (calibrate(built.center_logits, built.edge_int8_logits,
                                     source.calibration.labels, options.tolerance,
                                     options.confidence)
                           if source.calibration else default_calibration())
        with timed("store and record"):
            artifacts = _store(BlobStore(settings.blobs), source, built, settings.chunking)
            manifest = _manifest(options.name, source, labels, artifacts, calibration, fidelity,
                                 catalog.actor, built)
            version = catalog.create_version(manifest, canary=options.canary or None,
                                             signer=signer, rollout=options.rollout)
    return PublishResult(catalog.resolve(options.name, str(version)).manifest, True,
                         built.edge_fp32_size, timings, source.cascade)


def _same_source(catalog: Catalog, name: str, digest: str) -> Manifest | None:
    latest = catalog.latest_source(name)
    if latest is None or latest[1] != digest:
        return None
    return catalog.resolve(name, str(latest[0])).manifest


def _build(source: ReleaseSource, work: Path, timed: Step) -> _Built:
    with timed("validate"):
        center_module = load_torchscript(source.center, "center")
        signature = resolve(source, forward_names(center_module), "center")
        names = [i.name for i in signature.inputs]
        rows = (calibration_rows(signature, source.calibration.items) if source.calibration
                else None)
        inputs = batched(signature.codec, rows)
        center_output = output_of(center_module, inputs, source.output, "center",
                                  source.output_option)
        center_logits = run_torchscript(center_module, inputs, "center", center_output)
        edge_output: Selector | None
        if source.edge_format == "onnx":
            edge_fp32, edge_output = one_output(source.edge, work, source.output,
                                                source.output_option)
            edge_fp32_logits = run_onnx(onnx_session(edge_fp32, "edge", names), inputs, "edge")
        else:
            edge_module = load_torchscript(source.edge, "edge", names)
            edge_output = output_of(edge_module, inputs, source.output, "edge",
                                    source.output_option)
            edge_fp32_logits = run_torchscript(edge_module, inputs, "edge", edge_output)
        _check_output_used(source, center_output, edge_output)
        if edge_fp32_logits.shape[1] != center_logits.shape[1]:
            raise InvalidRelease(f"the edge model outputs {edge_fp32_logits.shape[1]} classes, "
                                 f"the center model {center_logits.shape[1]}")
    if source.edge_format == "torchscript":
        with timed("export edge to ONNX"):
            edge_fp32 = work / "edge-fp32.onnx"
            example = signature.codec.collate(signature.codec.sample(2, seed=1))
            export_onnx(edge_module, edge_fp32, signature.inputs, example, edge_output)
    with timed("quantize edge to INT8"):
        quantization, edge_int8, int8_session, edge_int8_logits, candidates = _quantize(
            edge_fp32, work, inputs, edge_fp32_logits, names)
    with timed("measure cost per row"):
        costs = cost.measure(center_module, int8_session, inputs, output=center_output)
    with timed("build probe"):
        probe_rows = (rows or signature.codec.sample(probe.ROWS))[:probe.ROWS]
        stored, feeds = compact.fit(signature.codec.collate(probe_rows),
                                    edge_int8.stat().st_size, center_logits.shape[1],
                                    probe.MIN_ROWS)
        fp32_session = onnx_session(edge_fp32, "edge", names)
        edge_ref = probe.run(lambda b: run_onnx(fp32_session, _one(b), "edge"), feeds)
        center_ref = probe.run(
            lambda b: run_torchscript(center_module, _one(b), "center", center_output), feeds)
        int8_probe = probe.run(lambda b: run_onnx(int8_session, _one(b), "edge INT8"), feeds)
        probe.save(work / PROBE_FILE, stored, edge_ref, center_ref)
    return _Built(signature, quantization, candidates, costs, inputs, center_logits,
                  edge_fp32_logits, edge_int8_logits, edge_fp32.stat().st_size, edge_int8,
                  work / PROBE_FILE, agreement(int8_probe, edge_ref), len(edge_ref),
                  drift.reference(signature.codec, rows) if rows else None, center_output)


def _check_output_used(source: ReleaseSource, center: Selector | None,
                       edge: Selector | None) -> None:
    """An ``output`` the user gave must pick an element of some model's output: when every
    model returns a single tensor, it is a mistake (a wrong file, or a wrong flag)."""
    if source.output is not None and center is None and edge is None:
        raise InvalidRelease(f"the center model returns a tensor; {source.output_option} "
                             f"{source.output} picks nothing (leave it out)")


def _quantize(edge_fp32: Path, work: Path, inputs: Inputs, reference: np.ndarray,
              names: list[str]) -> tuple[Quantization, Path, ort.InferenceSession, np.ndarray,
                                          dict[str, float]]:
    """Dynamic INT8 and, for a convolutional model, static INT8 calibrated on ``inputs``: the
    one that agrees best with the fp32 edge (dynamic on a tie: it needs no calibration), and
    each one's agreement."""
    methods = [QUANTIZATION] + ([STATIC] if convolutional(edge_fp32) else [])
    scores: dict[str, float] = {}
    best: tuple[float, Quantization, Path, ort.InferenceSession, np.ndarray] | None = None
    for q in methods:
        path = work / f"edge-int8-{q.method}.onnx"
        quantize_int8(edge_fp32, path, q, inputs.batches)
        session = onnx_session(path, "edge INT8", names)
        logits = run_onnx(session, inputs, "edge INT8")
        score = scores[q.method] = agreement(logits, reference)
        if best is None or score > best[0]:
            best = (score, q, path, session, logits)
    assert best is not None
    _, q, path, session, logits = best
    final = work / EDGE_FILE
    path.replace(final)
    return q, final, session, logits, scores


def _one(batch: probe.Feeds) -> Inputs:
    return Inputs([batch], "calibration")


def _fidelity(built: _Built, options: PublishOptions) -> Fidelity:
    """Both the whole split and the probe must reach the floor: a release whose probe falls
    below it would be refused by every node, the publisher's own CPU included."""
    value = agreement(built.edge_int8_logits, built.edge_fp32_logits)
    floor = options.min_fidelity
    below = value < floor or built.probe_agreement < floor
    if below and not options.force:
        where = (f"{value:.1%} of {built.inputs.rows} {built.inputs.kind} inputs"
                 if value < floor else f"{built.probe_agreement:.1%} of the "
                 f"{built.probe_rows} probe rows every node re-checks")
        raise FidelityTooLow(f"INT8 edge agrees with the fp32 edge on {where}, below the "
                             f"{floor:.1%} floor (--min-fidelity, or --force)")
    return Fidelity(top1_agreement=value, rows=built.inputs.rows, minimum=floor,
                    inputs=built.inputs.kind, forced=below,
                    platform=hardware.here(f"onnxruntime {ort.__version__} CPU"),
                    probe_agreement=built.probe_agreement, candidates=built.candidates)


def _store(blobs: BlobStore, source: ReleaseSource, built: _Built,
           chunked: bool) -> dict[str, Artifact]:
    """Put every file in the blob store and, when ``chunked``, cut it into stored chunks."""
    files = {"center": (source.center, CENTER_FILE, "torchscript", "fp32"),
             "edge": (built.edge_int8, EDGE_FILE, "onnx", precision(built.quantization)),
             "probe": (built.probe, PROBE_FILE, "probe", "")}
    if source.tokenizer is not None:
        files["tokenizer"] = (source.tokenizer, TOKENIZER_FILE, "tokenizer", "")
    store = ChunkStore(blobs)
    artifacts = {}
    for role, (path, name, kind, how) in files.items():
        sha, size = blobs.put(path)
        artifacts[role] = Artifact(name, sha, size, kind, how,  # type: ignore[arg-type]
                                   chunks=store.build(sha) if chunked else None)
    return artifacts


def _manifest(name: str, source: ReleaseSource, labels: list[str],
              artifacts: dict[str, Artifact], calibration: Calibration, fidelity: Fidelity,
              publisher: str, built: _Built) -> Manifest:
    """A schema-1 manifest for a text model with ids and mask, dynamic INT8 and a center that
    returns its logits (every node serves it, those that predate input kinds too); else the
    oldest schema the release needs, so that every node that can serve it reads it (and the
    others refuse it by name): 4 for a center whose logits are an element of what it returns,
    3 for sentence pairs, 2 for anything else."""
    signature, quantization = built.signature, built.quantization
    text = signature.request if isinstance(signature.request, TextInput) else None
    logits = built.center_output
    legacy = signature.legacy and quantization.method == "dynamic" and logits is None
    return Manifest(
        name=name, version=0, labels=labels, inputs=signature.inputs,
        outputs=[TensorSpec("logits", "FP32", [-1, len(labels)])],
        preprocessing=Preprocessing(
            tokenizer=TOKENIZER_FILE if "tokenizer" in artifacts else None,
            max_length=text.max_length if text else 0),
        center=artifacts["center"], edge=artifacts["edge"], tokenizer=artifacts.get("tokenizer"),
        calibration=calibration, fidelity=fidelity, publisher=publisher, published_at=now(),
        source_sha256=source.digest, probe=artifacts["probe"], quantization=quantization,
        schema=1 if legacy else max(KINDS_SCHEMA, PAIRS_SCHEMA if text and text.pair else 0,
                                    LOGITS_SCHEMA if logits is not None else 0),
        request=[] if legacy else [signature.request], input_reference=built.reference,
        cost=built.cost, logits=logits)
