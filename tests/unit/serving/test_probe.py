"""The fidelity probe file and the CPU features a node reports with it."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from registry.server.intake import platform
from serving.model.text import pad
from serving.release import hardware, probe
from serving.release.manifest import TensorSpec
from sync.gen import sync_pb2 as pb

X86 = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz
flags\t\t: fpu sse4_2 avx avx2 fma avx512f avx512bw avx512vl avx512_vnni amx_tile amx_int8
"""
AVX2_ONLY = """model name\t: AMD EPYC 7B12
flags\t\t: fpu sse4_2 avx avx2 fma f16c
"""
ARM = """processor\t: 0
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics asimddp i8mm sve
CPU part\t: 0xd40
"""


def test_cpu_features_name_what_int8_kernels_depend_on() -> None:
    assert hardware.parse_cpuinfo(X86) == (
        "Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz",
        ["sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
         "amx_tile", "amx_int8"])
    assert hardware.parse_cpuinfo(AVX2_ONLY)[1] == ["sse4_2", "avx", "avx2", "fma", "f16c"]
    name, features = hardware.parse_cpuinfo(ARM)
    assert features == ["neon", "asimd", "asimddp", "i8mm", "sve"] and name == ""
    here = hardware.here("onnxruntime test")
    assert here.machine and here.runtime == "onnxruntime test"


def test_the_registry_keeps_only_well_formed_platform_fields() -> None:
    hostile = pb.Platform(cpu="Xeon\x1b[31m" + "x" * 500, machine="x86_64; rm -rf /",
                          features=["avx2", "AVX512", "a b", "x" * 40, *["f"] * 100],
                          runtime="onnxruntime\n1.32")
    kept = platform(hostile)
    assert kept["cpu"].startswith("Xeon[31m") and len(kept["cpu"]) <= 128
    assert kept["machine"] == "" and kept["runtime"] == "onnxruntime1.32"
    assert kept["features"][0] == "avx2" and len(kept["features"]) <= 64
    assert all(f in ("avx2", "f") for f in kept["features"])


TOKENS = [TensorSpec("input_ids", "INT64", [-1, -1]),
          TensorSpec("attention_mask", "INT64", [-1, -1])]


def _inputs(rows: int = 70) -> probe.Feeds:
    rng = np.random.default_rng(0)
    batch = pad([rng.integers(1, 100, size=int(n)) for n in rng.integers(2, 20, size=rows)])
    return {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask}


def _saved(tmp_path: Path) -> tuple[Path, probe.Feeds, np.ndarray]:
    inputs = _inputs(64)
    edge = np.random.default_rng(1).normal(size=(64, 2)).astype(np.float32)
    probe.save(tmp_path / probe.FILE, inputs, edge, -edge)
    return tmp_path / probe.FILE, inputs, edge


def test_a_probe_round_trips_and_measures_agreement_in_its_batches(tmp_path: Path) -> None:
    path, inputs, edge = _saved(tmp_path)
    loaded = probe.load(path, TOKENS)
    assert loaded.rows == 64 and loaded.batch == probe.BATCH
    np.testing.assert_array_equal(loaded.feeds["input_ids"], inputs["input_ids"])
    seen: list[int] = []
    table = {tuple(row): i for i, row in enumerate(inputs["input_ids"].tolist())}

    def faithful(batch: probe.Feeds) -> np.ndarray:  # answers with the reference, row by row
        seen.append(len(batch["input_ids"]))
        return edge[[table[tuple(r)] for r in batch["input_ids"].tolist()]]

    assert probe.measure(faithful, loaded, "edge") == probe.Measured(1.0, 64)
    assert seen == [32, 32]
    # the center reference is the negated edge: every label differs
    assert probe.measure(faithful, loaded, "center").agreement == 0.0
    half = probe.measure(lambda b: np.where(np.arange(len(b["input_ids"]))[:, None] % 2 == 0,
                                            faithful(b), -faithful(b)), loaded, "edge")
    assert half.agreement == 0.5


def _npz(**arrays: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # type: ignore[arg-type]
    return buffer.getvalue()


BAD: dict[str, Callable[[dict[str, np.ndarray]], bytes]] = {
    "not a zip": lambda good: b"garbage",
    "missing key": lambda good: _npz(**{k: v for k, v in good.items() if k != "center"}),
    "extra key": lambda good: _npz(**good, extra=np.zeros(1)),
    "wrong dtype": lambda good: _npz(**{**good, "input_ids": good["input_ids"] * 1.0}),
    "pickled": lambda good: _npz(**{**good, "batch": np.array([object()], dtype=object)}),
    "wrong rows": lambda good: _npz(**{**good, "edge": good["edge"][:5]}),
    "nan": lambda good: _npz(**{**good, "edge": np.full_like(good["edge"], np.nan)}),
    "mask": lambda good: _npz(**{**good, "attention_mask": good["attention_mask"] * 3}),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_probe_file_is_refused_with_its_reason(tmp_path: Path, case: str) -> None:
    path, _, _ = _saved(tmp_path)
    path.write_bytes(BAD[case](dict(np.load(path))))
    with pytest.raises(probe.ProbeError):
        probe.load(path, TOKENS)


def test_a_probe_that_unpacks_too_large_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / probe.FILE
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("input_ids.npy", b"\0" * (probe.MAX_BYTES + 1))
    with pytest.raises(probe.ProbeError, match="larger than"):
        probe.load(path, TOKENS)
