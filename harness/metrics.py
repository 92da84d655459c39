"""A node's Prometheus page read back: every sample as (name, labels, value), or one metric's
sum over its label sets."""

from __future__ import annotations

import re
import ssl

import httpx

SAMPLE = re.compile(r"^(\w+)(?:\{(.*)\})?\s+(\S+)$")


def samples(url: str, verify: ssl.SSLContext | bool = True) -> list[tuple[str, str, float]]:
    """(name, labels, value) of every sample a /metrics page shows (``verify``: the CA
    context for a node serving HTTPS with its own certificate)."""
    found = []
    for line in httpx.get(url, timeout=10, verify=verify).text.splitlines():
        if (match := SAMPLE.match(line)) is not None:
            found.append((match[1], match[2] or "", float(match[3])))
    return found


def metric(url: str, name: str, verify: ssl.SSLContext | bool = True) -> float:
    return sum(value for n, _, value in samples(url, verify) if n == name)
