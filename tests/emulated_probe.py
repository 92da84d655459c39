"""Run a store version's fidelity probe the way an edge does, and say which CPU ran it.

Meant to be started under ``qemu-x86_64 -cpu Haswell`` (AVX2, no AVX-512, no VNNI): onnxruntime
then picks the integer kernels such a CPU gets, whatever CPU the machine really has, so the
suite checks INT8 fidelity on a CPU class CI does not run on. Only numpy and onnxruntime are
imported (torch would take minutes under emulation). Prints one JSON object.

    python -m tests.emulated_probe STORE MODEL VERSION
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from numpy._core._multiarray_umath import __cpu_features__

from edge.runtime import OnnxRuntime
from serving.release import probe
from serving.release.store import InstalledReleases


def main(store: Path, model: str, version: int) -> None:
    manifest = InstalledReleases(store).verify(model, version, "edge")
    folder = store / model / str(version)
    assert manifest.probe is not None, "the release has no probe"
    runtime = OnnxRuntime(folder / manifest.edge.file, threads=1)
    measured = probe.measure(runtime.predict, probe.load(folder / manifest.probe.file,
                                                                     manifest.inputs), "edge")
    features = {name: bool(__cpu_features__.get(name)) for name in
                ("AVX2", "AVX512F", "AVX512VNNI", "AVX512_VNNI")}
    print(json.dumps({"agreement": measured.agreement, "rows": measured.rows,
                      "cpu_features": features}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]))
