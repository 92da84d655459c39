"""The image model in the benchmarks: the digits release (``examples.digits``: MNIST digits, a
4k-parameter edge CNN, INT8, and a 422k-parameter fp32 center CNN), built when missing and
published into a temporary registry; its 1,000 test PNGs; V2 request bodies of one image each in
the forms clients send; the raw runtimes in-process; and the edge's escalation counters.

Used by ``bench.tiers --model digits``, ``bench.peers --model digits`` and ``bench.cascade --model
digits``. Request forms (``FORMS``): ``png`` the test PNG as one BYTES element (what a camera
client sends), ``uint8`` the decoded pixels ``[1, 28, 28, 1]`` and ``fp32`` the normalised
``[1, 1, 28, 28]`` tensor, each in the V2 binary tensor extension (``bench/v2_infer.lua`` sends a
``*.bin`` bodies file with its ``Inference-Header-Content-Length``); ``fp32-json`` the same tensor
as JSON numbers (what every peer server takes).
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.harness import BIN, Cpu, console
from bench.kit import ROOT
from serving.release.manifest import ImageInput, Manifest
from serving.release.manifest import decode as decode_manifest

DIGITS = "digits"
RELEASE = ROOT / "var" / "demo" / "digits"  # examples.digits.build's default folder
FORMS = ("png", "uint8", "fp32")  # binary bodies
FORM_NAMES = {"png": "PNG", "uint8": "UINT8 pixels", "fp32": "FP32 binary",
              "fp32-json": "FP32 JSON"}
RAW_BATCHES = (1, 8, 32)


# --- the release -----------------------------------------------------------------------------

@dataclass(frozen=True)
class ImageRelease:
    """One tier's pulled version folder of the digits release."""

    store: Path
    folder: Path
    model_file: Path
    manifest: Manifest

    @property
    def spec(self) -> ImageInput:
        spec = self.manifest.request_inputs()[0]
        if not isinstance(spec, ImageInput):
            raise SystemExit(f"{self.folder}: the release's request input is not an image")
        return spec

    @property
    def version(self) -> int:
        return self.manifest.version


def registry(home: Path, *args: str) -> str:
    result = subprocess.run([str(BIN / "registry"), "--home", str(home), *args],
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"registry {' '.join(args)} failed ({result.returncode}): "
                         f"{(result.stderr or result.stdout).strip()[-2000:]}")
    return result.stdout


def build(folder: Path = RELEASE) -> Path:
    """``python -m examples.digits.build --out folder``: reused when up to date (~20 s when
    not)."""
    started = time.perf_counter()
    result = subprocess.run([str(BIN / "python"), "-m", "examples.digits.build", "--out",
                             str(folder)], capture_output=True, text=True, cwd=ROOT)
    if result.returncode != 0:
        raise SystemExit(f"building the digits release failed:\n{result.stdout[-2000:]}"
                         f"{result.stderr[-2000:]}")
    console.log(f"digits release folder {folder.relative_to(ROOT)} ready in "
                f"{time.perf_counter() - started:.1f} s")
    return folder


def published(work: Path, folder: Path = RELEASE) -> Path:
    """A registry home under ``work`` holding the digits release (built when missing) as
    version 1; ``registry publish`` exports and quantizes the edge as it would for any user."""
    build(folder)
    home = work / "registry"
    started = time.perf_counter()
    registry(home, "publish", str(folder), "--name", DIGITS, "--create")
    console.log(f"published {DIGITS} into a temporary registry in "
                f"{time.perf_counter() - started:.1f} s")
    return home


def pull(home: Path, tier: str, store: Path) -> ImageRelease:
    registry(home, "pull", DIGITS, "--tier", tier, "--store", str(store))
    folder = store / DIGITS / (store / DIGITS / "CURRENT").read_text().strip()
    manifest = decode_manifest((folder / "release.json").read_bytes())
    return ImageRelease(store, folder, folder / manifest.model(
        "edge" if tier == "edge" else "center").file, manifest)


# --- the test images -------------------------------------------------------------------------

@dataclass(frozen=True)
class TestImages:
    """The release's test split: row for row the PNG, its label, its decoded pixels and the
    model's input row (decoded and normalised as the release declares)."""

    pngs: list[bytes]
    labels: np.ndarray  # int64 [N]
    pixels: np.ndarray  # uint8 [N, H, W, C]
    rows: np.ndarray  # float32 [N, C, H, W]

    def __len__(self) -> int:
        return len(self.pngs)

    @property
    def png_bytes(self) -> float:
        """Mean PNG size in bytes."""
        return sum(len(p) for p in self.pngs) / len(self.pngs)


