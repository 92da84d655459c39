from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from serving.errors import NotReady, Overloaded
from serving.inputs.base import Feeds
from serving.runtime.batcher import Batcher, BatchStats, plan
from tests.codecs import TOKEN_BATCHING


def rows(*lengths: int) -> list[np.ndarray]:
    return [np.arange(1, n + 1, dtype=np.int64) for n in lengths]


class Recorder:
    """A fake model: logits row i = [sum of ids, number of tokens]; records batch shapes."""

    def __init__(self, fail: bool = False) -> None:
        self.shapes: list[tuple[int, int]] = []
        self.threads: set[str] = set()
        self.fail = fail

    def __call__(self, batch: Feeds) -> np.ndarray:
        self.shapes.append(batch["input_ids"].shape)
        self.threads.add(threading.current_thread().name)
        if self.fail:
            raise RuntimeError("model exploded")
        return np.stack([(batch["input_ids"] * batch["attention_mask"]).sum(1),
                         batch["attention_mask"].sum(1)], axis=1).astype(np.float32)


def run(coro: object) -> object:
    return asyncio.run(coro)  # type: ignore[arg-type]


def test_concurrent_requests_share_a_padded_batch_and_get_their_own_rows() -> None:
    model, stats = Recorder(), []

    async def main() -> list[np.ndarray]:
        batcher = Batcher(model, *TOKEN_BATCHING,
                          max_batch_size=8, max_delay_ms=50, max_queue_rows=100,
                          observe=stats.append)
        batcher.start()
        results = await asyncio.gather(batcher.submit(rows(3)), batcher.submit(rows(5, 2)),
                                       batcher.submit(rows(1)))
        await batcher.stop()
        return results

    a, b, c = run(main())  # type: ignore[misc]
    assert model.shapes == [(4, 5)]  # one batch, padded to the longest row
    assert a.tolist() == [[6, 3]] and b.tolist() == [[15, 5], [3, 2]] and c.tolist() == [[1, 1]]
    # close lengths: one call (a split would cost more than the 12 padded positions it saves)
    assert stats == [BatchStats(4, 3, stats[0].queue_seconds, stats[0].compute_seconds,
                                calls=1, tokens=11, padded_tokens=20)]
    assert "MainThread" not in model.threads  # inference runs off the event loop


def test_batches_never_exceed_max_size() -> None:
    model = Recorder()

    async def main() -> None:
        batcher = Batcher(model, *TOKEN_BATCHING,
                          max_batch_size=4, max_delay_ms=20, max_queue_rows=100)
        batcher.start()
        await asyncio.gather(*(batcher.submit(rows(2, 2, 2)) for _ in range(4)))
        await batcher.stop()

    run(main())
    assert sorted(s[0] for s in model.shapes) == [3, 3, 3, 3]  # 3-row requests never split


def test_zero_delay_and_size_one_means_no_batching() -> None:
    model = Recorder()

    async def main() -> None:
        batcher = Batcher(model, *TOKEN_BATCHING,
                          max_batch_size=1, max_delay_ms=0, max_queue_rows=100)
        batcher.start()
        await asyncio.gather(*(batcher.submit(rows(2)) for _ in range(5)))
        await batcher.stop()

    run(main())
    assert model.shapes == [(1, 2)] * 5


def test_a_failed_batch_fails_every_waiter() -> None:
    async def main() -> list[object]:
        batcher = Batcher(Recorder(fail=True), *TOKEN_BATCHING, max_batch_size=8, max_delay_ms=30,
                          max_queue_rows=100)
        batcher.start()
        results = await asyncio.gather(batcher.submit(rows(1)), batcher.submit(rows(2)),
                                       return_exceptions=True)
        await batcher.stop()
        return results

    results = run(main())
    assert [str(r) for r in results] == ["model exploded", "model exploded"]  # type: ignore[attr-defined]


