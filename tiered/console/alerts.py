"""Alerts firing, for the console: from Alertmanager (``/api/v2/alerts``: active, neither
silenced nor inhibited) when one is given, else from Prometheus (``/api/v1/alerts``, state
firing). Neither given, or neither answering within ``TIMEOUT_S``: the page says so and is
served all the same."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx

TIMEOUT_S = 1.5
SHOWN = 100  # alerts listed at most (the count says how many fire)


@dataclass(frozen=True)
class Firing:
    source: str | None  # "Alertmanager" or "Prometheus"; None: none configured
    alerts: list[dict[str, Any]] = field(default_factory=list)
    count: int = 0
    error: str | None = None  # why none could be read


async def firing(client: httpx.AsyncClient, alertmanager: str | None,
                 prometheus: str | None) -> Firing:
    if alertmanager:
        return await _read(client, "Alertmanager", f"{alertmanager.rstrip('/')}/api/v2/alerts",
                           {"active": "true", "silenced": "false", "inhibited": "false"},
                           _from_alertmanager)
    if prometheus:
        return await _read(client, "Prometheus", f"{prometheus.rstrip('/')}/api/v1/alerts", {},
                           _from_prometheus)
    return Firing(None, error="no Alertmanager or Prometheus given (--alertmanager, "
                              "--prometheus)")


async def _read(client: httpx.AsyncClient, source: str, url: str, params: dict[str, str],
                parse: Any) -> Firing:
    try:
        answer = await client.get(url, params=params, timeout=TIMEOUT_S)
        answer.raise_for_status()
        alerts: list[dict[str, Any]] = parse(answer.json())
    except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return Firing(source, error=f"{source} at {url} did not answer: "
                                    f"{type(exc).__name__}: {str(exc)[:200]}")
    alerts.sort(key=lambda a: (a["severity"] != "page", a["name"], a["since"]))
    return Firing(source, alerts[:SHOWN], len(alerts))


def _alert(labels: dict[str, str], annotations: dict[str, str], since: str) -> dict[str, Any]:
    rest = {k: v for k, v in labels.items() if k not in ("alertname", "severity")}
    return {"name": labels.get("alertname", "?"), "severity": labels.get("severity", ""),
            "labels": ", ".join(f"{k}={v}" for k, v in sorted(rest.items())),
            "summary": annotations.get("summary") or annotations.get("description") or "",
            "runbook": annotations.get("runbook", ""), "since": since}


def _from_alertmanager(body: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [_alert(a["labels"], a.get("annotations") or {}, a.get("startsAt", ""))
            for a in body if (a.get("status") or {}).get("state", "active") == "active"]


def _from_prometheus(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [_alert(a["labels"], a.get("annotations") or {}, a.get("activeAt", ""))
            for a in body["data"]["alerts"] if a.get("state") == "firing"]
