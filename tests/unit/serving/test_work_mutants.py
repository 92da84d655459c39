"""The parse job a worker thread runs (``serving.inputs.work``) as an operator sees it: a
request at its deadline exactly is still decoded and one past it is not, and the CPU seconds
the refusal and slow-request lines report are the job's own, not its pooled thread's earlier
work. The tests that kill `make mutate`'s mutants the older tests let through."""

from __future__ import annotations

import threading
import time

import pytest

from serving.errors import ParseDeadline
from serving.inputs import work


def test_a_job_at_its_deadline_exactly_decodes_on_and_one_past_it_stops(
        monkeypatch: pytest.MonkeyPatch) -> None:
    job = work.Job(deadline=100.0, seconds=2.5)
    monkeypatch.setattr(time, "monotonic", lambda: 100.0)
    job.check(3)  # at the deadline: the row is decoded
    monkeypatch.setattr(time, "monotonic", lambda: 100.001)
    with pytest.raises(ParseDeadline) as late:
        job.check(3)
    assert str(late.value) == ("parsing the request took more than 2.5 s (parse_deadline_s); "
                               "rows 3 and on were not decoded")


def burn(seconds: float) -> None:
    started = time.thread_time()
    while time.thread_time() - started < seconds:
        pass


def test_a_jobs_cpu_seconds_are_its_own_not_its_pooled_threads_earlier_work() -> None:
    job = work.Job(deadline=float("inf"), seconds=5)
    assert job.cpu() == 0.0  # queued, not started: nothing spent yet
    seen: dict[str, float] = {}

    def worker() -> None:
        burn(0.3)  # an earlier request's parse on the same pooled thread
        job.started(threading.get_ident())
        burn(0.05)
        seen["running"] = job.cpu()
        job.finished()

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert 0.04 <= seen["running"] < 0.2, seen
    assert job.cpu_s is not None and 0.04 <= job.cpu_s < 0.2, job.cpu_s
    assert job.cpu() == job.cpu_s  # once finished, read back as it was
