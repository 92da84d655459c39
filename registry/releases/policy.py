"""A wave rollout's policy (``registry.releases.waves``): its waves and the bounds of its
gates, stored with the rollout (JSON), defaults from ``RegistrySettings``."""

from __future__ import annotations

import math
import re

import msgspec

from registry.errors import RegistryError

SHARE = re.compile(r"(\d+(?:\.\d+)?)%")
MAX_WAVES = 20
SHARE = re.compile(r"(\d+(?:\.\d+)?)%")


class WavePolicy(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """How one rollout proceeds; stored with it (JSON), defaults from ``RegistrySettings``."""

    waves: tuple[float, ...]  # cumulative shares of the edges, ascending, the last 1.0
    pace: float = 0.0  # nodes admitted per minute in the first wave (0: the wave at once)
    growth: float = 2.0  # the pace is multiplied by this for every following wave
    bake_s: float = 300.0  # after a wave installed, before its gate
    install_timeout_s: float = 900.0  # a wave node that has not answered by then has failed
    max_failures: float = 0.1  # share of a wave's nodes that failed or refused to install
    max_agreement_drop: float = 0.02  # live audit agreement below the previous version's
    min_audit_rows: int = 200  # audited rows on each side before agreement is judged
    min_audit_nodes: int = 3  # ... from at least this many distinct nodes
    max_drift_share: float = 0.25  # more of the wave's nodes in drift than of the others'
    max_p99_ratio: float = 2.0  # median p99 against the previous version's

    def check(self) -> WavePolicy:
        """This policy, or a RegistryError saying what is wrong with it."""
        shares = self.waves
        if not 1 <= len(shares) <= MAX_WAVES:
            raise RegistryError(f"a rollout has 1 to {MAX_WAVES} waves, not {len(shares)}")
        if any(not 0 < s <= 1 for s in shares) or list(shares) != sorted(set(shares)):
            raise RegistryError("wave shares must grow, each above 0% and at most 100%")
        if shares[-1] != 1.0:
            raise RegistryError("the last wave must be 100% (every edge)")
        for name, value, low, high in (
                ("pace", self.pace, 0, 1e9), ("growth", self.growth, 1, 1000),
                ("bake_s", self.bake_s, 0, 7 * 86400),
                ("install_timeout_s", self.install_timeout_s, 1, 7 * 86400),
                ("max_failures", self.max_failures, 0, 1),
                ("max_agreement_drop", self.max_agreement_drop, 0, 1),
                ("min_audit_rows", self.min_audit_rows, 1, 10**9),
                ("min_audit_nodes", self.min_audit_nodes, 1, 1000),
                ("max_drift_share", self.max_drift_share, 0, 1),
                ("max_p99_ratio", self.max_p99_ratio, 1, 1000)):
            if not (math.isfinite(value) and low <= value <= high):
                raise RegistryError(f"rollout {name} must be within [{low}, {high}], "
                                    f"not {value!r}")
        return self

    def rate(self, wave: int) -> float:
        """Nodes per minute admitted in ``wave`` (0: all at once)."""
        return self.pace * self.growth ** wave


def parse_waves(text: str) -> tuple[float, ...]:
    """``"1%,10%,50%,100%"`` -> (0.01, 0.1, 0.5, 1.0)."""
    shares = []
    for part in (p.strip() for p in text.split(",")):
        match = SHARE.fullmatch(part)
        if match is None:
            raise RegistryError(f"invalid wave {part!r}: give percentages of the edges, e.g. "
                                f"--waves 1%,10%,50%,100%")
        shares.append(float(match[1]) / 100)
    return tuple(shares)


