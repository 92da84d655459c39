"""The variables a supervisor (``--workers N``, ``serving/transport/workers.py``) sets for the
worker processes it starts, read here and nowhere else.

Outside the settings classes, this module and OpenTelemetry's ``OTEL_*`` (read by
``serving/telemetry/tracing.py`` and the SDK) are the only places the serving code reads the
environment; ``tests/unit/test_layers.py`` checks it."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

WORKER = "TIERED_WORKER"  # this process's index among the workers (unset: no workers)
METRICS = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client's multiprocess folder
CHANNEL = "TIERED_CHANNEL"  # the worker's end of its pair, as an inherited descriptor number


def _number(name: str, env: Mapping[str, str]) -> int | None:
    value = env.get(name, "")
    return int(value) if value.isdigit() else None


def worker_index(env: Mapping[str, str] = os.environ) -> int | None:
    """This process's worker index; None when it is not one of several workers."""
    return _number(WORKER, env)


def metrics_folder(env: Mapping[str, str] = os.environ) -> Path | None:
    """prometheus_client's multiprocess folder, when the process writes its metrics there."""
    value = env.get(METRICS, "")
    return Path(value) if value else None


def shared_folder(env: Mapping[str, str] = os.environ) -> Path | None:
    """The supervisor's private folder the workers share (metrics, quality windows)."""
    return metrics_folder(env) if worker_index(env) is not None else None


def channel_fd(env: Mapping[str, str] = os.environ) -> int | None:
    """The descriptor of this worker's end of its hand-off pair; None when no acceptor hands
    it connections."""
    return _number(CHANNEL, env)


def for_worker(index: int, folder: Path, channel: int) -> dict[str, str]:
    """What the supervisor adds to a worker's environment."""
    return {WORKER: str(index), METRICS: str(folder), CHANNEL: str(channel)}
