"""The window a report covers: ``[end - since, end]``, clipped to the data Prometheus has (a
stack started a week ago has a week of data in a 30-day window)."""

from __future__ import annotations

from dataclasses import dataclass

from tiered.report.query import Prometheus, PrometheusError, promql_duration

# what the report counts: every scraped node of the three tiers
UP = 'up{job=~"edge|center|registry"}'


@dataclass(frozen=True)
class Window:
    since: str  # as asked, e.g. "30d"
    start: float  # Unix seconds
    end: float
    first_sample: float  # the first scrape in the window

    @property
    def seconds(self) -> float:
        return self.end - self.start

    @property
    def covered(self) -> float:
        """Seconds of the window that Prometheus has data for."""
        return self.end - max(self.start, self.first_sample)

    @property
    def range(self) -> str:
        """The window as a PromQL range, ``[...]`` left out."""
        return promql_duration(self.seconds)


def window(prom: Prometheus, since: str, seconds: float, end: float) -> Window:
    """The window of ``seconds`` ending at ``end``, with the time of its first scrape (found by
    bisection to the millisecond: PromQL has no first-sample function)."""
    start_ms, end_ms = round((end - seconds) * 1000), round(end * 1000)
    if not has_data(prom, start_ms - 1, end_ms):
        raise PrometheusError(f"Prometheus at {prom.url} has no scrape of the tiers "
                              f"({UP}) in the last {since}: nothing to report")
    lo, hi = start_ms - 1, end_ms  # none in [start - 1ms, lo]; some in [start - 1ms, hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if has_data(prom, start_ms - 1, mid):
            hi = mid
        else:
            lo = mid
    return Window(since, end - seconds, end, hi / 1000)


def has_data(prom: Prometheus, from_ms: int, to_ms: int) -> bool:
    """Whether some tier was scraped in ``[from_ms, to_ms]``."""
    query = f"count(count_over_time({UP}[{to_ms - from_ms}ms]))"
    return bool(prom.instant(query, to_ms / 1000))
