"""INT8 fidelity on a CPU without AVX-512 or VNNI, whatever CPU runs the suite.

onnxruntime's u8s8 kernels on x86 without VNNI add pairs of products in 16 bits and saturate
with full 8-bit weights, so an INT8 model that agrees with fp32 on a VNNI machine can fall
below the floor on an AVX2-only one. ``qemu-x86_64 -cpu Haswell`` makes onnxruntime pick the
AVX2 kernels here (numpy, which reads CPUID the same way, confirms the features), and the tiny
release's probe must still reach the floor there: the quantization is chosen for the fleet.
"""

from __future__ import annotations

import json
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from registry.settings import RegistrySettings
from tests.conftest import TEST_FLOOR, RegistryCli

pytestmark = [pytest.mark.integration, pytest.mark.slow]
QEMU = shutil.which("qemu-x86_64")
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(platform.machine() != "x86_64", reason="emulates an x86-64 CPU")
def test_the_tiny_release_keeps_its_fidelity_on_an_avx2_cpu_without_vnni(
        registry_cli: RegistryCli, tiny_release: Path, tmp_path: Path) -> None:
    assert QEMU, "qemu-x86_64 is missing: scripts/install_tools.sh installs Debian's qemu-user"
    published = registry_cli("publish", tiny_release, "--name", "tiny", "--json").json()
    registry_cli("pull", "tiny", "--tier", "edge", "--store", tmp_path / "edge")
    result = subprocess.run([QEMU, "-cpu", "Haswell", sys.executable, "-m",
                             "tests.emulated_probe", str(tmp_path / "edge"), "tiny", "1"],
                            capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    emulated = json.loads(result.stdout.splitlines()[-1])
    features = emulated["cpu_features"]
    assert features["AVX2"] and not features["AVX512F"]
    assert not (features["AVX512VNNI"] or features["AVX512_VNNI"])
    # the node's check passes there, even at the product's default floor (97%): with 8-bit
    # per-channel weights this release measured 96.0% there (saturation), 99.5% with 7-bit
    assert emulated["rows"] == 200 and published["manifest"]["fidelity"]["minimum"] == TEST_FLOOR
    assert emulated["agreement"] >= RegistrySettings.model_fields["min_fidelity"].default