def test_queue_bound_answers_overloaded_at_once_and_stop_refuses_new_work() -> None:
    async def main() -> None:
        batcher = Batcher(Recorder(), *TOKEN_BATCHING,
                          max_batch_size=8, max_delay_ms=200, max_queue_rows=2)
        batcher.start()
        first = asyncio.ensure_future(batcher.submit(rows(1, 1)))
        await asyncio.sleep(0)
        with pytest.raises(Overloaded) as exc:
            await batcher.submit(rows(1))
        assert exc.value.headers == {"Retry-After": "1"}
        assert (await first).shape == (2, 2)
        await batcher.stop()
        with pytest.raises(NotReady):
            await batcher.submit(rows(1))

    run(main())


LONG_DELAY_MS = 600_000  # ten minutes: a request that waits for company times the test out


def test_a_full_batch_and_then_a_lone_request_do_not_wait_for_the_delay() -> None:
    """Timed against a ten-minute delay, not against the machine's speed: a request that
    waited for company would hit the one-minute timeout."""
    model = Recorder()

    async def main() -> None:
        batcher = Batcher(model, *TOKEN_BATCHING, max_batch_size=4, max_delay_ms=LONG_DELAY_MS,
                          max_queue_rows=100)
        batcher.start()
        full = await asyncio.wait_for(batcher.submit(rows(1, 1, 1, 1)), 60)  # closes at size
        assert full.shape == (4, 2)
        for _ in range(3):  # at low load each lone request runs at once
            lone = await asyncio.wait_for(batcher.submit(rows(2)), 60)
            assert lone.tolist() == [[3, 2]]
        await batcher.stop()

    run(main())
    assert model.shapes == [(4, 1), (1, 2), (1, 2), (1, 2)]


