"""Prometheus's HTTP API (``/api/v1/query``, ``/api/v1/query_range``) and the windows a
report covers (Prometheus durations: ``90m``, ``6h``, ``30d``, ``1d12h``)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import httpx

UNITS = {"y": 365 * 86400, "w": 7 * 86400, "d": 86400, "h": 3600, "m": 60, "s": 1, "ms": 0.001}
# Prometheus's own duration grammar: units largest first, each at most once
DURATION = re.compile(r"(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?"
                      r"(?:(\d+)ms)?")
SHORTEST = 60  # below a minute a window holds too few scrapes to say anything


class PrometheusError(Exception):
    """Prometheus did not answer, or refused a query: the message says which and why."""


def parse_duration(text: str) -> float:
    """Seconds of a Prometheus duration (``90m``, ``30d``, ``1d12h``); ValueError otherwise,
    and for windows shorter than a minute."""
    match = DURATION.fullmatch(text.strip())
    if not text.strip() or not match:
        raise ValueError(f"{text!r} is not a Prometheus duration (e.g. 90m, 6h, 30d, 1d12h)")
    seconds = sum(int(n) * unit for n, unit in zip(match.groups(), UNITS.values(), strict=True)
                  if n)
    if seconds < SHORTEST:
        raise ValueError(f"{text!r} is shorter than a minute: too few scrapes for a report")
    return seconds


def promql_duration(seconds: float) -> str:
    """``seconds`` as a PromQL range (whole milliseconds)."""
    return f"{round(seconds * 1000)}ms"


Vector = list[tuple[dict[str, str], float]]
Matrix = list[tuple[dict[str, str], list[tuple[float, float]]]]


@dataclass
class Prometheus:
    """One Prometheus server's query API, through ``client``."""

    url: str
    client: httpx.Client

    def _get(self, path: str, params: dict[str, Any]) -> Any:
        try:
            answer = self.client.get(f"{self.url.rstrip('/')}{path}", params=params)
        except httpx.HTTPError as exc:
            raise PrometheusError(f"Prometheus at {self.url} is not answering: "
                                  f"{exc or type(exc).__name__}") from exc
        try:
            body = answer.json()
        except ValueError:
            body = {}
        if answer.status_code != 200 or body.get("status") != "success":
            why = body.get("error") or answer.text[:200] or answer.reason_phrase
            raise PrometheusError(f"Prometheus at {self.url} refused {params.get('query')!r} "
                                  f"({answer.status_code}): {why}")
        return body["data"]

    def instant(self, query: str, at: float) -> Vector:
        """The query's vector at time ``at`` (a scalar comes back as one unlabelled entry)."""
        data = self._get("/api/v1/query", {"query": query, "time": f"{at:.3f}"})
        if data["resultType"] == "scalar":
            return [({}, float(data["result"][1]))]
        return [(r["metric"], float(r["value"][1])) for r in data["result"]]

    def value(self, query: str, at: float) -> float | None:
        """The one value of a query that aggregates to a single series; None when it has no
        data or is not a number (NaN, ±Inf: a ratio of nothing to nothing)."""
        found = self.instant(query, at)
        return finite(found[0][1]) if found else None

    def range(self, query: str, start: float, end: float, step: float) -> Matrix:
        data = self._get("/api/v1/query_range", {"query": query, "start": f"{start:.3f}",
                                                 "end": f"{end:.3f}", "step": f"{step:.3f}"})
        return [(r["metric"], [(float(t), float(v)) for t, v in r["values"]])
                for r in data["result"]]


def finite(value: float) -> float | None:
    return value if math.isfinite(value) else None
