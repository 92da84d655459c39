"""Stopping background tasks: ``await stop(task, ...)`` cancels them and waits until each ended.

The cancellation ``stop`` asks for is no error, so the ``CancelledError`` a stopped task ends with
is not raised. A cancellation of the caller itself (its process shutting down while it waits)
is: ``stop`` raises ``CancelledError`` then, as any await does, where
``with contextlib.suppress(asyncio.CancelledError): await task`` would swallow it and go on. An
exception a task ended with on its own is raised, as awaiting it would raise it, once every task
has ended (the first; the others are logged).

Standard library only, at the bottom of ``serving/``: every package may use it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger(__name__)


async def stop(*tasks: asyncio.Future[Any] | None) -> None:
    """Cancel every task given (None and finished ones are fine), wait until all ended."""
    live = list(dict.fromkeys(task for task in tasks if task is not None))  # in order, once
    for task in live:
        task.cancel()
    if not live:
        return
    # unlike ``await task``, ``asyncio.wait`` raises nothing a task ended with, and a cancelled
    # caller gets its CancelledError (the tasks are cancelled already and end on their own)
    await asyncio.wait(live)
    failed = [error for task in live if not task.cancelled()
              and (error := task.exception()) is not None]
    for error in failed[1:]:
        log.error("a stopped task had failed too", exc_info=error)
    if failed:
        raise failed[0]