class Gated(Recorder):
    """A model that answers only once the test opens its gate (a batch in progress)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.entered = threading.Event()

    def __call__(self, batch: Feeds) -> np.ndarray:
        self.entered.set()
        assert self.gate.wait(60), "the test never opened the gate"
        return super().__call__(batch)


def test_stop_drains_every_queued_request_with_its_real_answer() -> None:
    """``stop()`` (a version being unloaded, or shutdown) answers what is queued first: a
    batch in progress and the requests behind it get their results, not errors."""
    model = Gated()

    async def main() -> None:
        batcher = Batcher(model, *TOKEN_BATCHING,
                          max_batch_size=1, max_delay_ms=0, max_queue_rows=100)
        batcher.start()
        loop = asyncio.get_running_loop()
        requests = [asyncio.ensure_future(batcher.submit(rows(n))) for n in (1, 2, 3, 4)]
        await loop.run_in_executor(None, model.entered.wait, 60)  # the first batch computes
        stopping = asyncio.ensure_future(batcher.stop())
        await asyncio.sleep(0.05)
        assert not stopping.done()  # still draining: the model has not answered yet
        with pytest.raises(NotReady):  # no new work meanwhile
            await batcher.submit(rows(1))
        model.gate.set()
        await asyncio.wait_for(stopping, 60)
        assert all(r.done() for r in requests), "stop() returned with requests unanswered"
        answers = [r.result() for r in requests]  # raises if one got an error instead
        assert [a.tolist() for a in answers] == [[[1, 1]], [[3, 2]], [[6, 3]], [[10, 4]]]

    run(main())
    assert model.shapes == [(1, 1), (1, 2), (1, 3), (1, 4)]


def test_stop_past_its_grace_answers_the_batch_in_flight_instead_of_leaving_it_hanging() -> None:
    model = Gated()

    async def main() -> None:
        batcher = Batcher(model, *TOKEN_BATCHING,
                          max_batch_size=1, max_delay_ms=0, max_queue_rows=100)
        batcher.start()
        loop = asyncio.get_running_loop()
        requests = [asyncio.ensure_future(batcher.submit(rows(n))) for n in (1, 2)]
        await loop.run_in_executor(None, model.entered.wait, 60)  # the first batch computes
        await batcher.stop(grace=0.05)  # the model never answers within the grace
        for request in requests:
            with pytest.raises(NotReady):
                await asyncio.wait_for(request, 5)  # answered, not left waiting
        model.gate.set()

    run(main())


# --- length-aware batching ---------------------------------------------------------------------

def cost(lengths: list[int], groups: list[list[int]], call_tokens: int) -> int:
    return sum(call_tokens + len(g) * max(lengths[i] for i in g) for g in groups)


def brute_force(lengths: list[int], call_tokens: int) -> int:
    """The cheapest cut of the sorted rows into consecutive groups, by trying every cut."""
    ordered = sorted(lengths)
    best = None
    for mask in range(1 << max(0, len(ordered) - 1)):
        total, start = 0, 0
        for k in range(1, len(ordered) + 1):
            if k == len(ordered) or mask >> (k - 1) & 1:
                total += call_tokens + (k - start) * ordered[k - 1]
                start = k
        best = total if best is None else min(best, total)
    return best or 0


@pytest.mark.parametrize("seed", range(40))
def test_plan_is_the_cheapest_cut_and_covers_every_row_once(seed: int) -> None:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 130, size=int(rng.integers(1, 11))).tolist()
    call_tokens = int(rng.choice([0, 8, 32, 200]))
    groups = plan(lengths, call_tokens)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    flat = [lengths[i] for g in groups for i in g]
    assert flat == sorted(flat)  # shortest group first, each sorted
    assert cost(lengths, groups, call_tokens) == brute_force(lengths, call_tokens)


def test_plan_splits_a_skewed_batch_and_keeps_an_even_one_whole() -> None:
    skewed = [12, 120, 10, 11, 118, 9, 10, 125]
    assert plan(skewed, 32) == [[5, 2, 6, 3, 0], [4, 1, 7]]
    assert plan([20] * 16, 32) == [list(range(16))]
    assert plan(skewed, 10 ** 9) == [[5, 2, 6, 3, 0, 4, 1, 7]]  # huge call cost: one call
    assert [len(g) for g in plan(skewed, 0)] == [1, 2, 1, 1, 1, 1, 1]  # one per length
    assert plan([], 32) == []


def test_plan_stays_fast_and_complete_for_thousands_of_distinct_lengths() -> None:
    lengths = list(range(1, 3001)) * 2
    groups = plan(lengths, 32)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))


def test_mixed_lengths_are_split_into_calls_and_every_request_gets_its_rows_in_order() -> None:
    model, stats = Recorder(), []

    async def main() -> list[np.ndarray]:
        batcher = Batcher(model, *TOKEN_BATCHING,
                          max_batch_size=16, max_delay_ms=200, max_queue_rows=100,
                          observe=stats.append)
        batcher.start()
        results = await asyncio.gather(
            batcher.submit(rows(100, 3)), batcher.submit(rows(4)),
            batcher.submit(rows(2, 90, 5)), batcher.submit(rows(95)))
        await batcher.stop()
        return results

    a, b, c, d = run(main())  # type: ignore[misc]
    assert model.shapes == [(4, 5), (3, 100)]  # short rows first, padded to 5, not to 100
    assert a.tolist() == [[5050, 100], [6, 3]]
    assert b.tolist() == [[10, 4]]
    assert c.tolist() == [[3, 2], [4095, 90], [15, 5]]
    assert d.tolist() == [[4560, 95]]
    assert stats[0].calls == 2 and stats[0].rows == 7
    assert stats[0].tokens == 299 and stats[0].padded_tokens == 4 * 5 + 3 * 100


class GatedLong(Recorder):
    """Answers short groups at once; a group with a long row waits for the test's gate."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()

    def __call__(self, batch: Feeds) -> np.ndarray:
        if batch["input_ids"].shape[1] > 50:
            assert self.gate.wait(60), "the test never opened the gate"
        return super().__call__(batch)


def test_a_short_request_is_answered_before_the_long_group_of_its_batch_computes() -> None:
    model = GatedLong()

    async def main() -> None:
        batcher = Batcher(model, *TOKEN_BATCHING,
                          max_batch_size=16, max_delay_ms=200, max_queue_rows=100)
        batcher.start()
        long = asyncio.ensure_future(batcher.submit(rows(120, 110)))
        short = await asyncio.wait_for(batcher.submit(rows(3)), 60)
        assert short.tolist() == [[6, 3]] and not long.done()
        model.gate.set()
        assert (await asyncio.wait_for(long, 60))[:, 1].tolist() == [120, 110]
        await batcher.stop()

    run(main())
    assert model.shapes == [(1, 3), (2, 120)]
