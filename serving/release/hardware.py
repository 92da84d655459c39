"""What this machine's CPU can do, as far as INT8 and half-precision kernels care.

onnxruntime picks its integer kernels by CPU feature: on x86 without VNNI the u8s8 kernels add
pairs of products in 16 bits and can saturate, so the same INT8 model agrees less with its fp32
source than on a VNNI or AMX machine; ARM uses its own dot-product kernels. A node reports these
features with its measured fidelity, and the publisher records its own next to the publish-time
figure, so a refusal can be read against the hardware that produced it.

Read from ``/proc/cpuinfo`` by hand (a dozen lines): ``py-cpuinfo`` would give the same flags
but starts a subprocess and takes about a second, at every node start.
"""

from __future__ import annotations

import platform
from functools import cache
from pathlib import Path

import msgspec

INTERESTING = (
    # x86: vector widths, the int8 dot products (VNNI), bf16/fp16 and AMX tiles
    "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
    "avx_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_int8", "amx_bf16",
    # ARM: NEON (asimd), its int8 dot product and matrix multiply, SVE
    "neon", "asimd", "asimddp", "i8mm", "bf16", "sve", "sve2",
)


class Platform(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Where a figure was measured: CPU model, architecture, the features above, runtime."""

    cpu: str = ""
    machine: str = ""
    features: list[str] = []
    runtime: str = ""

    def describe(self) -> str:
        features = " ".join(self.features) or "no features known"
        return f"{self.cpu or self.machine or 'unknown CPU'} ({features})"


def parse_cpuinfo(text: str) -> tuple[str, list[str]]:
    """The CPU model name and the interesting features named in ``/proc/cpuinfo`` text."""
    name, flags = "", set[str]()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("model name", "hardware", "cpu model") and not name:
            name = value.strip()
        elif key in ("flags", "features"):
            flags.update(value.split())
    if "asimd" in flags:
        flags.add("neon")  # AArch64 names NEON "asimd"
    return name[:128], [f for f in INTERESTING if f in flags]


@cache
def cpu() -> tuple[str, list[str]]:
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:  # not Linux: the model name from platform, features unknown
        return platform.processor()[:128], []
    name, features = parse_cpuinfo(text)
    return name or platform.processor()[:128], features


def here(runtime: str) -> Platform:
    """This machine, with ``runtime`` (e.g. ``onnxruntime 1.32.0 CPU``)."""
    name, features = cpu()
    return Platform(cpu=name, machine=platform.machine(), features=list(features),
                    runtime=runtime)
