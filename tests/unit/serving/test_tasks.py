from __future__ import annotations

import asyncio
import logging

import pytest

from serving.tasks import stop


async def forever(started: asyncio.Event | None = None) -> None:
    if started is not None:
        started.set()
    await asyncio.Event().wait()


def test_stopping_a_running_task_cancels_it_and_raises_nothing() -> None:
    async def main() -> asyncio.Task[None]:
        task = asyncio.create_task(forever())
        await asyncio.sleep(0)
        await stop(task)
        return task

    assert asyncio.run(main()).cancelled()


def test_several_tasks_none_and_finished_ones_are_fine() -> None:
    async def main() -> list[asyncio.Task[None]]:
        done = asyncio.create_task(asyncio.sleep(0))
        await done
        cancelled = asyncio.create_task(forever())
        cancelled.cancel()
        await asyncio.sleep(0)
        running = [asyncio.create_task(forever()) for _ in range(3)]
        await stop()
        await stop(None)
        await stop(None, done, cancelled, *running, running[0])
        return [done, cancelled, *running]

    done, cancelled, *running = asyncio.run(main())
    assert done.done() and not done.cancelled()
    assert cancelled.cancelled() and all(task.cancelled() for task in running)


def test_a_task_that_ends_on_its_own_cancellation_is_waited_for() -> None:
    cleaned = []

    async def tidy() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0.01)
            cleaned.append(True)

    async def main() -> None:
        task = asyncio.create_task(tidy())
        await asyncio.sleep(0)
        await stop(task)
        assert cleaned == [True]

    asyncio.run(main())


def test_a_caller_cancelled_while_it_waits_still_gets_cancelled_error() -> None:
    async def stubborn(started: asyncio.Event) -> None:  # takes a while to end when cancelled
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0.05)

    async def main() -> list[str]:
        started = asyncio.Event()
        child = asyncio.create_task(stubborn(started))
        await started.wait()
        seen = []

        async def stopper() -> None:
            try:
                await stop(child)
            except asyncio.CancelledError:
                seen.append("cancelled")
                raise
            seen.append("returned")

        caller = asyncio.create_task(stopper())
        await asyncio.sleep(0.01)  # the caller waits on the child now
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        assert caller.cancelled()
        await asyncio.wait([child])
        return seen

    assert asyncio.run(main()) == ["cancelled"]


def test_a_caller_already_cancelled_can_still_stop_its_tasks_in_cleanup() -> None:
    """A stream handler cancelled by its server stops its helper in ``finally`` and goes on."""
    async def main() -> list[str]:
        steps = []

        async def handler(started: asyncio.Event) -> None:
            helper = asyncio.create_task(forever())
            try:
                started.set()
                await asyncio.Event().wait()
            finally:
                await stop(helper)
                steps.append("stopped the helper")
                await asyncio.sleep(0)
                steps.append("closed the session")

        started = asyncio.Event()
        task = asyncio.create_task(handler(started))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return steps

    assert asyncio.run(main()) == ["stopped the helper", "closed the session"]


def test_a_task_that_failed_on_its_own_raises_its_error_after_all_ended(
        caplog: pytest.LogCaptureFixture) -> None:
    async def fail(message: str) -> None:
        raise RuntimeError(message)

    async def main() -> asyncio.Task[None]:
        first, second = asyncio.create_task(fail("first")), asyncio.create_task(fail("second"))
        await asyncio.sleep(0)
        other = asyncio.create_task(forever())
        with pytest.raises(RuntimeError, match="first"):
            await stop(first, other, second)
        return other

    with caplog.at_level(logging.ERROR, logger="serving.tasks"):
        assert asyncio.run(main()).cancelled()
    assert [str(r.exc_info[1]) for r in caplog.records if r.exc_info] == ["second"]
