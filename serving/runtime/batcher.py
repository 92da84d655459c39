"""Adaptive, length-aware batching: a queue plus one future per request, bounded by size and
delay.

Requests (each one or more rows, as the release's input kind made them) wait at most
``max_delay`` for company; a batch closes when it holds ``max_batch_size`` rows, when the
oldest request has waited long enough, or when it holds as many requests as the previous batch
and no more are queued: at low load a lone request runs at once.

A batch is then run in a worker thread, off the event loop, as one or more model calls
(:func:`plan`): its rows sorted by cost (a text row's tokens) and cut into groups of similar
cost, each padded only to its own longest row, so short rows stop paying for a long
batch-mate's padding; rows of equal cost (images, feature rows) make one call. The
shortest group runs first and a request is answered as soon as its last row is computed; every
group of a batch runs before the next batch is taken, so no row waits behind later arrivals.
Each request gets its rows back in its own order. If a call fails, every request of the batch
not yet answered gets the error.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from serving import tasks
from serving.errors import NotReady, Overloaded
from serving.inputs.base import Feeds
from serving.telemetry import tracing
from serving.telemetry.metrics import BatchStats, Observer

Predict = Callable[[Feeds], np.ndarray]
Collate = Callable[[list[np.ndarray]], Feeds]  # rows -> one call's feeds (the input kind's)
Cost = Callable[[np.ndarray], int]  # a row's cost (tokens for text): the plan's length
Finish = Callable[[np.ndarray], np.ndarray]  # a call's outputs -> what the requests get
# What one more model call costs, in padded cost units (a text row's tokens; rows of other kinds
# cost the same as each other, so their batches never split): a batch is split where the padding
# a split saves is worth more than this. Measured with the demo's INT8 edge on a 2-core EPYC
# (batches of 8-32 review texts): 16, 32 and 64 were within noise of each other, 0 (a call per
# distinct length) and 256+ (hardly any split) clearly slower.
CALL_TOKENS = 32
PLAN_EXACT = 512  # distinct lengths up to which the split is exact; beyond, a coarser one


def plan(lengths: Sequence[int], call_tokens: int = CALL_TOKENS) -> list[list[int]]:
    """Row indices grouped into model calls, shortest group first, each group sorted by length.

    Minimises, over every way of cutting the rows sorted by length into consecutive groups,
    ``sum(call_tokens + rows x longest row)``: the token positions computed plus a fixed cost
    per call. An optimal cut only falls between two different lengths, so the search runs over
    the distinct lengths (at most the model's sequence length), not the rows. ``call_tokens``
    0 gives every distinct length its own call; a huge value gives one call, padded to the
    longest row.
    """
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    if not order:
        return []
    # runs of equal length: (length, end position in ``order``)
    runs: list[tuple[int, int]] = []
    for position, index in enumerate(order):
        if runs and runs[-1][0] == lengths[index]:
            runs[-1] = (lengths[index], position + 1)
        else:
            runs.append((lengths[index], position + 1))
    if len(runs) > PLAN_EXACT:  # merge neighbouring runs: exact over PLAN_EXACT buckets
        step = -(-len(runs) // PLAN_EXACT)
        runs = [runs[min(k + step, len(runs)) - 1] for k in range(0, len(runs), step)]
    best = [0.0] * (len(runs) + 1)  # best[j]: cost of the rows of runs[:j]
    cut = [0] * (len(runs) + 1)
    ends = [0] + [end for _, end in runs]
    for j in range(1, len(runs) + 1):
        longest, end = runs[j - 1]
        best[j], cut[j] = min((best[i] + call_tokens + (end - ends[i]) * longest, i)
                              for i in range(j))
    groups, j = [], len(runs)
    while j:
        groups.append(order[ends[cut[j]]:ends[j]])
        j = cut[j]
    return groups[::-1]



@dataclass
class _Pending:
    rows: list[np.ndarray]
    future: asyncio.Future[np.ndarray]
    enqueued: float = field(default_factory=time.perf_counter)
    computed: tuple[float, float, int] | None = None  # its batch's start, its end and rows
    logits: np.ndarray | None = None  # filled in by the worker thread, group by group


class Batcher:
    """One model version's queue and the loop that batches it (the module's docstring says
    how): ``submit`` from the request handlers, ``start``/``stop`` from the repository.

    Why one class: the queue, its row count, the batch being collected and the worker thread's
    progress are one piece of state, read and written from the event loop and the worker
    thread in a fixed order; split in two, each half would reach into the other's fields."""

    def __init__(self, predict: Predict, collate: Collate, cost: Cost, *, max_batch_size: int,
                 max_delay_ms: float, max_queue_rows: int, observe: Observer | None = None,
                 executor: ThreadPoolExecutor | None = None,
                 call_tokens: int = CALL_TOKENS, finish: Finish | None = None) -> None:
        """``collate`` and ``cost``: the release's input kind's (``serving.inputs``);
        ``finish``: applied to each call's outputs in the worker thread (per batch, not per
        request: e.g. softmax and the confidence metrics)."""
        self.predict, self.collate, self.cost = predict, collate, cost
        self.finish = finish
        self.call_tokens = call_tokens
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
        await tasks.stop(self._task)
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
        count = sum(len(p.rows) for p in batch)
        loop = asyncio.get_running_loop()
        work = _Work(batch, loop)
        try:
            await loop.run_in_executor(self._executor, self._compute, work)
        except Exception as exc:  # every waiter not yet answered learns why the batch failed
            for p in batch:
                p.computed = p.computed or work.stamp(count)
                if not p.future.done():
                    p.future.set_exception(exc)
        finally:
            self._queued_rows -= count
        if self.observe and work.started:
            self.observe(BatchStats(count, len(batch), work.started - batch[0].enqueued,
                                    work.ended - work.started, work.calls, work.tokens,
                                    work.padded))

    def _compute(self, work: _Work) -> None:
        """Runs in the worker thread: plan the calls, run them shortest first, and hand each
        request back to the loop as soon as its last row is computed."""
        work.started = time.perf_counter()
        try:
            rows = [r for p in work.batch for r in p.rows]
            owner = [k for k, p in enumerate(work.batch) for _ in p.rows]
            offset = [0] * len(rows)  # each row's position within its request
            start = 0
            for p in work.batch:
                offset[start:start + len(p.rows)] = range(len(p.rows))
                start += len(p.rows)
            costs = [self.cost(r) for r in rows]
            groups = plan(costs, self.call_tokens)
            left = [len(p.rows) for p in work.batch]  # rows still to compute, per request
            for group in groups:
                logits = self.predict(self.collate([rows[i] for i in group]))
                if self.finish is not None:
                    logits = self.finish(logits)
                work.calls += 1
                work.tokens += sum(costs[i] for i in group)
                work.padded += len(group) * max(costs[i] for i in group)
                done = []
                for i, row_logits in zip(group, logits, strict=True):
                    p = work.batch[owner[i]]
                    if p.logits is None:
                        p.logits = np.empty((len(p.rows), *row_logits.shape), row_logits.dtype)
                    p.logits[offset[i]] = row_logits
                    left[owner[i]] -= 1
                    if not left[owner[i]]:
                        done.append(p)
                if done:
                    work.ended = time.perf_counter()
                    try:
                        work.loop.call_soon_threadsafe(self._answer, done,
                                                       work.stamp(len(rows)))
                    except RuntimeError:  # the loop closed (stopped past its grace): no one
                        return  # is waiting for these answers any more
        finally:
            work.ended = time.perf_counter()

    @staticmethod
    def _answer(done: list[_Pending], computed: tuple[float, float, int]) -> None:
        for p in done:
            p.computed = computed
            if not p.future.done() and p.logits is not None:
                p.future.set_result(p.logits)


@dataclass
class _Work:
    """One batch on its way through the worker thread, and what it cost."""

    batch: list[_Pending]
    loop: asyncio.AbstractEventLoop
    started: float = 0.0
    ended: float = 0.0
    calls: int = 0
    tokens: int = 0
    padded: int = 0

    def stamp(self, rows: int) -> tuple[float, float, int]:
        return (self.started, self.ended or time.perf_counter(), rows)
