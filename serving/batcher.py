"""Adaptive batching: a queue plus one future per request, bounded by size and delay.

Requests (each one or more token rows) wait at most ``max_delay`` for company; a batch closes
when it holds ``max_batch_size`` rows, when the oldest request has waited long enough, or when
it holds as many requests as the previous batch and no more are queued: at low load a lone
request runs at once. Rows are
padded to the longest row of the batch and run in a worker thread, off the event loop. If a
batch fails, every request in it gets the error.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from serving import tracing
from serving.errors import NotReady, Overloaded
from serving.text import Encoded, pad

Predict = Callable[[Encoded], np.ndarray]


@dataclass(frozen=True)
class BatchStats:
    rows: int
    requests: int
    queue_seconds: float  # of the oldest request
    compute_seconds: float


Observer = Callable[[BatchStats], None]


@dataclass
class _Pending:
    rows: list[np.ndarray]
    future: asyncio.Future[np.ndarray]
    enqueued: float = field(default_factory=time.perf_counter)
    computed: tuple[float, float, int] | None = None  # its batch's start, end and rows


class Batcher:
    def __init__(self, predict: Predict, *, max_batch_size: int, max_delay_ms: float,
                 max_queue_rows: int, observe: Observer | None = None,
                 executor: ThreadPoolExecutor | None = None) -> None:
        self.predict = predict
        self.max_batch_size = max(1, max_batch_size)
        self.max_delay = max_delay_ms / 1000
        self.max_queue_rows = max_queue_rows
        self.observe = observe
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue()
        self._arrived = asyncio.Event()
        self._queued_rows = 0
        self._executor = executor or ThreadPoolExecutor(1, thread_name_prefix="batcher")
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._expected = self.max_batch_size  # requests in the last batch (none yet: wait)
        self._taken: list[_Pending] = []  # the batch off the queue: collecting or computing

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self, grace: float = 10.0) -> None:
        """Finish what is queued (up to ``grace`` seconds), then stop the worker."""
        self._closed = True
        deadline = time.monotonic() + grace
        while self._queued_rows and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        while not self._queue.empty():
            pending = self._queue.get_nowait()
            if not pending.future.done():
                pending.future.set_exception(NotReady("server shutting down"))
        self._executor.shutdown(wait=False)

    async def submit(self, rows: list[np.ndarray]) -> np.ndarray:
        """Logits for ``rows``, in order; raises ``Overloaded`` when the queue is past bound."""
        if self._closed:
            raise NotReady("this model version is being unloaded; retry")
        if self._queued_rows + len(rows) > self.max_queue_rows:
            raise Overloaded(f"queue holds {self._queued_rows} rows (bound "
                             f"{self.max_queue_rows}); retry shortly")
        pending = _Pending(rows, asyncio.get_running_loop().create_future())
        self._queued_rows += len(rows)
        self._queue.put_nowait(pending)
        self._arrived.set()
        try:
            return await pending.future
        finally:
            if pending.computed is not None and tracing.active():
                started, ended, batch_rows = pending.computed
                tracing.record("batch queue", pending.enqueued, started,
                               **{"tiered.rows": len(rows)})
                tracing.record("model compute", started, ended, **{
                    "tiered.rows": len(rows), "tiered.batch_rows": batch_rows})

    async def _collect(self) -> list[_Pending]:
        self._taken = batch = [await self._queue.get()]
        size = len(batch[0].rows)
        # Wait for company only until the batch holds as many requests as the last one did:
        # a lone request at low load runs at once, and eight clients in lock-step do not
        # wait the full delay for a ninth that never comes. Requests that arrived while the
        # previous batch computed are taken without waiting, so batches still grow with load.
        deadline = batch[0].enqueued + self.max_delay
        while size < self.max_batch_size:
            if self._queue.empty() and len(batch) >= self._expected:
                break
            if self._queue.empty():
                # waiting on an event, not on queue.get(): a timed-out get could drop an item
                self._arrived.clear()
                remaining = deadline - time.perf_counter()
                if remaining <= 0:
                    break
                try:
                    await asyncio.wait_for(self._arrived.wait(), remaining)
                except TimeoutError:
                    break
                continue
            nxt = self._queue.get_nowait()
            if size + len(nxt.rows) > self.max_batch_size:
                self._requeue_front(nxt)  # does not fit: it opens the next batch instead
                break
            batch.append(nxt)
            size += len(nxt.rows)
        return batch

    def _requeue_front(self, pending: _Pending) -> None:
        items = [pending]
        while not self._queue.empty():
            items.append(self._queue.get_nowait())
        for item in items:
            self._queue.put_nowait(item)

    async def _run(self) -> None:
        try:
            while True:
                await self._run_one(await self._collect())
        except asyncio.CancelledError:
            # stop() ran out of grace: the batch taken off the queue (collecting or computing)
            # is answered too, not left hanging until its clients time out
            for p in self._taken:
                if not p.future.done():
                    p.future.set_exception(NotReady("server shutting down"))
            raise

    async def _run_one(self, batch: list[_Pending]) -> None:
        self._expected = len(batch)
        rows = [r for p in batch for r in p.rows]
        timing: list[float] = []
        try:
            logits = await asyncio.get_running_loop().run_in_executor(
                self._executor, self._timed, pad(rows), timing)
        except Exception as exc:  # every waiter learns why its batch failed
            self._stamp(batch, timing, len(rows))
            for p in batch:
                if not p.future.done():
                    p.future.set_exception(exc)
        else:
            self._stamp(batch, timing, len(rows))
            offset = 0
            for p in batch:
                if not p.future.done():
                    p.future.set_result(logits[offset:offset + len(p.rows)])
                offset += len(p.rows)
        finally:
            self._queued_rows -= len(rows)
        if self.observe and timing:
            started, seconds = timing
            self.observe(BatchStats(len(rows), len(batch), started - batch[0].enqueued,
                                    seconds))

    @staticmethod
    def _stamp(batch: list[_Pending], timing: list[float], rows: int) -> None:
        if timing:
            started, seconds = timing
            for p in batch:
                p.computed = (started, started + seconds, rows)

    def _timed(self, batch: Encoded, timing: list[float]) -> np.ndarray:
        """Runs in the worker thread, so compute time excludes the hand-back to the loop."""
        started = time.perf_counter()
        try:
            return self.predict(batch)
        finally:
            timing.extend((started, time.perf_counter() - started))