def test_images(spec: ImageInput, folder: Path = RELEASE) -> TestImages:
    from examples.digits import data
    from serving.inputs import pixels

    found = data.read_rows(folder, "test")
    pngs = [png for png, _ in found]
    labels = np.asarray([data.LABELS.index(label) for _, label in found], dtype=np.int64)
    decoded = np.stack([pixels.decode(png, spec, i) for i, png in enumerate(pngs)])
    rows = np.stack([pixels.preprocess(p, spec) for p in decoded]).astype(np.float32)
    return TestImages(pngs, labels, decoded, rows)


def decode_us(images: TestImages, spec: ImageInput, seconds: float) -> float:
    """Microseconds per image to decode a PNG and normalise it as the servers do
    (``serving.inputs.pixels``), in-process, one at a time through the test split."""
    from serving.inputs import pixels

    done, started = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - started) < seconds:
        png = images.pngs[done % len(images)]
        pixels.preprocess(pixels.decode(png, spec), spec)
        done += 1
    return 1e6 * elapsed / done


# --- request bodies --------------------------------------------------------------------------

def binary_body(images: TestImages, form: str, index: int, rows: int = 1,
                threshold: float | None = None) -> tuple[bytes, bytes]:
    """(JSON header, binary data) of one V2 request holding ``rows`` images from ``index``
    (rotating) in ``form``."""
    from serving.protocol import v2

    picked = [(index + i) % len(images) for i in range(rows)]
    if form == "png":
        data, shape, datatype = v2.raw("BYTES", [images.pngs[i] for i in picked]), [rows], \
            "BYTES"
    elif form == "uint8":
        block = images.pixels[picked]
        data, shape, datatype = block.tobytes(), list(block.shape), "UINT8"
    elif form == "fp32":
        block = images.rows[picked]
        data, shape, datatype = v2.raw("FP32", block), list(block.shape), "FP32"
    else:
        raise ValueError(f"unknown binary form {form!r}")
    body: dict[str, Any] = {"inputs": [{"name": "image", "shape": shape, "datatype": datatype,
                                        "parameters": {"binary_data_size": len(data)}}]}
    if threshold is not None:
        body["parameters"] = {"threshold": threshold}
    return json.dumps(body).encode(), data


def json_body(images: TestImages, index: int, rows: int = 1,
              threshold: float | None = None) -> str:
    """One V2 JSON request holding ``rows`` FP32 images (the model's input) from ``index``."""
    picked = [(index + i) % len(images) for i in range(rows)]
    block = images.rows[picked]
    body: dict[str, Any] = {"inputs": [{"name": "image", "shape": list(block.shape),
                                        "datatype": "FP32",
                                        # float32's shortest round-trip digits
                                        "data": [float(str(x)) for x in block.ravel()]}]}
    if threshold is not None:
        body["parameters"] = {"threshold": threshold}
    return json.dumps(body)


def write_bodies(images: TestImages, path: Path, form: str, threshold: float | None = None,
                 rows: int = 1, count: int | None = None) -> Path:
    """One request body per test image (the first ``count``; each holding its image and the
    ``rows - 1`` after it), for ``bench/v2_infer.lua``: JSON lines for ``fp32-json``, else a
    ``*.bin`` file of binary bodies (``path`` gets that suffix)."""
    bodies = range(min(count or len(images), len(images)))
    if form == "fp32-json":
        path.write_text("\n".join(json_body(images, i, rows, threshold) for i in bodies) + "\n")
        return path
    path = path.with_suffix(".bin")
    with path.open("wb") as out:
        for i in bodies:
            header, data = binary_body(images, form, i, rows, threshold)
            out.write(f"{len(header)} {len(header) + len(data)}\n".encode())
            out.write(header + data + b"\n")
    return path


def post(client: httpx.Client, url: str, header: bytes, data: bytes) -> httpx.Response:
    """One binary V2 request to the digits model at ``url``."""
    return client.post(f"{url}/v2/models/{DIGITS}/infer", content=header + data,
                       headers={"Content-Type": "application/octet-stream",
                                "Inference-Header-Content-Length": str(len(header))})


def check_answer(url: str, images: TestImages, form: str) -> None:
    """One real request: 200, the test image's label (the first one is easy for both models),
    and nothing escalated (threshold 0)."""
    header, data = binary_body(images, form, 0, threshold=0)
    with httpx.Client(timeout=30) as client:
        response = post(client, url, header, data)
    if response.status_code != 200:
        raise RuntimeError(f"{url}: {response.status_code} {response.text[:500]}")
    body = response.json()
    if body.get("parameters", {}).get("escalated", 0):
        raise RuntimeError(f"{url}: the edge escalated with threshold 0: {response.text[:500]}")
    labels = next((o["data"] for o in body["outputs"] if o["name"] == "label"), None)
    if labels != [str(images.labels[0])]:
        raise RuntimeError(f"{url}: answered {labels} for a {images.labels[0]}: "
                           f"{response.text[:500]}")


