"""Where requests are parsed off the event loop: a thread pool of its own, bounded.

Parsing an image request is decoding it: CPU, in C (Pillow releases the GIL). In the default
executor it had no bound, no deadline and no way to stop: six hostile images kept a node busy
for minutes after their clients left. Here ``threads`` parse, ``queue`` more requests may
wait, and a request beyond that is answered 503 with Retry-After at once (:class:`ParseBusy`).
A request is given ``deadline_s`` from its arrival: waited for no longer (503,
:class:`ParseDeadline`), and its job (``serving.inputs.work``) stops before its next image. A
request whose client goes away (``gone`` completes) is not started if still queued, and
stops before its next image if running.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from serving.errors import ClientGone, ParseBusy, ParseDeadline
from serving.inputs import work

T = TypeVar("T")
Gone = Callable[[], Awaitable[object]]  # completes when the client has gone away


class ParsePool:
    def __init__(self, threads: int, queue: int, deadline_s: float) -> None:
        self.threads, self.queue, self.deadline_s = threads, queue, deadline_s
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="parse")
        self.held = 0  # jobs queued or running (a job abandoned still runs to its next check)

    def job(self) -> work.Job:
        """A job whose deadline starts now."""
        return work.Job(time.monotonic() + self.deadline_s, self.deadline_s)

    async def run(self, job: work.Job, fn: Callable[[], T], gone: Gone | None = None) -> T:
        """``fn()`` in a parse thread as ``job``."""
        if self.held >= self.threads + self.queue:
            raise ParseBusy(f"{self.threads} parse threads busy and {self.queue} requests "
                            f"waiting (parse_queue); retry shortly")
        self.held += 1
        context = contextvars.copy_context()  # the request id, for the logs
        future = asyncio.wrap_future(self._executor.submit(context.run, _work, job, fn))
        future.add_done_callback(self._release)
        watch = asyncio.ensure_future(gone()) if gone is not None else None
        waited: set[asyncio.Future[Any]] = {future} if watch is None else {future, watch}
        try:
            remaining = max(0.0, job.deadline - time.monotonic())
            done, _ = await asyncio.wait(waited, timeout=remaining,
                                         return_when=asyncio.FIRST_COMPLETED)
            if future in done:
                return future.result()
            job.gone = watch is not None and watch in done
            if job.gone:
                raise ClientGone("the client went away before its request was parsed")
            job.deadline = 0.0  # the job stops at its next check
            raise ParseDeadline(f"parsing the request took more than {self.deadline_s:g} s "
                                f"(parse_deadline_s)")
        except asyncio.CancelledError:  # e.g. a gRPC call the client cancelled
            job.gone = True
            raise
        finally:
            if watch is not None:
                watch.cancel()

    def _release(self, future: asyncio.Future[Any]) -> None:
        self.held -= 1
        if not future.cancelled():
            future.exception()  # an abandoned job's error is retrieved: nobody else will

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def _work(job: work.Job, fn: Callable[[], T]) -> T:
    """``fn()`` as ``job``, unless it should not start (its client gone, its deadline past)."""
    job.started(threading.get_ident())
    token = work.current.set(job)
    try:
        job.check(0)
        return fn()
    finally:
        job.finished()
        work.current.reset(token)
