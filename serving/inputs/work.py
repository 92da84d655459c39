"""The parse job a worker thread is running (``serving.runtime.parsing``): its deadline, and
whether its client still waits. A request of several images checks it between them, so a
request past its deadline or whose client went decodes no further image."""

from __future__ import annotations

import time
from contextvars import ContextVar
from dataclasses import dataclass, field

from serving.errors import ClientGone, ParseDeadline


@dataclass
class Job:
    """One request's parsing. ``deadline``: ``time.monotonic()`` it must end by."""

    deadline: float
    seconds: float  # the deadline's length, for the message
    gone: bool = False  # set from the event loop when the client went away
    thread: int | None = None  # the worker thread running it
    cpu_started: float = 0.0  # that thread's CPU clock when it started
    cpu_s: float | None = field(default=None)  # CPU seconds spent, once done

    def check(self, row: int) -> None:
        """:class:`ClientGone` or :class:`ParseDeadline` when the job should stop before
        ``row``."""
        if self.gone:
            raise ClientGone(f"the client went away; not decoding row {row} and on")
        if time.monotonic() > self.deadline:
            raise ParseDeadline(f"parsing the request took more than {self.seconds:g} s "
                                f"(parse_deadline_s); rows {row} and on were not decoded")

    def started(self, thread: int) -> None:
        self.thread, self.cpu_started = thread, time.thread_time()

    def finished(self) -> None:
        self.cpu_s = time.thread_time() - self.cpu_started

    def cpu(self) -> float:
        """CPU seconds the job has spent so far (read from another thread while it runs)."""
        if self.cpu_s is not None or self.thread is None:
            return self.cpu_s or 0.0
        try:
            clock = time.pthread_getcpuclockid(self.thread)
            return time.clock_gettime(clock) - self.cpu_started
        except (OSError, ProcessLookupError):  # the thread just ended
            return self.cpu_s or 0.0


current: ContextVar[Job | None] = ContextVar("parse_job", default=None)


def check(row: int) -> None:
    """Stop before ``row`` when the running job (if any) should (:meth:`Job.check`)."""
    job = current.get()
    if job is not None:
        job.check(row)