# --- raw runtimes, in-process ----------------------------------------------------------------

@dataclass(frozen=True)
class RawImages:
    """A raw runtime over the test images' model rows at one batch size, in-process."""

    tier: str
    batch: int
    rows_per_s: float
    ms_per_batch: float
    other_cores: float


def load_predict(tier: str, release: ImageRelease) -> Callable[[np.ndarray], object]:
    """The tier's model as a plain runtime runs it: onnxruntime with all graph optimizations
    and every other option its default, the center's TorchScript runtime (threads=0: the
    runtime default), as ``bench.tiers.load_predict`` for text."""
    name = release.spec.name
    if tier == "edge":
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        session = ort.InferenceSession(str(release.model_file), options,
                                       providers=["CPUExecutionProvider"])
        return lambda batch: session.run(None, {name: batch})
    import torch

    from center.runtime import TorchScriptRuntime

    runtime = TorchScriptRuntime(release.model_file, torch.device("cpu"), "fp32", 0, [name])
    return lambda batch: runtime.predict({name: batch})


def raw_runs(tier: str, release: ImageRelease, images: TestImages, seconds: float,
             sizes: Sequence[int] = RAW_BATCHES) -> list[RawImages]:
    """Each batch size through the test images' model rows (rotating, every image equally)."""
    from bench.tier_runs import rotating_batches, time_batches

    predict = load_predict(tier, release)
    runs = []
    for size in sizes:
        batches = [np.stack(b) for b in rotating_batches(list(images.rows), size)]
        start, wall = Cpu.now(), time.perf_counter()
        done, elapsed = time_batches(predict, batches, seconds)
        other = Cpu.now().cores_since(start, time.perf_counter() - wall).other_cores
        runs.append(RawImages(tier, size, done * size / elapsed, 1000 * elapsed / done, other))
    return runs


def best(raws: Sequence[RawImages], tier: str) -> RawImages:
    return max((r for r in raws if r.tier == tier), key=lambda r: r.rows_per_s)


def single(raws: Sequence[RawImages], tier: str) -> RawImages:
    return next(r for r in raws if r.tier == tier and r.batch == 1)


# --- the edge's counters ---------------------------------------------------------------------

SAMPLE = re.compile(r"^(\w+)(?:\{([^}]*)\})?\s+(\S+)$")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def metric(url: str, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples at ``url``/metrics whose labels include ``labels``."""
    total = 0.0
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        match = SAMPLE.match(line)
        if match is None or match[1] != name:
            continue
        found = dict(LABEL.findall(match[2] or ""))
        if all(found.get(k) == v for k, v in labels.items()):
            total += float(match[3])
    return total


@dataclass(frozen=True)
class Escalated:
    """What the edge sent its center for rows it escalated, per input form."""

    form: str
    requests: int
    rows: float  # rows the edge answered from the center (edge_rows_total, tier center)
    bytes: float  # edge_escalated_input_bytes_total
    data_bytes: float  # the clients' binary tensor data for those requests
    request_bytes: float  # the clients' whole bodies (JSON header + binary data)
    failed: int

    @property
    def bytes_per_row(self) -> float:
        return self.bytes / self.rows if self.rows else math.nan

    @property
    def data_bytes_per_row(self) -> float:
        return self.data_bytes / self.rows if self.rows else math.nan

    @property
    def request_bytes_per_row(self) -> float:
        return self.request_bytes / self.rows if self.rows else math.nan


def escalate(edge_url: str, images: TestImages, form: str, requests: int) -> Escalated:
    """``requests`` one-image requests in ``form`` with ``threshold`` 1 (every row goes to the
    center), through the test images one at a time; the edge's counters read before and
    after."""
    rows_before = metric(edge_url, "edge_rows_total", model=DIGITS, tier="center")
    bytes_before = metric(edge_url, "edge_escalated_input_bytes_total", model=DIGITS)
    failed, sent, sent_data = 0, 0, 0
    with httpx.Client(timeout=30) as client:
        for i in range(requests):
            header, data = binary_body(images, form, i, threshold=1.0)
            sent, sent_data = sent + len(header) + len(data), sent_data + len(data)
            response = post(client, edge_url, header, data)
            if response.status_code != 200 or \
                    response.json().get("parameters", {}).get("escalated") != 1:
                failed += 1
    rows = metric(edge_url, "edge_rows_total", model=DIGITS, tier="center") - rows_before
    sent_bytes = metric(edge_url, "edge_escalated_input_bytes_total", model=DIGITS) \
        - bytes_before
    return Escalated(form, requests, rows, sent_bytes, sent_data, sent, failed)
