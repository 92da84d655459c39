"""The node's quality reports, sent up the sync stream every interval the registry asked for:
per served version, what the quality window saw, with the fidelity measured at activation."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from serving.runtime.repository import Repository
from serving.telemetry.quality import QualityWindow
from sync.gen import sync_pb2 as pb


async def send_reports(repository: Repository, quality: QualityWindow,
                       send: Callable[[pb.NodeMessage], Awaitable[None]],
                       interval: float) -> None:
    """Until cancelled: every ``interval`` seconds, drain ``quality`` for what is served."""
    while True:
        await asyncio.sleep(interval)
        served = [(m, v) for m in repository.models()
                  if (v := repository.default_version(m)) is not None]
        for report in quality.drain(served):
            message = report_message(report)
            measured = repository.fidelity(message.model, message.version)
            message.fidelity = measured.agreement if measured else 0.0
            await send(pb.NodeMessage(report=message))


def report_message(report: dict[str, object]) -> pb.QualityReport:
    message = pb.QualityReport()
    for key, value in report.items():
        if key in ("confidence", "tokens"):
            getattr(message, key).extend(pb.Bucket(**b) for b in value)  # type: ignore[attr-defined]
        else:
            setattr(message, key, value)
    return message
